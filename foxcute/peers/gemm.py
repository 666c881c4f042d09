"""D = A @ B_t^T in plain PyTorch (cuBLAS; TF32 when the caller allows it), the torch peer of
foxcute's GEMM at the cases in foxcute.benchmarks.GEMM_CASES."""

from __future__ import annotations


def matmul(A, B_t):
    return A @ B_t.T
