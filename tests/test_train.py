"""foxcute.train on the CPU: the market (seeded, its statistics, windows, reward), the agent
(shapes, one set of parameters for both backends), the losses and learner step (foxcute's
backend, here the float64 reference, against the plain-PyTorch one; gradient accumulation
against the whole batch), training (bit-reproducible, foxcute and torch runs close), the drift
measure, and bad arguments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from foxcute.checks import rel_err

torch = pytest.importorskip("torch")

from foxcute.train import agent as agent_module  # noqa: E402
from foxcute.train import dqn, experiment, market  # noqa: E402

TINY = experiment.SIZES["tiny"]
CONFIG = dqn.TrainConfig(steps=6, n_envs=8, epsilon_steps=3, target_every=4)


@pytest.fixture(scope="module")
def markets():
    return experiment.markets_for(TINY, CONFIG, eval_paths=4, eval_length=16)


# ---------------------------------------------------------------- the market


def test_paths_are_a_function_of_the_seed():
    a, ra = market.simulate(3, 50, np.random.default_rng(5))
    b, rb = market.simulate(3, 50, np.random.default_rng(5))
    c, _ = market.simulate(3, 50, np.random.default_rng(6))
    assert np.array_equal(a, b) and np.array_equal(ra, rb)
    assert not np.allclose(a, c)
    train, held_out = market.make_markets(1, 4, n_train=3, train_length=50, n_eval=3, eval_length=50)
    again, _ = market.make_markets(1, 4, n_train=3, train_length=50, n_eval=3, eval_length=50)
    assert np.array_equal(train.returns, again.returns)
    assert not np.allclose(train.returns, held_out.returns)  # the held-out paths are other paths


def test_the_generator_has_regimes_clusters_and_sane_features():
    returns, regimes = market.simulate(64, 2000, np.random.default_rng(0))
    assert set(np.unique(regimes)) == {0, 1}
    assert returns[regimes == 1].std() > 1.2 * returns[regimes == 0].std()
    squared = returns**2 - (returns**2).mean()
    assert (squared[:, 1:] * squared[:, :-1]).mean() / squared.var() > 0.1  # volatility clusters
    assert abs(returns.mean()) < 0.05
    feats = market.features(returns)
    assert feats.shape == (64, 2000, market.N_FEATURES) and feats.dtype == np.float32
    assert np.isfinite(feats).all() and np.abs(feats).max() <= market.FEATURE_CLIP
    assert np.allclose(feats.reshape(-1, 4).std(axis=0), 1.0, atol=0.8)  # of order one


def test_observation_windows_and_next_returns(markets):
    train, _ = markets
    t = train.first_step + 2
    obs = train.observation(t)
    assert obs.shape == (train.n_paths, TINY.K, market.N_FEATURES)
    assert np.array_equal(obs[:, -1], train.features[:, t]) and np.array_equal(obs[:, 0],
                                                                                train.features[:, t - TINY.K + 1])
    assert np.array_equal(train.next_return(t), train.returns[:, t + 1])
    with pytest.raises(ValueError, match="t must be in"):
        train.next_return(train.last_step + 1)
    with pytest.raises(ValueError, match="t must be in"):
        train.observation(train.first_step - 1)
    signal = train.signal(10)
    assert signal.shape == (10,) and np.all(signal[8:] == 0) and np.all(signal[4:8] > 0)


def test_reward_is_position_times_return_less_the_cost_of_trading():
    assert market.reward(1.0, 0.0, 2.0, 0.1) == pytest.approx(1.9)
    assert market.reward(-0.5, 0.5, 2.0, 0.1) == pytest.approx(-1.1)
    assert market.reward(0.0, 0.0, 3.0, 0.1) == 0.0
    got = market.reward(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]), 0.25)
    assert torch.allclose(got, torch.tensor([0.5, -1.0]))


# ---------------------------------------------------------------- the agent


def agents(sizes=TINY):
    out = {}
    for backend in agent_module.BACKENDS:
        torch.manual_seed(3)
        out[backend] = agent_module.Agent(sizes, backend=backend)
    return out


def test_both_backends_build_the_same_parameters_and_share_a_state_dict():
    built = agents()
    fox, peer = built["foxcute"].state_dict(), built["torch"].state_dict()
    assert list(fox) == list(peer)
    assert all(torch.equal(fox[k], peer[k]) for k in fox)
    torch.manual_seed(4)
    other = agent_module.Agent(TINY, backend="torch")
    other.load_state_dict(fox)  # strict: every name and shape matches
    assert all(torch.equal(v, fox[k]) for k, v in other.state_dict().items())


def test_agent_shapes_and_outputs_agree_between_backends():
    built = agents()
    B, z = 5, TINY
    obs, position = torch.randn(B, z.K, market.N_FEATURES), torch.rand(B) * 2 - 1
    levels = torch.rand(B, z.Q)
    results = {}
    for backend, agent in built.items():
        out = agent.trunk(obs, position)
        results[backend] = (out, agent.quantiles(out, levels), agent.q_values(out),
                            agent.fixed_quantiles(out))
    fox, peer = results["foxcute"], results["torch"]
    assert fox[0].shape == (B, z.SH2) and fox[1].shape == (B, z.Q, z.A) and fox[2].shape == (B, z.A)
    assert fox[3].shape == (B, z.A_q // z.A, z.A)
    for a, b in zip(fox, peer):
        assert rel_err(a.detach().numpy(), b.detach().numpy()) < 1e-5


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="jax"), "backend must be one of"),
    (dict(precision="fp16"), "precision must be one of"),
    (dict(sizes=dataclasses.replace(TINY, A=4)), "sizes.A must be 3"),
    (dict(sizes=dataclasses.replace(TINY, A_q=10)), "sizes.A_q must be a multiple of sizes.A"),
    (dict(sizes=dataclasses.replace(TINY, I_risk=7)), "sizes.I_risk must be >= 8"),
])
def test_bad_agent_arguments_are_named(kwargs, message):
    sizes = kwargs.pop("sizes", TINY)
    with pytest.raises(ValueError, match=message):
        agent_module.Agent(sizes, **kwargs)


# ---------------------------------------------------------------- one learner step


def first_batch(markets, setup="torch_fp32", config=CONFIG):
    trainer = experiment.build(TINY, config, experiment.SETUPS[setup], "cpu", markets)
    trainer.fill()
    return trainer, trainer.batch()


def step_gradients(trainer, batch):
    metrics = trainer.learner.step(batch)
    return metrics, {name: p.grad.clone() for name, p in trainer.learner.online.named_parameters()}


def test_foxcute_and_torch_agree_on_a_steps_losses_and_gradients(markets):
    fox_trainer, fox_batch = first_batch(markets, "foxcute")
    peer_trainer, peer_batch = first_batch(markets, "torch_fp32")
    # the same data: the same paths, actions and levels; the positions (and so the rewards) are
    # the risk head's, of each backend's rounding
    for name in ("obs", "next_obs", "action", "next_return", "levels", "next_levels"):
        assert torch.equal(fox_batch[name], peer_batch[name]), name
    for name in ("prev_position", "position", "reward"):
        assert rel_err(fox_batch[name].numpy(), peer_batch[name].numpy()) < 1e-5, name
    fox_metrics, fox_grads = step_gradients(fox_trainer, fox_batch)
    peer_metrics, peer_grads = step_gradients(peer_trainer, peer_batch)
    assert rel_err(fox_metrics.numpy(), peer_metrics.numpy()) < 1e-5
    assert fox_metrics[0] > 0 and torch.isfinite(fox_metrics).all()
    for name, grad in peer_grads.items():
        assert grad.abs().max() > 0, f"{name} got no gradient"
        assert rel_err(fox_grads[name].numpy(), grad.numpy()) < 1e-4, name


def test_the_metrics_are_the_losses_the_docstring_defines(markets):
    trainer, batch = first_batch(markets)
    metrics = dict(zip(dqn.METRICS, trainer.learner.step(batch).tolist()))
    cfg = trainer.learner.cfg
    assert metrics["loss"] == pytest.approx(metrics["loss_iqn"] + cfg.denoise_weight * metrics["loss_denoise"]
                                            + metrics["loss_curiosity"] + metrics["loss_risk"], rel=1e-5)
    assert metrics["loss_iqn"] > 0 and metrics["loss_denoise"] > 0 and metrics["loss_curiosity"] > 0
    assert metrics["td_error"] > 0


def test_gradient_accumulation_gives_the_whole_batchs_gradient(markets):
    # every loss is a mean over samples: the premise of micro-batching and of DDP's averaging
    whole, batch = first_batch(markets)
    split, _ = first_batch(markets, config=dataclasses.replace(CONFIG, micro_batches=4))
    a_metrics, a_grads = step_gradients(whole, batch)
    b_metrics, b_grads = step_gradients(split, batch)
    assert rel_err(b_metrics.numpy(), a_metrics.numpy()) < 1e-6
    for name, grad in a_grads.items():
        assert rel_err(b_grads[name].numpy(), grad.numpy()) < 1e-5, name
    with pytest.raises(ValueError, match="micro_batches=5"):
        experiment.build(TINY, dataclasses.replace(CONFIG, micro_batches=5), experiment.SETUPS["torch_fp32"], "cpu",
                         markets).learner.step(batch)


def test_every_micro_batchs_actions_start_on_16_bytes(markets):
    # the curiosity kernel takes int64 actions 16-byte aligned: a slice at an odd offset is not
    trainer, batch = first_batch(markets, config=dataclasses.replace(CONFIG, micro_batches=2))
    batch = {name: t[:6] for name, t in batch.items()}  # halves of 3: the second starts 24 bytes in
    seen, losses = [], trainer.learner.loss_fn

    def recording(online, target, part, *rest):
        seen.append(part["action"].data_ptr() % 16)
        return losses(online, target, part, *rest)

    trainer.learner.loss_fn = recording
    trainer.learner.step(batch)
    assert seen == [0, 0]


def test_the_target_network_follows_the_online_one_every_target_every_steps(markets):
    trainer, batch = first_batch(markets)
    learner = trainer.learner
    frozen = [p.clone() for p in learner.target.parameters()]
    for _ in range(learner.cfg.target_every - 1):
        learner.step(batch)
        learner.after_step()
    assert all(torch.equal(p, q) for p, q in zip(learner.target.parameters(), frozen))
    learner.step(batch)
    learner.after_step()
    assert all(torch.equal(p, q) for p, q in zip(learner.target.parameters(), learner.online.parameters()))
    assert not any(p.requires_grad for p in learner.target.parameters())


def test_the_replay_is_a_ring():
    replay = dqn.Replay(5, 2, torch.device("cpu"))

    def transitions(first, n=3):  # every field of transition i holds the number first + i
        value = torch.arange(first, first + n, dtype=torch.float32)
        return {name: value[:, None, None].expand(n, 2, market.N_FEATURES) if name.endswith("obs") else value
                for name in dqn.FIELDS}

    replay.add(transitions(0))
    replay.add(transitions(3))
    assert replay.size == 5 and replay.cursor == 1
    assert replay.data["action"].tolist() == [5, 1, 2, 3, 4]
    assert replay.data["next_obs"][0].eq(5).all()
    sample = replay.sample(7, torch.Generator().manual_seed(0))
    assert sample["obs"].shape == (7, 2, market.N_FEATURES) and sample["action"].dtype == torch.int64
    assert torch.equal(sample["obs"][:, 0, 0], sample["reward"])  # rows stay whole


# ---------------------------------------------------------------- training


def test_training_is_bit_reproducible_and_moves_the_weights(markets):
    first = experiment.train(TINY, CONFIG, experiment.SETUPS["torch_fp32"], "cpu", markets)
    again = experiment.train(TINY, CONFIG, experiment.SETUPS["torch_fp32"], "cpu", markets)
    assert all(np.array_equal(first.curves[k], again.curves[k]) for k in dqn.CURVES)
    assert np.array_equal(first.params, again.params) and first.eval_return == again.eval_return
    assert all(first.curves[k].shape == (CONFIG.steps,) and np.isfinite(first.curves[k]).all() for k in dqn.CURVES)
    assert first.eval_returns.shape == (4,) and first.eval_return == pytest.approx(first.eval_returns.mean())
    torch.manual_seed(CONFIG.seed)
    initial = dqn.flat_parameters(agent_module.Agent(TINY, backend="torch"))
    assert np.linalg.norm(first.params - initial) > 0
    drift = experiment.drift(again, first)
    assert set(drift) == {*dqn.CURVES, "params", "eval_return"} and not any(drift.values())
    other = experiment.train(TINY, dataclasses.replace(CONFIG, seed=1), experiment.SETUPS["torch_fp32"], "cpu", markets)
    assert experiment.drift(other, first)["params"] > 0.01


def test_foxcute_trains_as_torch_does_over_a_few_steps(markets):
    fox = experiment.train(TINY, CONFIG, experiment.SETUPS["foxcute"], "cpu", markets)
    peer = experiment.train(TINY, CONFIG, experiment.SETUPS["torch_fp32"], "cpu", markets)
    drift = experiment.drift(fox, peer)
    assert max(drift.values()) < 1e-4, drift
    band = experiment.drift(experiment.train(TINY, CONFIG, experiment.SETUPS["torch_split2"], "cpu", markets), peer)
    assert experiment.band_setup("cpu") == "torch_split2"
    assert max(band.values()) < 1e-4, band
    assert experiment.within_band({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 1.5}) == {"a": True, "b": False}


@pytest.mark.parametrize("field, value, message", [
    ("steps", 0, "TrainConfig.steps must be >= 1"),
    ("n_envs", 0, "TrainConfig.n_envs must be >= 1"),
    ("gamma", 1.5, r"TrainConfig.gamma must be in \[0, 1\]"),
    ("lr", -1.0, "TrainConfig.lr must be >= 0"),
    ("micro_batches", 0, "TrainConfig.micro_batches must be >= 1"),
])
def test_bad_config_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        dqn.TrainConfig(**{field: value})


def test_a_market_too_small_for_the_run_is_refused(markets):
    with pytest.raises(ValueError, match="must be at least"):
        experiment.build(TINY, dataclasses.replace(CONFIG, steps=CONFIG.steps + 1), experiment.SETUPS["torch_fp32"],
                         "cpu", markets)
    with pytest.raises(ValueError, match="fewer than n_envs=9"):
        experiment.build(TINY, dataclasses.replace(CONFIG, n_envs=9), experiment.SETUPS["torch_fp32"], "cpu", markets)
    with pytest.raises(ValueError, match="sizes must be one of"):
        experiment.sizes_named("huge")


def test_docs_state_the_trainer_agents_parameter_count():
    # docs/training.md computes the all-reduce bytes from this count
    from pathlib import Path

    agent = agent_module.Agent(experiment.SIZES["trainer"], backend="torch")
    count = sum(p.numel() for p in agent.parameters())
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    assert f"agent has {count:,} parameters" in text and f"{4 * count:,} bytes" in text
