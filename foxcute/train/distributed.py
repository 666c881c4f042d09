"""The learner past one GPU: PyTorch DistributedDataParallel over the online agent.

Each rank holds a whole replica: the online agent, the target network, Adam's state, its own
environments (its share of the training paths) and its own replay, and draws its own batch of
sizes.B / world samples. DDP averages the gradients over the ranks during the backward (one
all-reduce of every parameter's gradient, in buckets), so, every loss being a mean over samples
(foxcute.train.dqn), each rank's Adam applies the gradient of the whole batch: the same update
on every rank, the replicas stay equal. DDP broadcasts rank 0's weights when it wraps the
agent; the target network is copied from them after.

`distribute(learner)` wraps a Learner's losses in DDP; `main()` is the trainer under torchrun:

    python -m torch.distributed.run --nproc_per_node 2 -m foxcute.train.distributed --sizes tiny --steps 20

The process group: NCCL where every rank has a GPU of its own, gloo otherwise (the CPU, or
several ranks sharing one GPU, as the tests do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from .. import step
from . import experiment
from . import market as market_module
from .agent import Agent
from .dqn import TrainConfig, Trainer, losses


class Objective(nn.Module):
    """The online agent as a module whose forward is the losses (dqn.losses): what DDP wraps,
    since DDP all-reduces the gradients of what ran through its forward."""

    def __init__(self, online: Agent):
        super().__init__()
        self.online = online

    def forward(self, target: Agent, batch: dict[str, Tensor], isv: Tensor, cfg: TrainConfig) -> Tensor:
        return losses(self.online, target, batch, isv, cfg)


def distribute(learner, device_ids: Sequence[int] | None = None) -> DistributedDataParallel:
    """Wrap the learner's online agent in DDP (the default process group, initialised first) and
    make its steps go through it; the target network takes the broadcast weights. Returns the
    DDP module."""
    ddp = DistributedDataParallel(Objective(learner.online), device_ids=device_ids)
    learner.target.load_state_dict(learner.online.state_dict())
    learner.loss_fn = lambda online, target, batch, isv, cfg: ddp(target, batch, isv, cfg)
    return ddp


def process_group_backend(world: int) -> str:
    """"nccl" where CUDA has a GPU for every rank, else "gloo"."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"


def rank_device(rank: int) -> torch.device:
    """The rank's device: GPU rank % device count where CUDA is available, else the CPU."""
    return torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() \
        else torch.device("cpu")


def rank_share(sizes: step.StepSizes, cfg: TrainConfig, rank: int, world: int) -> tuple[step.StepSizes, TrainConfig]:
    """A rank's sizes (batch sizes.B / world) and config (cfg.n_envs / world environments, its
    own random stream: seed + rank). ValueError unless both divide by world."""
    if sizes.B % world or cfg.n_envs % world:
        raise ValueError(f"distributed: the batch ({sizes.B}) and n_envs ({cfg.n_envs}) must divide by the "
                         f"world size {world}")
    return (dataclasses.replace(sizes, B=sizes.B // world),
            dataclasses.replace(cfg, n_envs=cfg.n_envs // world, seed=cfg.seed + rank))


def rank_markets(markets: tuple[market_module.Market, market_module.Market], rank: int, world: int
                 ) -> tuple[market_module.Market, market_module.Market]:
    """The rank's training paths (every world-th from rank on) and the whole held-out set."""
    train, held_out = markets
    return train.take(slice(rank, None, world)), held_out


def step_worker(rank: int, world: int, init_file: str, sizes_name: str, setup: experiment.Setup, device: str,
                out: str) -> None:
    """One DDP learner step, a process of `world` (torch.multiprocessing.spawn's target; process
    group gloo through `init_file`): every rank builds the same learner and the same batch
    (sizes_name's sizes, TrainConfig() at 2 * world environments, seed 0), takes its share of
    the batch's rows (rank r the r-th of `world` equal parts), steps, and saves its gradients
    and parameters to out/rank<r>.npz; rank 0 also the whole batch to out/batch.pt. What a
    single process's step on that batch gives is the caller's to compare."""
    import numpy as np

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        sizes = experiment.sizes_named(sizes_name)
        cfg = TrainConfig(steps=1, n_envs=2 * world)
        markets = experiment.markets_for(sizes, cfg, eval_paths=1, eval_length=sizes.K + 2)
        trainer = experiment.build(sizes, cfg, setup, device, markets)
        trainer.fill()
        batch = trainer.batch()
        share = sizes.B // world
        mine = {k: v[rank * share:(rank + 1) * share] for k, v in batch.items()}
        distribute(trainer.learner, [torch.device(device).index or 0] if device.startswith("cuda") else None)
        with experiment.torch_tf32(setup.torch_tf32):
            trainer.learner.step(mine)
        online = trainer.learner.online
        np.savez(Path(out) / f"rank{rank}.npz",
                 **{f"grad/{n}": p.grad.double().cpu().numpy() for n, p in online.named_parameters()},
                 **{f"param/{n}": p.detach().double().cpu().numpy() for n, p in online.named_parameters()})
        if rank == 0:
            torch.save({k: v.cpu() for k, v in batch.items()}, Path(out) / "batch.pt")
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train under torchrun (RANK, WORLD_SIZE and the rendezvous from the environment);
    rank 0 writes the curves and the held-out return to --out. Returns rank 0's summary."""
    parser = argparse.ArgumentParser(prog="python -m foxcute.train.distributed", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny", choices=list(experiment.SIZES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n-envs", type=int, default=16, help="environments over all ranks")
    parser.add_argument("--backend", default="torch", choices=["torch", "foxcute"], help="the agent's layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="rank 0 writes ddp_run.json here")
    args = parser.parse_args(argv)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dist.init_process_group(process_group_backend(world))
    try:
        device = rank_device(rank)
        sizes = experiment.sizes_named(args.sizes)
        cfg = TrainConfig(steps=args.steps, n_envs=args.n_envs, epsilon_steps=max(1, args.steps // 2), seed=args.seed)
        markets = experiment.markets_for(sizes, cfg, eval_paths=8, eval_length=48)
        my_sizes, my_cfg = rank_share(sizes, cfg, rank, world)
        trainer = experiment.build(my_sizes, my_cfg, experiment.Setup(args.backend), device,
                                   rank_markets(markets, rank, world))
        distribute(trainer.learner, [device.index] if device.type == "cuda" else None)
        run = trainer.run()
        summary = {"world": world, "process_group": dist.get_backend(), "eval_return": run.eval_return,
                   "final_loss": float(run.curves["loss"][-1])}
        if rank == 0 and args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "ddp_run.json").write_text(json.dumps({**summary, "curves": {
                k: v.tolist() for k, v in run.curves.items()}}, indent=1))
        return summary
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps(main()))
