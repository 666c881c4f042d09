"""foxcute's layers for PyTorch: the layer passes as operators (torch.ops.foxcute.*,
`foxcute.torch.ops`) with autograd, and torch.nn.Modules over them (`foxcute.torch.modules`).

Imported only when used (`import foxcute` loads no torch; install the `torch` extra). On CUDA
tensors the operators run foxcute's CuTe kernels on torch's current stream (capturable in a
CUDA graph, traceable by torch.compile without a graph break); on CPU tensors they compute the
float64 reference and return float32, so the modules run and test without a GPU.
"""

from __future__ import annotations

from . import ops
from .modules import KAN, CuriosityModel, Mamba2Temporal, QDenoise, QuantileLinear, RiskBudgetHead

__all__ = ["ops", "Mamba2Temporal", "QDenoise", "KAN", "CuriosityModel", "RiskBudgetHead", "QuantileLinear"]
