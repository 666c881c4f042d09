"""Training the agent: the replay buffer, the losses, the learner step (forward, backward, Adam)
eager or captured in one CUDA graph, acting in the market, the training loop and evaluation.

The loss of a batch of transitions (obs, prev_position, action, reward, next_return,
next_obs, position), `losses`:

- IQN quantile-Huber TD loss. Z = online quantiles of the taken action at N = Q sampled levels
  tau_i; the target T_j = reward + beta * r + gamma * Z'_j, Z' the target network's quantiles of
  the next state at Q other sampled levels for its greedy action (the mean of Z' over the
  levels), r the curiosity error of the transition. With u_ij = T_j - Z_i and the Huber
  function h (threshold kappa = 1): loss_iqn = mean_b sum_i mean_j |tau_i - [u_ij < 0]| h(u_ij).
- Q-denoise: the MLP maps the online Z at the fixed levels ([B, A_q]) to the target network's at
  the same state; its mean squared error, weighted by `denoise_weight`, trains the MLP and,
  through q, the online network.
- Curiosity: the forward model predicts the target network's trunk output of the next state
  from the online one of this state (both taken as inputs) and the action; its loss trains the
  model, its per-sample error r is the intrinsic reward above.
- Risk: the head maps (out, the market's signal vector, r) to a budget b in (0, 1), trained to
  maximise a mean-variance utility of the direction's return: loss_risk = -mean(b p - aversion *
  (b p)^2 / 2), p = (action - 1) * next_return; acting, the position is (action - 1) * b.

The trunk output enters the curiosity model and the risk head detached: only the TD and
denoise losses shape the trunk. Every loss is a mean over the batch's samples, so the gradient
of a batch is the size-weighted mean of its parts' gradients (gradient accumulation over
`micro_batches`, and PyTorch DDP over ranks, give the whole batch's gradient).

Determinism: every random draw (replay indices, quantile levels, exploration) comes from one
torch.Generator seeded by the config, drawn in the same order whatever the backend, so two
learners with the same seed and initial weights see the same data until their policies act
differently.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from .. import step
from . import market as market_module
from .agent import Agent

METRICS = ("loss", "loss_iqn", "loss_denoise", "loss_curiosity", "loss_risk", "td_error", "mean_q")
CURVES = (*METRICS, "train_reward")  # a run's curves: the learner's metrics, then the acting's mean reward
# the transitions' fields and their dtypes
FIELDS = {"obs": torch.float32, "prev_position": torch.float32, "action": torch.int64, "reward": torch.float32,
          "next_return": torch.float32, "next_obs": torch.float32, "position": torch.float32}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a run does besides the agent's sizes (B, the batch, is sizes.B)."""

    steps: int = 1000             # learner steps, each after one step of acting in every environment
    n_envs: int = 256             # training paths acted in at once
    gamma: float = 0.9            # discount
    lr: float = 1e-4              # Adam
    target_every: int = 100       # learner steps between copies of the online weights to the target network
    epsilon_start: float = 1.0    # exploration, decayed linearly over the first epsilon_steps steps
    epsilon_end: float = 0.05
    epsilon_steps: int = 500
    cost: float = 0.02            # transaction cost per unit of position change (percent)
    beta: float = 0.1             # weight of the intrinsic reward r
    denoise_weight: float = 0.1
    risk_aversion: float = 0.5
    micro_batches: int = 1        # gradient accumulation: the batch in this many equal parts
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "n_envs", "target_every", "epsilon_steps", "micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "epsilon_start", "epsilon_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("lr", "cost", "beta", "denoise_weight", "risk_aversion"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")

    def epsilon(self, step_index: int) -> float:
        frac = min(step_index / self.epsilon_steps, 1.0)
        return self.epsilon_start + frac * (self.epsilon_end - self.epsilon_start)

    def warmup_steps(self, batch: int) -> int:
        """Steps of random acting before the first learner step: enough to fill one batch."""
        return -(-batch // self.n_envs)


class Replay:
    """A ring buffer of transitions on one device (FIELDS), `capacity` of them."""

    def __init__(self, capacity: int, K: int, device: torch.device):
        if capacity < 1:
            raise ValueError(f"Replay: capacity must be >= 1, got {capacity}")
        obs_shape = (K, market_module.N_FEATURES)
        self.capacity, self.size, self.cursor = capacity, 0, 0
        self.data = {name: torch.zeros((capacity, *(obs_shape if name.endswith("obs") else ())), dtype=dtype,
                                       device=device) for name, dtype in FIELDS.items()}

    def add(self, transitions: dict[str, Tensor]) -> None:
        n = len(transitions["action"])
        index = (self.cursor + torch.arange(n, device=self.data["action"].device)) % self.capacity
        for name, buffer in self.data.items():
            buffer[index] = transitions[name].to(buffer.dtype)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
        index = torch.randint(0, self.size, (batch,), generator=generator, device=generator.device)
        return {name: buffer[index] for name, buffer in self.data.items()}


def draw_levels(batch: int, Q: int, generator: torch.Generator) -> dict[str, Tensor]:
    """The IQN's sampled levels of one learner step: {"levels", "next_levels"}, [batch, Q] each."""
    return {name: torch.rand(batch, Q, generator=generator, device=generator.device)
            for name in ("levels", "next_levels")}


def losses(online: Agent, target: Agent, batch: dict[str, Tensor], isv: Tensor, cfg: TrainConfig) -> Tensor:
    """The metrics (METRICS order) of one batch as a float32 vector, the first the total loss
    to differentiate (the module docstring defines each term)."""
    B = batch["action"].shape[0]
    action = batch["action"]
    out = online.trunk(batch["obs"], batch["prev_position"])
    with torch.no_grad():
        next_out = target.trunk(batch["next_obs"], batch["position"])
        z_next = target.quantiles(next_out, batch["next_levels"])
        greedy = z_next.mean(dim=1).argmax(dim=1)
        z_next = z_next.gather(2, greedy[:, None, None].expand(-1, z_next.shape[1], 1)).squeeze(2)
        q_target = target.fixed_quantiles(target.trunk(batch["obs"], batch["prev_position"])).reshape(B, -1)
    loss_c, r = online.curiosity(out.detach(), action, next_out)
    T = (batch["reward"] + cfg.beta * r)[:, None] + cfg.gamma * z_next                     # [B, Q']
    z = online.quantiles(out, batch["levels"])
    z = z.gather(2, action[:, None, None].expand(-1, z.shape[1], 1)).squeeze(2)            # [B, Q]
    u = T[:, None, :] - z[:, :, None]                                                        # [B, Q, Q']
    huber = torch.where(u.abs() <= 1.0, 0.5 * u.square(), u.abs() - 0.5)
    weight = (batch["levels"][:, :, None] - (u.detach() < 0).to(u.dtype)).abs()
    loss_iqn = (weight * huber).mean(dim=2).sum(dim=1).mean()
    loss_dn = online.q_denoise(online.fixed_quantiles(out).reshape(B, -1), q_target)
    budget = online.risk(out.detach(), isv, r)
    pnl = budget * (action - 1).to(budget.dtype) * batch["next_return"]
    loss_risk = -(pnl - 0.5 * cfg.risk_aversion * pnl.square()).mean()
    total = loss_iqn + cfg.denoise_weight * loss_dn + loss_c + loss_risk
    td_error = (T.mean(dim=1) - z.detach().mean(dim=1)).abs().mean()
    return torch.stack([total, loss_iqn.detach(), loss_dn.detach(), loss_c.detach(), loss_risk.detach(),
                        td_error, z.detach().mean()])


class Learner:
    """The online agent, its target network (a copy, updated every cfg.target_every steps) and
    Adam (capturable on CUDA, so that a step can be captured in a CUDA graph).

    `step(batch)` is one learner step on a batch (a replay sample with its levels): forward,
    backward, Adam; it returns the METRICS vector without a host synchronisation.
    `compile(mode)` runs the losses under torch.compile (the torch backend's peer);
    `capture(batch)` records one step in a CUDA graph whose replays step on the tensors given
    (copy a new batch into them first: `GraphStep`)."""

    def __init__(self, agent: Agent, cfg: TrainConfig, isv: Tensor):
        self.online, self.cfg = agent, cfg
        self.target = copy.deepcopy(agent).requires_grad_(False)
        self.isv = isv
        device = next(agent.parameters()).device
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr, capturable=device.type == "cuda")
        self.updates = 0
        self.loss_fn: Callable[..., Tensor] = losses  # compile() and distributed.distribute() replace it

    def compile(self, mode: str) -> None:
        self.loss_fn = torch.compile(losses, mode=mode, dynamic=False)

    def step(self, batch: dict[str, Tensor]) -> Tensor:
        B, parts = batch["action"].shape[0], self.cfg.micro_batches
        if B % parts:
            raise ValueError(f"Learner.step: the batch ({B}) must split into micro_batches={parts} equal parts")
        self.optimizer.zero_grad(set_to_none=True)
        metrics = []
        for index in range(parts):
            part = {name: t[index * B // parts:(index + 1) * B // parts] for name, t in batch.items()}
            if parts > 1:  # a slice may start off the 16 bytes foxcute's kernels take (the curiosity kernel's actions)
                part["action"] = part["action"].clone()
            m = self.loss_fn(self.online, self.target, part, self.isv, self.cfg) / parts
            m[0].backward()
            metrics.append(m.detach())
        self.optimizer.step()
        return torch.stack(metrics).sum(dim=0)

    def after_step(self) -> None:
        """Counts a learner step; copies the online weights into the target network every
        cfg.target_every steps (outside any captured graph: a host decision)."""
        self.updates += 1
        if self.updates % self.cfg.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())

    def capture(self, batch: dict[str, Tensor]) -> "GraphStep":
        return GraphStep(self, batch)


class GraphStep:
    """One learner step captured in a CUDA graph (torch.cuda.graph's recipe: three warm-up
    steps on a side stream, which also fill Adam's state, then the capture). `__call__(batch)`
    copies the batch into the captured inputs and replays: the same update as Learner.step on
    that batch. The warm-up steps train: capture a learner whose state may change, or a copy."""

    def __init__(self, learner: Learner, batch: dict[str, Tensor], warmup: int = 3):
        self.learner = learner
        self.inputs = {name: t.clone() for name, t in batch.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                learner.step(self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.metrics = learner.step(self.inputs)

    def replay(self) -> Tensor:
        self.graph.replay()
        return self.metrics

    def __call__(self, batch: dict[str, Tensor]) -> Tensor:
        for name, t in batch.items():
            self.inputs[name].copy_(t)
        return self.replay()


@dataclasses.dataclass
class Run:
    """A run's curves (CURVES, one value per learner step; "train_reward" is the mean extrinsic
    reward of that step's acting), its final parameters (one flat vector), and its held-out
    result: each path's total reward and their mean."""

    curves: dict[str, np.ndarray]
    params: np.ndarray
    eval_return: float
    eval_returns: np.ndarray


class Trainer:
    """Acting in a training market and learning from the replay, one learner step per step of
    acting in every path. `run()` returns a `Run`; `evaluate(market)` the greedy policy's return
    on other paths.

    Acting at step t in n_envs paths: the online trunk's out_t, the risk budget b_t from
    (out_t, the signal vector, e_t), e_t the curiosity error of each path's previous transition
    (0 at the first); epsilon-greedy over Q(out_t); position x_t = (a_t - 1) b_t; reward
    market.reward(x_t, x_{t-1}, r_{t+1}, cost). The paths start flat. `held_out` is the
    market `run()` evaluates the final policy on."""

    def __init__(self, learner: Learner, train_market: market_module.Market, held_out: market_module.Market):
        cfg, sizes = learner.cfg, learner.online.sizes
        if train_market.n_paths < cfg.n_envs:
            raise ValueError(f"Trainer: the training market has {train_market.n_paths} paths, fewer than "
                             f"n_envs={cfg.n_envs}")
        self.warmup = cfg.warmup_steps(sizes.B)
        needed = train_market.first_step + self.warmup + cfg.steps - 1  # the last step acted at
        if train_market.last_step < needed:
            raise ValueError(f"Trainer: the training paths must be at least {needed + 2} steps long for "
                             f"{self.warmup} warm-up and {cfg.steps} learner steps at K={sizes.K}, got "
                             f"{train_market.returns.shape[1]}")
        self.learner, self.market, self.held_out = learner, train_market, held_out
        self.device = next(learner.online.parameters()).device
        self.generator = torch.Generator(self.device).manual_seed(cfg.seed)
        self.replay = Replay((self.warmup + cfg.steps) * cfg.n_envs, sizes.K, self.device)
        self.t = train_market.first_step  # the market step acted at next
        self.state = {"position": torch.zeros(cfg.n_envs, device=self.device),
                      "surprise": torch.zeros(cfg.n_envs, device=self.device)}

    def _tensor(self, array: np.ndarray, n: int) -> Tensor:
        """The first n rows of a market array on the learner's device. To a GPU the copy goes
        through pinned memory without blocking: a copy from pageable memory would make the host
        wait for the device three times per acting step."""
        host = torch.from_numpy(np.ascontiguousarray(array[:n]))
        if self.device.type != "cuda":
            return host.to(self.device)
        # The caching host allocator keeps the pinned block until the copy has run.
        return host.pin_memory().to(self.device, non_blocking=True)

    def _policy(self, agent: Agent, obs: Tensor, position: Tensor, surprise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(out, greedy action, risk budget) of the current states."""
        out = agent.trunk(obs, position)
        budget = agent.risk(out, self.learner.isv, surprise)
        return out, agent.q_values(out).argmax(dim=1), budget

    @torch.no_grad()
    def _act(self, epsilon: float) -> Tensor:
        """One step of acting at market step self.t in every path; adds the transitions to the
        replay, moves on to the next step and returns the mean extrinsic reward."""
        agent, n, t, state = self.learner.online, self.learner.cfg.n_envs, self.t, self.state
        obs, next_obs = self._tensor(self.market.observation(t), n), self._tensor(self.market.observation(t + 1), n)
        out, greedy, budget = self._policy(agent, obs, state["position"], state["surprise"])
        explore = torch.rand(n, generator=self.generator, device=self.device) < epsilon
        random_action = torch.randint(0, 3, (n,), generator=self.generator, device=self.device)
        action = torch.where(explore, random_action, greedy)
        position = (action - 1).to(budget.dtype) * budget
        next_return = self._tensor(self.market.next_return(t), n)
        reward = market_module.reward(position, state["position"], next_return, self.learner.cfg.cost)
        self.replay.add(dict(obs=obs, prev_position=state["position"], action=action, reward=reward,
                             next_return=next_return, next_obs=next_obs, position=position))
        _, surprise = agent.curiosity(out, action, agent.trunk(next_obs, position))
        state["position"], state["surprise"] = position, surprise
        self.t += 1
        return reward.mean()

    def batch(self) -> dict[str, Tensor]:
        """A replay sample with its quantile levels: one learner step's input."""
        B, Q = self.learner.online.sizes.B, self.learner.online.sizes.Q
        return {**self.replay.sample(B, self.generator), **draw_levels(B, Q, self.generator)}

    def fill(self) -> None:
        """The warm-up: acting with epsilon 1 until the replay holds one batch (idempotent)."""
        while self.t < self.market.first_step + self.warmup:
            self._act(1.0)

    def run(self, learn: Callable[[dict[str, Tensor]], Tensor] | None = None) -> Run:
        """The warm-up, then cfg.steps rounds of acting and one learner step, then the final
        policy evaluated on the held-out paths. `learn` replaces learner.step (e.g. a
        GraphStep). The host waits for the device only at the end."""
        cfg = self.learner.cfg
        learn = learn or self.learner.step
        self.fill()
        rows = []
        for index in range(cfg.steps):
            train_reward = self._act(cfg.epsilon(index))
            rows.append(torch.cat([learn(self.batch()), train_reward[None]]))
            self.learner.after_step()
        table = torch.stack(rows).cpu().numpy()
        curves = {name: table[:, i] for i, name in enumerate(CURVES)}
        returns = self.evaluate(self.held_out)
        return Run(curves, flat_parameters(self.learner.online), float(returns.mean()), returns)

    @torch.no_grad()
    def evaluate(self, held_out: market_module.Market) -> np.ndarray:
        """Each held-out path's total extrinsic reward under the greedy policy (no exploration),
        from flat at its first decision step to its last."""
        agent, n = self.learner.online, held_out.n_paths
        position = torch.zeros(n, device=self.device)
        surprise = torch.zeros(n, device=self.device)
        total = torch.zeros(n, dtype=torch.float64, device=self.device)
        for t in range(held_out.first_step, held_out.last_step + 1):
            obs, next_obs = self._tensor(held_out.observation(t), n), self._tensor(held_out.observation(t + 1), n)
            out, action, budget = self._policy(agent, obs, position, surprise)
            new_position = (action - 1).to(budget.dtype) * budget
            total += market_module.reward(new_position, position, self._tensor(held_out.next_return(t), n),
                                          self.learner.cfg.cost)
            _, surprise = agent.curiosity(out, action, agent.trunk(next_obs, new_position))
            position = new_position
        return total.cpu().numpy()


def flat_parameters(module: torch.nn.Module) -> np.ndarray:
    """Every parameter, flattened and concatenated in named_parameters order, float64 on the host."""
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in module.parameters()]).numpy()
