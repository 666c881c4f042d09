"""foxcute's GEMM cases (foxcute.lab.benchmarks.GEMM_CASES) in plain PyTorch: cuBLAS, TF32 when
the caller allows it."""

from __future__ import annotations


def matmul(A, B_t):
    """D = A @ B_t^T"""
    return A @ B_t.T


def weight_grad(dY, X):
    """dW = dY^T X"""
    return dY.T @ X
