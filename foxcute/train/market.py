"""The trading task: seeded synthetic price paths, their observation features, and the reward.

Prices. Each path is a log price p_t driven by returns r_t (in percent) from a two-regime
Markov chain, calm and volatile (REGIMES), whose returns have

- volatility clusters: a GARCH(1, 1) variance per path, v_t = omega + alpha * (r_{t-1} - m_{t-1})^2
  + beta * v_{t-1}, with omega chosen per regime so that a regime held forever has variance
  vol^2 (the regime sets the level, the recursion the clusters; after a switch the variance
  moves to the new level at the rate alpha + beta per step, so each regime's measured spread
  lies between the two levels);
- mean reversion: m_t = kappa * (a_{t-1} - p_{t-1}), a pull towards an anchor a_t that drifts
  as a slow random walk (so the predictable part is the price's distance from where it has
  recently been, which the features see through an exponential average).

r_t = m_t + sqrt(v_t) * z_t with standard normal z_t. Everything comes from one
numpy.random.Generator seeded by the caller: the same seed gives the same paths bit for bit.

Features, per path and step (N_FEATURES of them, each clipped to +-FEATURE_CLIP): the return
scaled by the calm volatility, the price's distance from its exponential average (span 20),
the realised volatility (exponential average of r^2, span 10) over the calm one minus 1, and
the sum of the last three returns (momentum). An observation at step t is the last K steps'
features, t - K + 1 .. t.

Actions {0: short, 1: flat, 2: long} give a direction d = action - 1; the position is
d times the risk budget (in (0, 1), the agent's risk head). The reward of holding position
x_t from t to t + 1, having held x_{t-1} before, is

    reward = x_t * r_{t+1} - cost * |x_t - x_{t-1}|          (`reward`)

A `Market` holds paths for training; `make_markets` gives a training market and a held-out
one drawn from an independent stream of the same seed (never the training paths).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

N_FEATURES = 4
FEATURE_CLIP = 5.0
ACTIONS = ("short", "flat", "long")
BURN_IN = 50  # steps simulated and dropped, so the averages and the GARCH variance start settled


@dataclasses.dataclass(frozen=True)
class Regime:
    vol: float        # long-run standard deviation of the return, percent
    kappa: float      # mean-reversion rate towards the anchor
    stay: float       # probability of staying in this regime for another step


REGIMES = (Regime(vol=0.5, kappa=0.05, stay=0.98), Regime(vol=1.5, kappa=0.01, stay=0.95))
GARCH_ALPHA, GARCH_BETA = 0.1, 0.8
ANCHOR_VOL = 0.1  # percent per step: the anchor's random walk


def simulate(n_paths: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(returns [n_paths, length] float64 in percent, regime [n_paths, length] int8) of
    `length` steps per path after BURN_IN discarded ones."""
    if n_paths < 1 or length < 1:
        raise ValueError(f"market.simulate: n_paths and length must be >= 1, got {n_paths}, {length}")
    vol = np.array([r.vol for r in REGIMES])
    kappa = np.array([r.kappa for r in REGIMES])
    stay = np.array([r.stay for r in REGIMES])
    omega = vol**2 * (1 - GARCH_ALPHA - GARCH_BETA)
    total = BURN_IN + length
    regime = np.zeros(n_paths, dtype=np.int8)
    variance = vol[regime] ** 2
    price = np.zeros(n_paths)
    anchor = np.zeros(n_paths)
    shock = np.zeros(n_paths)
    returns = np.empty((n_paths, total))
    regimes = np.empty((n_paths, total), dtype=np.int8)
    for t in range(total):
        switch = rng.random(n_paths) > stay[regime]
        regime = np.where(switch, 1 - regime, regime).astype(np.int8)
        variance = omega[regime] + GARCH_ALPHA * shock**2 + GARCH_BETA * variance
        shock = np.sqrt(variance) * rng.standard_normal(n_paths)
        r = kappa[regime] * (anchor - price) + shock
        anchor = anchor + ANCHOR_VOL * rng.standard_normal(n_paths)
        price = price + r
        returns[:, t], regimes[:, t] = r, regime
    return returns[:, BURN_IN:], regimes[:, BURN_IN:]


def _ema(x: np.ndarray, span: int) -> np.ndarray:
    """Exponential moving average along axis 1, weight 2 / (span + 1), started at x[:, 0]."""
    w = 2.0 / (span + 1)
    out = np.empty_like(x)
    out[:, 0] = x[:, 0]
    for t in range(1, x.shape[1]):
        out[:, t] = (1 - w) * out[:, t - 1] + w * x[:, t]
    return out


def features(returns: np.ndarray) -> np.ndarray:
    """[n_paths, length, N_FEATURES] float32 from returns [n_paths, length] (the module
    docstring lists them); step t uses returns up to t only."""
    calm = REGIMES[0].vol
    price = np.cumsum(returns, axis=1)
    distance = (price - _ema(price, 20)) / (4 * calm)
    realised = np.sqrt(_ema(returns**2, 10)) / calm - 1
    padded = np.concatenate([np.zeros((returns.shape[0], 2)), returns], axis=1)
    momentum = (padded[:, 2:] + padded[:, 1:-1] + padded[:, :-2]) / (calm * np.sqrt(3))
    stacked = np.stack([returns / calm, distance, realised, momentum], axis=-1)
    return np.clip(stacked, -FEATURE_CLIP, FEATURE_CLIP).astype(np.float32)


def reward(position: Any, prev_position: Any, next_return: Any, cost: float) -> Any:
    """position * next_return - cost * |position - prev_position|, elementwise (NumPy arrays,
    torch tensors or floats alike)."""
    return position * next_return - cost * abs(position - prev_position)


class Market:
    """Price paths with their features, for an agent looking K steps back.

    returns [n_paths, length] (float32, percent), features [n_paths, length, N_FEATURES].
    Decision steps are t = K - 1 .. length - 2 (`first_step`, `last_step`): the observation
    needs K steps of history and the reward the return of step t + 1."""

    def __init__(self, returns: np.ndarray, K: int):
        if K < 1 or returns.shape[1] < K + 1:
            raise ValueError(f"Market: K must be >= 1 and the paths at least K + 1 = {K + 1} steps long, "
                             f"got K={K}, length {returns.shape[1]}")
        self.K = K
        self.returns = returns.astype(np.float32)
        self.features = features(returns)

    @property
    def n_paths(self) -> int:
        return self.returns.shape[0]

    @property
    def first_step(self) -> int:
        return self.K - 1

    @property
    def last_step(self) -> int:
        return self.returns.shape[1] - 2

    def take(self, rows: slice) -> "Market":
        """The paths `rows` selects (their returns and features as computed here)."""
        part = object.__new__(Market)
        part.K, part.returns, part.features = self.K, self.returns[rows], self.features[rows]
        return part

    def observation(self, t: int) -> np.ndarray:
        """[n_paths, K, N_FEATURES]: the features of steps t - K + 1 .. t."""
        if not self.first_step <= t <= self.last_step + 1:
            raise ValueError(f"Market.observation: t must be in {self.first_step}..{self.last_step + 1}, got {t}")
        return self.features[:, t - self.K + 1:t + 1]

    def next_return(self, t: int) -> np.ndarray:
        """[n_paths]: r_{t+1}, what a position held at step t earns."""
        if not self.first_step <= t <= self.last_step:
            raise ValueError(f"Market.next_return: t must be in {self.first_step}..{self.last_step}, got {t}")
        return self.returns[:, t + 1]

    def signal(self, size: int) -> np.ndarray:
        """The risk head's signal vector [size] float32: each feature's mean then its standard
        deviation over these paths, zero-padded (one vector for every sample: the market the
        agent trades, not the state it is in). size must be at least 2 * N_FEATURES."""
        if size < 2 * N_FEATURES:
            raise ValueError(f"Market.signal: size must be >= {2 * N_FEATURES} (two statistics per feature), "
                             f"got {size}")
        flat = self.features.reshape(-1, N_FEATURES)
        out = np.zeros(size, dtype=np.float32)
        out[:2 * N_FEATURES] = np.concatenate([flat.mean(axis=0), flat.std(axis=0)])
        return out


def make_markets(seed: int, K: int, *, n_train: int, train_length: int, n_eval: int,
                 eval_length: int) -> tuple[Market, Market]:
    """(training market, held-out market): independent paths from two child streams of `seed`."""
    train_rng, eval_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    train = Market(simulate(n_train, train_length, train_rng)[0], K)
    held_out = Market(simulate(n_eval, eval_length, eval_rng)[0], K)
    return train, held_out
