"""foxcute.train.distributed on the CPU: two processes over gloo take one DDP learner step on
the two halves of a batch; their gradients equal one process's on the whole batch (within the
float32 bound) and their parameters are equal, bit for bit; the trainer runs under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from foxcute.checks import TOLERANCE, rel_err

torch = pytest.importorskip("torch")

from foxcute.train import distributed, experiment  # noqa: E402
from foxcute.train.dqn import TrainConfig  # noqa: E402


def ddp_against_one_process(tmp_path, sizes_name, setup, device, bound):
    """Run distributed.step_worker in two processes, then one process's step on their batch;
    assert what the module docstring claims."""
    torch.multiprocessing.spawn(distributed.step_worker, nprocs=2, join=True,
                                args=(2, str(tmp_path / "init"), sizes_name, setup, device, str(tmp_path)))
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    batch = {k: v.to(device) for k, v in torch.load(tmp_path / "batch.pt").items()}
    sizes = experiment.sizes_named(sizes_name)
    cfg = TrainConfig(steps=1, n_envs=4)
    markets = experiment.markets_for(sizes, cfg, eval_paths=1, eval_length=sizes.K + 2)
    single = experiment.build(sizes, cfg, setup, device, markets).learner
    with experiment.torch_tf32(setup.torch_tf32):
        single.step(batch)
    for name, p in single.online.named_parameters():
        assert np.array_equal(ranks[0][f"param/{name}"], ranks[1][f"param/{name}"]), f"{name}: the ranks differ"
        assert np.array_equal(ranks[0][f"grad/{name}"], ranks[1][f"grad/{name}"]), f"{name}: the ranks differ"
        grad = p.grad.double().cpu().numpy()
        assert np.abs(grad).max() > 0, name
        assert rel_err(ranks[0][f"grad/{name}"], grad) < bound, name
        # after Adam: the same update up to rounding (Adam's first step moves each weight by
        # about lr, whatever the gradient's size: compared against the weights)
        assert rel_err(ranks[0][f"param/{name}"], p.detach().double().cpu().numpy()) < bound, name


def test_ddp_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    ddp_against_one_process(tmp_path, "tiny", experiment.SETUPS["torch_fp32"], "cpu", TOLERANCE["fp32"])


def test_rank_shares_and_process_group_choice():
    sizes, cfg = distributed.rank_share(experiment.SIZES["tiny"], TrainConfig(n_envs=8), 1, 2)
    assert sizes.B == experiment.SIZES["tiny"].B // 2 and cfg.n_envs == 4 and cfg.seed == 1
    with pytest.raises(ValueError, match="must divide by the world size 3"):
        distributed.rank_share(experiment.SIZES["tiny"], TrainConfig(n_envs=8), 0, 3)
    if not torch.cuda.is_available():
        assert distributed.process_group_backend(2) == "gloo"
        assert distributed.rank_device(1) == torch.device("cpu")


def test_the_trainer_runs_under_torchrun(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "foxcute.train.distributed", "--sizes", "tiny", "--steps", "4", "--n-envs", "8",
               "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # the CPU, even on a GPU machine
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((tmp_path / "ddp_run.json").read_text())
    assert run["world"] == 2 and run["process_group"] == "gloo"
    assert len(run["curves"]["loss"]) == 4 and np.isfinite(run["curves"]["loss"]).all()
    assert np.isfinite(run["eval_return"])
