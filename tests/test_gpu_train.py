"""foxcute.train on the H200: one learner step of the foxcute agent against the same step in
float64 (the plain-PyTorch agent in double precision, same weights, same batch) beside
PyTorch's own float32 and TF32 steps; a learner step captured in a CUDA graph whose replays
update the weights as eager steps do; a short training run bit-identical on a rerun; the
step timings of foxcute.lab.training; a DDP step of two processes sharing the GPU over gloo
against one process's step on the whole batch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from foxcute.lab import training  # noqa: E402
from test_train_ddp import ddp_against_one_process  # noqa: E402
from foxcute.train import dqn, experiment  # noqa: E402

DEVICE = "cuda"
CONFIG = dqn.TrainConfig(steps=20, n_envs=256, epsilon_steps=10, target_every=8)
SIZES = {name: experiment.SIZES[name] for name in ("small", "trainer")}


def markets_for(sizes, config=CONFIG):
    return experiment.markets_for(sizes, config, eval_paths=16, eval_length=32)


def step_gradients(sizes, markets, batch, setup, torch_tf32, dtype=torch.float32):
    """(metrics, {parameter: gradient}) of one learner step's losses on `batch` for an
    experiment.Setup, its agent and batch in `dtype`; float64 NumPy arrays."""
    trainer = experiment.build(sizes, CONFIG, setup, DEVICE, markets)
    learner = trainer.learner
    learner.online.to(dtype)
    learner.target.to(dtype)
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    with experiment.torch_tf32(torch_tf32):
        metrics = dqn.losses(learner.online, learner.target, batch, learner.isv.to(dtype), learner.cfg)
        metrics[0].backward()
    return (metrics.detach().double().cpu().numpy(),
            {n: p.grad.double().cpu().numpy() for n, p in learner.online.named_parameters()})


@pytest.mark.parametrize("size", SIZES)
def test_a_foxcute_step_is_as_close_to_float64_as_pytorchs_own(size):
    sizes = SIZES[size]
    markets = markets_for(sizes)
    source = experiment.build(sizes, CONFIG, experiment.SETUPS["torch_fp32"], DEVICE, markets)
    source.fill()
    batch = source.batch()
    torch_setup = experiment.SETUPS["torch_fp32"]
    ref_metrics, ref = step_gradients(sizes, markets, batch, torch_setup, False, torch.float64)
    runs = {"foxcute_tf32": step_gradients(sizes, markets, batch, experiment.SETUPS["foxcute"], False),
            "foxcute_fp32": step_gradients(sizes, markets, batch, experiment.Setup("foxcute", precision="fp32"), False),
            "torch_fp32": step_gradients(sizes, markets, batch, torch_setup, False),
            "torch_tf32": step_gradients(sizes, markets, batch, torch_setup, True)}
    errors = {name: {"metrics": rel_err(m, ref_metrics), **{p: rel_err(g[p], ref[p]) for p in ref}}
              for name, (m, g) in runs.items()}
    # the claim of the issue in one step: foxcute's TF32 step is no further from float64 than
    # PyTorch's TF32 step (or within the TF32 bound); in FP32, no further than PyTorch's FP32 step
    # (or within 1e-4: a ReLU mask entry flipped by float32 rounding moves a gradient by a whole
    # entry, docs/layers.md section 5.4)
    for name, band, floor in (("foxcute_tf32", "torch_tf32", TOLERANCE["tf32"]),
                              ("foxcute_fp32", "torch_fp32", 1e-4)):
        worse = {p: (e, errors[band][p]) for p, e in errors[name].items() if e > max(floor, 2 * errors[band][p])}
        assert not worse, f"{name} against {band} (error, band's error): {worse}"


@pytest.mark.parametrize("size", SIZES)
def test_a_captured_learner_step_updates_the_weights_as_an_eager_step(size):
    sizes = SIZES[size]
    markets = markets_for(sizes)
    captured, eager = (experiment.build(sizes, CONFIG, experiment.SETUPS["foxcute"], DEVICE, markets)
                       for _ in range(2))
    for trainer in (captured, eager):
        trainer.fill()
    batches = [captured.batch() for _ in range(3)]
    graph = captured.learner.capture(batches[0])  # three warm-up steps on batches[0], then the capture
    for _ in range(3):
        eager.learner.step(batches[0])
    for batch in batches[1:]:
        before = [p.detach().clone() for p in captured.learner.online.parameters()]
        got = graph(batch).clone()
        want = eager.learner.step(batch)
        torch.cuda.synchronize()
        # foxcute's kernels are bit-identical run to run; torch's matmuls (projections, the IQN
        # head, the risk head's backward) may take another cuBLAS kernel in the capture
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        named = zip(captured.learner.online.named_parameters(), before, eager.learner.online.parameters())
        for (name, p), old, q in named:
            assert not torch.equal(p, old), f"{name}: the replay did not update it"
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)


def test_a_training_run_is_bit_identical_on_a_rerun_and_all_setups_train():
    sizes = SIZES["small"]
    markets = markets_for(sizes)
    runs = {name: experiment.train(sizes, CONFIG, experiment.SETUPS[name], DEVICE, markets)
            for name in ("foxcute", "torch_fp32", "torch_tf32")}
    again = experiment.train(sizes, CONFIG, experiment.SETUPS["foxcute"], DEVICE, markets)
    for name in dqn.CURVES:
        assert np.array_equal(again.curves[name], runs["foxcute"].curves[name]), name
    assert np.array_equal(again.params, runs["foxcute"].params)
    for name, run in runs.items():
        assert all(np.isfinite(run.curves[c]).all() for c in dqn.CURVES), name
        assert np.isfinite(run.eval_return), name
    drift = experiment.drift(runs["foxcute"], runs["torch_fp32"])
    assert set(drift) == {*dqn.CURVES, "params", "eval_return"} and all(np.isfinite(list(drift.values())))


def test_step_timings_record_every_implementation():
    sizes = SIZES["small"]
    config = dataclasses.replace(CONFIG, steps=1)
    records = training.step_records(sizes, config, markets_for(sizes, config), reps=3, calls_per_rep=2,
                                    compile_modes=("default",))
    assert [r["impl"] for r in records] == list(training.STEP_IMPLS)
    for r in records:
        assert "error" not in r, r
        assert r["layer"] == "train" and r["pass"] == "step" and r["time_us"] > 0
        assert r["timing"] == ("CUDA graph replay" if r["impl"] in ("torch_compile", "foxcute_graph")
                               else "plain calls")
    assert next(r for r in records if r["impl"] == "torch_compile")["params"]["mode"] == "default"
    with pytest.raises(ValueError, match="unknown impls"):
        training.step_records(sizes, config, markets_for(sizes, config), ["jax"])


def test_ddp_on_one_gpu_gives_one_processs_gradients(tmp_path):
    # two ranks on GPU 0 over gloo (tests/test_train_ddp.py's check, foxcute's kernels in TF32)
    ddp_against_one_process(tmp_path, "small", experiment.SETUPS["foxcute"], "cuda:0", TOLERANCE["tf32"])
