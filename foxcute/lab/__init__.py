"""How foxcute is measured: the harness around the layers, never imported by them.

- benchmarks: the registry of layer passes (inputs, the bytes each must move) and of the
  implementations that run them (cute, naive, peers), the errors against float64, PTX digests.
- timing: CUDA-graph timing with CUDA events, the copy-bandwidth ceiling, memory floors.
- breakdown: the step's per-kernel table (torch.profiler) and the marginal cost of each part.
- peer_precision: the torch peers' math with TF32 operands in NumPy, to take their error apart.
- compare: an A/B of one layer pass between source trees on the GPU.
- sanitize, profile: one pass at a time for compute-sanitizer, ncu and nsys.
- startup: a new process's first step with the compile cache cold and warm.
- torch_ops: the host time of one call of each PyTorch operator (foxcute.torch) beside the
  public function's.
- runner, provenance: the notebooks through papermill into papermill_runs/, with what ran where.

What it may import: the layers (foxcute.<layer>, foxcute.step), foxcute.checks, the kernel
modules (for their compiled_for_ci and contracts), foxcute.peers and foxcute.torch. Nothing outside lab/
imports lab/, except the command line (foxcute.cli).
"""
