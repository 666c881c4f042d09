"""Peers the CuTe kernels are timed against: plain PyTorch versions of the layers (autograd
for backward; torch eager and torch.compile), torch imported by each module, never by
foxcute; and `cutlass_gemm`, CUTLASS C++'s Hopper GEMM beside foxcute's own."""
