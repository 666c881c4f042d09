"""The experiment of issue 32: one agent trained by several setups from the same initial
weights and the same data order, and how far their runs drift apart.

A `Setup` names a way to train: the backend (foxcute's kernels or the plain-PyTorch peers), the
precision of foxcute's kernels, whether torch's own matmuls may use TF32, and the number of
micro-batches the batch is split into. `SETUPS`:

- "foxcute": foxcute.torch's modules, kernels in TF32; torch's own ops (embedding, projections,
  the IQN matmuls, the risk head's backward) in full float32, so the TF32 in the run is
  foxcute's.
- "torch_fp32": the peers with TF32 off: the float32 reference run.
- "torch_tf32": the peers with torch's TF32 on (CUDA only; on a CPU TF32 does not exist and
  the run equals torch_fp32).
- "torch_split2": the peers, float32, each batch's gradient accumulated over two halves: the
  same function summed in another order, the PyTorch-internal variation that exists on a CPU.

`drift(run, reference)` measures one run against another: per curve the largest absolute
difference over the run over the reference curve's largest magnitude (so a curve near 0 does
not inflate it), the relative distance of the final parameter vectors, and the difference of
the held-out returns over the reference's mean absolute per-path return. The claim tested:
foxcute's drift from torch_fp32 is within the band torch_tf32 (GPU) or torch_split2 (CPU)
drifts from it (`within_band`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import numpy as np
import torch

from .. import step
from . import market as market_module
from .agent import Agent
from .dqn import CURVES, Learner, Run, TrainConfig, Trainer


@dataclasses.dataclass(frozen=True)
class Setup:
    backend: str                  # "foxcute" or "torch" (agent.BACKENDS)
    precision: str = "tf32"       # foxcute's kernels
    torch_tf32: bool = False      # torch.backends' TF32 flags during the run
    micro_batches: int = 1        # multiplies the config's: each batch in that many more parts


SETUPS = {
    "foxcute": Setup("foxcute"),
    "torch_fp32": Setup("torch"),
    "torch_tf32": Setup("torch", torch_tf32=True),
    "torch_split2": Setup("torch", micro_batches=2),
}
REFERENCE = "torch_fp32"

# Agent sizes by name: the trainer's (foxcute.step.StepSizes' defaults), a small GPU one within
# every CUDA kernel's limits, and a tiny one for the CPU, where foxcute runs the float64 reference.
SIZES = {
    "trainer": step.StepSizes(),
    "small": step.StepSizes(B=512, K=8, SH2=64, D=16, Q=16, A_q=12, H_q=24, A=3, H_c=64, I_risk=16, H_risk=32,
                            I_kan=16, O_kan=16, G_kan=8, H_iqn=32),
    "tiny": step.StepSizes(B=32, K=4, SH2=16, D=4, Q=8, A_q=12, H_q=8, A=3, H_c=16, I_risk=8, H_risk=8, I_kan=8,
                           O_kan=8, G_kan=4, H_iqn=16),
}


def sizes_named(name: str) -> step.StepSizes:
    if name not in SIZES:
        raise ValueError(f"sizes must be one of {', '.join(SIZES)}, got {name!r}")
    return SIZES[name]


def markets_for(sizes: step.StepSizes, cfg: TrainConfig, *, eval_paths: int, eval_length: int
                ) -> tuple[market_module.Market, market_module.Market]:
    """The training market (cfg.n_envs paths, as long as cfg's run needs) and the held-out one
    (eval_paths paths of eval_length steps), from cfg.seed."""
    length = sizes.K + cfg.warmup_steps(sizes.B) + cfg.steps
    return market_module.make_markets(cfg.seed, sizes.K, n_train=cfg.n_envs, train_length=length,
                                      n_eval=eval_paths, eval_length=eval_length)


def band_setup(device: torch.device | str) -> str:
    """The PyTorch-internal variation the band is measured with on this device."""
    return "torch_tf32" if torch.device(device).type == "cuda" else "torch_split2"


@contextlib.contextmanager
def torch_tf32(enabled: bool) -> Iterator[None]:
    """torch's TF32 flags (CUDA matmuls and cuDNN) set for the block, restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def build(sizes: step.StepSizes, cfg: TrainConfig, setup: Setup, device: torch.device | str,
          markets: tuple[market_module.Market, market_module.Market]) -> Trainer:
    """A Trainer for `setup`: the agent's weights drawn with torch's generator seeded by
    cfg.seed (on the CPU, then moved: the same weights on every device and backend); the
    batch split into cfg.micro_batches * setup.micro_batches parts."""
    train_market, held_out = markets
    torch.manual_seed(cfg.seed)
    agent = Agent(sizes, backend=setup.backend, precision=setup.precision).to(device)
    isv = torch.from_numpy(train_market.signal(sizes.I_risk)).to(device)
    learner = Learner(agent, dataclasses.replace(cfg, micro_batches=cfg.micro_batches * setup.micro_batches), isv)
    return Trainer(learner, train_market, held_out)


def train(sizes: step.StepSizes, cfg: TrainConfig, setup: Setup, device: torch.device | str,
          markets: tuple[market_module.Market, market_module.Market]) -> Run:
    """One training run of `setup` (eager learner steps) and its held-out evaluation."""
    with torch_tf32(setup.torch_tf32):
        return build(sizes, cfg, setup, device, markets).run()


def drift(run: Run, reference: Run) -> dict[str, float]:
    """{curve: max_t |run - reference| / max_t |reference|, "params": ||p - p_ref|| / ||p_ref||,
    "eval_return": |mean - mean_ref| / mean over paths of |reference return|}."""
    out = {}
    for name in CURVES:
        a, b = run.curves[name].astype(np.float64), reference.curves[name].astype(np.float64)
        scale = np.abs(b).max()
        out[name] = float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())
    out["params"] = float(np.linalg.norm(run.params - reference.params) / np.linalg.norm(reference.params))
    scale = float(np.abs(reference.eval_returns).mean())
    out["eval_return"] = abs(run.eval_return - reference.eval_return) / (scale if scale > 0 else 1.0)
    return out


def within_band(candidate: dict[str, float], band: dict[str, float]) -> dict[str, bool]:
    """Per measure of `drift`: whether the candidate's drift is at most the band's."""
    return {name: candidate[name] <= band[name] for name in candidate}
