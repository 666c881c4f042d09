"""Plain PyTorch versions of the layers (autograd for backward), for timing the CuTe kernels
against torch eager and torch.compile. torch is imported by each module, never by foxcute."""
