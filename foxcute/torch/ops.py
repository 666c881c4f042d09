"""Every layer pass of foxcute as a PyTorch operator (`torch.ops.foxcute.<name>`), with its fake
(shape-only) implementation and, for the passes a module differentiates, its autograd formula.

    mamba2_forward(h_hist, h, W_A, W_B, W_C, w, sigma, impl, precision) -> out
    mamba2_backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma, impl, precision)
        -> (dW_A, dW_B, dW_C, dw, dsigma, dh_hist, dh)
    q_denoise_loss_and_grads(q, q_target, W1, b1, W2, b2, precision) -> (loss, dW1, db1, dW2, db2, dq)
    column_sum(G) -> out
    kan_forward(x, C, Wb, precision) -> y
    kan_backward(dy, x, C, Wb, precision) -> (dC, dWb, dx)
    curiosity_forward_backward(s, a, s_next, W1, b1, W2, b2, precision)
        -> (loss, r, dW1, db1, dW2, db2, ds)
    risk_budget_forward(h, isv, e, W1, b1, w2, b2, precision) -> risk

Where they run: the device of the first tensor argument decides. On CUDA an operator calls
foxcute's public function with backend="cute" on the tensors as they are, so every input is
validated first (FoxcuteInputError naming the argument, before any launch) and the kernels
launch on torch's current stream, fetched at call time: the operators can be captured in a
CUDA graph. On the CPU it calls the same function with backend="reference" on the tensors'
NumPy views (float64 math, the same validation) and returns float32 tensors: slow, exact, and
what makes the modules usable and testable without a GPU. `impl` and `precision` are checked
on both and ignored by the reference.

Outputs are fresh float32 tensors (custom_op forbids returning an input or two outputs that
share memory: the kernels return some gradients and losses as views of one buffer, which are
cloned here, a few small arrays); losses and dsigma are 0-dim. Differences from the public functions, each forced by
graph capture (a host read synchronises the device):

- curiosity: the action indices are not read back to check their range on CUDA unless the
  environment variable FOXCUTE_CHECK_ACTIONS=1 (read at each call); the CPU always checks.
- risk_budget: b2 is a one-element tensor (a trainable parameter lives on the device), while
  the kernel takes b2 as a launch argument. The kernel runs with b2 = 0, giving
  s = sigmoid(t), and the operator shifts the logit on the device:
  sigmoid(t + b2) = s / (s + (1 - s) * exp(-b2)), an identity, exact to float32 rounding
  except where s has rounded to 1 (t > 17 in float32), which stays 1.
- mamba2: sigma is a float (the trainer's stability signal), a launch argument: a captured
  graph replays the value it was captured with, and autograd gives it no gradient (the
  backward operator returns dsigma for a caller that wants it).

Autograd: mamba2_forward's backward is the mamba2_backward operator (recomputed from the
inputs, nothing else saved), kan_forward's is kan_backward; the loss operators (Q-denoise,
curiosity) compute their gradients in the forward, so their backward scales the saved
gradients by the incoming gradient of the loss (every other output is marked
non-differentiable: r carries no gradient); risk_budget_forward's backward is PyTorch ops on
the math of docs/layers.md section 6 (foxcute has no backward kernel for it).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .. import curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from .._arrays import FoxcuteInputError, env_flag

CHECK_ACTIONS_ENV = "FOXCUTE_CHECK_ACTIONS"

# the operators' return types, spelled out: custom_op infers each schema from the annotations
Tensors3 = tuple[Tensor, Tensor, Tensor]
Tensors6 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Tensors7 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


def _call(layer_fn: Callable, tensors: Sequence[Tensor], **options: Any) -> Any:
    """layer_fn (a foxcute public function) on the tensors: backend "cute" on the tensors when
    the first is on CUDA, else backend "reference" on the CPU tensors' NumPy views (any other
    tensor is passed as it is, for the reference's check to name it)."""
    if tensors[0].device.type == "cuda":
        return layer_fn(*tensors, backend="cute", **options)
    arrays = [t.detach().numpy() if t.device.type == "cpu" else t for t in tensors]
    return layer_fn(*arrays, backend="reference", **options)


def _outputs(values: Sequence[Any], scalars: Sequence[int] = ()) -> tuple[Tensor, ...]:
    """A pass's results as fresh float32 tensors: the reference's NumPy arrays and floats
    converted; the kernels' tensors kept, but cloned where one shares memory with an earlier
    output (custom_op rejects aliased outputs) or starts past its storage's first element (the
    fake implementations' outputs start at 0, and opcheck holds the real ones to that); those
    at the indices in `scalars` (1-element losses, dsigma) made 0-dim."""
    out, storages = [], set()
    for index, value in enumerate(values):
        if not torch.is_tensor(value):
            out.append(torch.from_numpy(np.array(value, dtype=np.float32)))
            continue
        if index in scalars:
            value = value.reshape(())
        storage = value.untyped_storage().data_ptr()
        if storage in storages or value.storage_offset():
            value = value.clone()
        else:
            storages.add(storage)  # memory a kept output owns
        out.append(value)
    return tuple(out)


def _new(like: Tensor, shape: Sequence[Any]) -> Tensor:
    return like.new_empty(tuple(shape), dtype=torch.float32)


# ---------------------------------------------------------------- Mamba2 (docs/layers.md section 1)


@torch.library.custom_op("foxcute::mamba2_forward", mutates_args=())
def mamba2_forward(h_hist: Tensor, h: Tensor, W_A: Tensor, W_B: Tensor, W_C: Tensor, w: Tensor,
                   sigma: float, impl: str, precision: str) -> Tensor:
    """out [B, SH2] = h + ctx[:, None] * w[None, :] (foxcute.mamba2.forward)."""
    out = _call(mamba2.forward, (h_hist, h, W_A, W_B, W_C, w), sigma=sigma, impl=impl, precision=precision)
    return _outputs([out])[0]


@mamba2_forward.register_fake
def _(h_hist, h, W_A, W_B, W_C, w, sigma, impl, precision):
    return _new(h, h.shape)


@torch.library.custom_op("foxcute::mamba2_backward", mutates_args=())
def mamba2_backward(dout: Tensor, h_hist: Tensor, h: Tensor, W_A: Tensor, W_B: Tensor, W_C: Tensor,
                    w: Tensor, sigma: float, impl: str, precision: str) -> Tensors7:
    """(dW_A, dW_B, dW_C, dw, dsigma 0-dim, dh_hist, dh): the gradients of sum(dout * out)
    (foxcute.mamba2.backward)."""
    grads = _call(mamba2.backward, (dout, h_hist, h, W_A, W_B, W_C, w), sigma=sigma, impl=impl,
                  precision=precision)
    return _outputs(grads, scalars=(4,))


@mamba2_backward.register_fake
def _(dout, h_hist, h, W_A, W_B, W_C, w, sigma, impl, precision):
    return (_new(W_A, W_A.shape), _new(W_B, W_B.shape), _new(W_C, W_C.shape), _new(w, w.shape),
            _new(h, ()), _new(h_hist, h_hist.shape), _new(h, h.shape))


def _mamba2_setup(ctx, inputs, output):
    *tensors, ctx.sigma, ctx.impl, ctx.precision = inputs
    ctx.save_for_backward(*tensors)


def _mamba2_backward(ctx, dout):
    h_hist, h, W_A, W_B, W_C, w = ctx.saved_tensors
    dW_A, dW_B, dW_C, dw, _, dh_hist, dh = mamba2_backward(dout.contiguous(), h_hist, h, W_A, W_B, W_C, w,
                                                           ctx.sigma, ctx.impl, ctx.precision)
    return dh_hist, dh, dW_A, dW_B, dW_C, dw, None, None, None


mamba2_forward.register_autograd(_mamba2_backward, setup_context=_mamba2_setup)


# ---------------------------------------------------------------- Q-denoise (section 2)


@torch.library.custom_op("foxcute::q_denoise_loss_and_grads", mutates_args=())
def q_denoise_loss_and_grads(q: Tensor, q_target: Tensor, W1: Tensor, b1: Tensor, W2: Tensor, b2: Tensor,
                             precision: str) -> Tensors6:
    """(loss 0-dim, dW1, db1, dW2, db2, dq) (foxcute.q_denoise.loss_and_grads)."""
    loss, grads = _call(q_denoise.loss_and_grads, (q, q_target, W1, b1, W2, b2), precision=precision)
    return _outputs([loss, *grads], scalars=(0,))


@q_denoise_loss_and_grads.register_fake
def _(q, q_target, W1, b1, W2, b2, precision):
    return _new(q, ()), _new(W1, W1.shape), _new(b1, b1.shape), _new(W2, W2.shape), _new(b2, b2.shape), _new(q, q.shape)


def _q_denoise_setup(ctx, inputs, output):
    _, *grads = output
    ctx.mark_non_differentiable(*grads)
    ctx.save_for_backward(*grads)


def _q_denoise_backward(ctx, dloss, *_):
    dW1, db1, dW2, db2, dq = (dloss * g for g in ctx.saved_tensors)
    return dq, None, dW1, db1, dW2, db2, None  # q_target is a target: no gradient


q_denoise_loss_and_grads.register_autograd(_q_denoise_backward, setup_context=_q_denoise_setup)


# ---------------------------------------------------------------- column sum (section 3)


@torch.library.custom_op("foxcute::column_sum", mutates_args=())
def column_sum(G: Tensor) -> Tensor:
    """out [N] = sum over the rows of G [M, N], in a fixed order (foxcute.column_sum)."""
    return _outputs([_call(reduction.column_sum, (G,))])[0]


@column_sum.register_fake
def _(G):
    return _new(G, G.shape[1:])


# ---------------------------------------------------------------- KAN (section 4)


@torch.library.custom_op("foxcute::kan_forward", mutates_args=())
def kan_forward(x: Tensor, C: Tensor, Wb: Tensor, precision: str) -> Tensor:
    """y [B, O] = phi(x) @ C^T + silu(x) @ Wb^T (foxcute.kan.forward)."""
    return _outputs([_call(kan.forward, (x, C, Wb), precision=precision)])[0]


@kan_forward.register_fake
def _(x, C, Wb, precision):
    return _new(x, (x.shape[0], C.shape[0]))


@torch.library.custom_op("foxcute::kan_backward", mutates_args=())
def kan_backward(dy: Tensor, x: Tensor, C: Tensor, Wb: Tensor, precision: str) -> Tensors3:
    """(dC, dWb, dx): the gradients of sum(dy * y) (foxcute.kan.backward)."""
    return _outputs(_call(kan.backward, (dy, x, C, Wb), precision=precision))


@kan_backward.register_fake
def _(dy, x, C, Wb, precision):
    return _new(C, C.shape), _new(Wb, Wb.shape), _new(x, x.shape)


def _kan_setup(ctx, inputs, output):
    x, C, Wb, ctx.precision = inputs
    ctx.save_for_backward(x, C, Wb)


def _kan_backward(ctx, dy):
    x, C, Wb = ctx.saved_tensors
    dC, dWb, dx = kan_backward(dy.contiguous(), x, C, Wb, ctx.precision)
    return dx, dC, dWb, None


kan_forward.register_autograd(_kan_backward, setup_context=_kan_setup)


# ---------------------------------------------------------------- curiosity (section 5)


@torch.library.custom_op("foxcute::curiosity_forward_backward", mutates_args=())
def curiosity_forward_backward(s: Tensor, a: Tensor, s_next: Tensor, W1: Tensor, b1: Tensor, W2: Tensor,
                               b2: Tensor, precision: str) -> Tensors7:
    """(loss 0-dim, r [B], dW1, db1, dW2, db2, ds) (foxcute.curiosity.forward_backward). On
    CUDA the action range is checked only with FOXCUTE_CHECK_ACTIONS=1 (a host read)."""
    check_actions = s.device.type != "cuda" or env_flag(CHECK_ACTIONS_ENV)
    loss, r, grads = _call(curiosity.forward_backward, (s, a, s_next, W1, b1, W2, b2), precision=precision,
                           check_actions=check_actions)
    return _outputs([loss, r, *grads], scalars=(0,))


@curiosity_forward_backward.register_fake
def _(s, a, s_next, W1, b1, W2, b2, precision):
    return (_new(s, ()), _new(s, s.shape[:1]), _new(W1, W1.shape), _new(b1, b1.shape), _new(W2, W2.shape),
            _new(b2, b2.shape), _new(s, s.shape))


def _curiosity_setup(ctx, inputs, output):
    _, r, *grads = output
    ctx.mark_non_differentiable(r, *grads)
    ctx.save_for_backward(*grads)


def _curiosity_backward(ctx, dloss, *_):
    dW1, db1, dW2, db2, ds = (dloss * g for g in ctx.saved_tensors)
    return ds, None, None, dW1, db1, dW2, db2, None  # none for the next state or the actions


curiosity_forward_backward.register_autograd(_curiosity_backward, setup_context=_curiosity_setup)


# ---------------------------------------------------------------- risk budget head (section 6)


@torch.library.custom_op("foxcute::risk_budget_forward", mutates_args=())
def risk_budget_forward(h: Tensor, isv: Tensor, e: Tensor, W1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                        precision: str) -> Tensor:
    """risk [B] = sigmoid(relu([h, isv, e] @ W1^T + b1) @ w2 + b2) (foxcute.risk_budget.forward),
    b2 a one-element tensor on h's device (see the module docstring for how CUDA applies it)."""
    if b2.numel() != 1 or b2.device != h.device:
        raise FoxcuteInputError(f"foxcute.risk_budget.forward: argument 'b2' must be a one-element tensor on "
                                f"{h.device} (h's device), got shape {tuple(b2.shape)} on {b2.device}")
    if h.device.type != "cuda":
        return _outputs([_call(risk_budget.forward, (h, isv, e, W1, b1, w2), b2=float(b2), precision=precision)])[0]
    return shift_logit(_call(risk_budget.forward, (h, isv, e, W1, b1, w2), b2=0.0, precision=precision), b2)


def risk_b2(value: float, h: Tensor) -> Tensor:
    """The risk head's b2 as risk_budget_forward takes it, from a Python float: a 0-dim
    float32 tensor on h's device."""
    return torch.full((), float(value), dtype=torch.float32, device=h.device)


def shift_logit(s: Tensor, b: Tensor) -> Tensor:
    """sigmoid(t + b) from s = sigmoid(t), on the device: s / (s + (1 - s) * exp(-b)), b a
    one-element tensor. Exact to float32 rounding except where s has rounded to 1."""
    return s / (s + (1.0 - s) * torch.exp(-b.reshape(())))


@risk_budget_forward.register_fake
def _(h, isv, e, W1, b1, w2, b2, precision):
    return _new(h, h.shape[:1])


def _risk_setup(ctx, inputs, output):
    *tensors, _ = inputs
    ctx.save_for_backward(*tensors, output)


def _risk_backward(ctx, drisk):
    # docs/layers.md section 6.2 with W1 split into its h, isv and e columns. The hidden layer
    # is recomputed (only the inputs and risk are saved), in float64: the ReLU mask z > 0
    # decides whole entries of dz, and a float32 z flips the sign of the entries within its
    # rounding of 0 (about one in 10^6 at the defaults, B*H = 5*10^5 entries), each flip moving
    # dW1 and dh by about 1/sqrt(B*H/2) = 2e-3 relative (the curiosity mask of docs/layers.md
    # section 5.4). One [B, SH2] x [SH2, H] product in float64 is the price.
    h, isv, e, W1, b1, w2, b2, risk = ctx.saved_tensors
    width = h.shape[1]
    W_h, W_isv, w_e = W1[:, :width], W1[:, width:-1], W1[:, -1]
    wide = torch.float64
    z = (h.to(wide) @ W_h.T.to(wide) + (W_isv.to(wide) @ isv.to(wide) + b1.to(wide))
         + e.to(wide)[:, None] * w_e.to(wide))
    hid = torch.relu(z).to(h.dtype)
    dt = drisk * risk * (1.0 - risk)  # through the sigmoid
    dz = dt[:, None] * w2 * (z > 0)
    dz_sum = dz.sum(dim=0)
    dW1 = torch.cat([dz.T @ h, dz_sum[:, None] * isv, (dz.T @ e)[:, None]], dim=1)
    return dz @ W_h, W_isv.T @ dz_sum, dz @ w_e, dW1, dz_sum, hid.T @ dt, dt.sum().reshape(b2.shape), None


risk_budget_forward.register_autograd(_risk_backward, setup_context=_risk_setup)
