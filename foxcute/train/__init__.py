"""A training run (issue 32): a DQN-shaped trading agent built from foxcute's layers, trained
against the same agent in plain PyTorch.

- `market`: the synthetic trading task (seeded regime-switching price paths, features, reward,
  held-out paths); NumPy only.
- `agent`: the agent (Mamba2 trunk, KAN and IQN quantile head, Q-denoise, curiosity, risk
  budget), backend "foxcute" (foxcute.torch.modules) or "torch" (foxcute.peers' math), one
  set of parameters for both.
- `dqn`: replay buffer, target network, the losses, the learner step (eager, compiled, or
  captured in a CUDA graph), acting, training and evaluation.
- `experiment`: the setups compared (foxcute, torch with TF32 on and off, torch with a split
  batch) and the drift between their runs.

Imports torch (the torch extra); `import foxcute` does not import this package.
"""
