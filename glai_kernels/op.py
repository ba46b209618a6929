"""The one op: `glai::estimator`, its backward op, fake implementations and autograd.

Every backend runs behind these two custom ops, so autograd, torch.compile and opcheck see
one contract whatever computes it. The ops take the backend's name as a string argument;
the public `estimator` resolves "auto" and $GLAI_BACKEND to a concrete name first, so a
forward and its backward always run on the same backend.

Like aten's native_layer_norm, the forward op returns a second tensor, `saved`, that only
its backward reads: empty unless `save` is true and the backend has a `forward_saving`.
"""

from __future__ import annotations

import torch

from glai_kernels import registry
from glai_kernels.contract import Shape, accumulation_dtype, check_inputs


def _is_empty(shape: Shape) -> bool:
    return 0 in (shape.batch, shape.inputs, shape.paths, shape.outputs)


def _checked(impl: registry.Backend, what: str, result: torch.Tensor | None,
             shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A backend's result, contiguous, once its shape and dtype are what the contract says."""
    if result is None or tuple(result.shape) != shape or result.dtype != dtype:
        got = "nothing" if result is None else f"{result.dtype} {list(result.shape)}"
        raise RuntimeError(
            f"backend {impl.name!r} returned {got} for {what}, expected {dtype} {list(shape)}")
    return result.contiguous()


def _saves(impl: registry.Backend, shape: Shape, save: bool) -> bool:
    return save and impl.forward_saving is not None and not _is_empty(shape)


@torch.library.custom_op("glai::estimator", mutates_args=())
def estimator_op(
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
    save: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, O], saved) on the named backend; y = sum_{i,s} x[b,i] act[b,s] w[o,i,s] + bias."""
    shape = check_inputs(x, act, weight, bias)
    impl = registry.resolve(backend, x.device, x.dtype)
    saved = x.new_empty(0)
    if _is_empty(shape):
        # An empty sum is zero; no backend needs to see a zero-sized launch.
        y = x.new_zeros(shape.batch, shape.outputs)
    else:
        args = (x.contiguous(), act.contiguous(), weight.contiguous())
        if _saves(impl, shape, save):
            y, saved = impl.forward_saving(*args)
            saved = saved.contiguous()
        else:
            y = impl.forward(*args)
        y = _checked(impl, "y", y, (shape.batch, shape.outputs), x.dtype)
    if bias is not None:
        y = y + bias
    return y, saved


@estimator_op.register_fake
def _estimator_fake(x, act, weight, bias, backend, save=False):
    shape = check_inputs(x, act, weight, bias)
    saved = x.new_empty(0)
    if backend != registry.AUTO:
        impl = registry.get(backend)
        if _saves(impl, shape, save):
            saved = x.new_empty(impl.saved_shape(shape))
    return x.new_empty(shape.batch, shape.outputs), saved


@torch.library.custom_op("glai::estimator_backward", mutates_args=())
def estimator_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    saved: torch.Tensor,
    needs: list[bool],
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [B, I], dact [B, P], dweight [O, I, P]) for dy [B, O]; a gradient not in `needs`
    comes back as an empty tensor of shape [0] (custom ops cannot return None)."""
    shape = check_inputs(x, act, weight)
    need_x, need_act, need_weight = (bool(n) for n in needs)
    impl = registry.resolve(backend, x.device, x.dtype)
    if _is_empty(shape):
        grads = (torch.zeros_like(x) if need_x else None,
                 torch.zeros_like(act) if need_act else None,
                 torch.zeros_like(weight) if need_weight else None)
    else:
        args = (dy.contiguous(), x.contiguous(), act.contiguous(), weight.contiguous(),
                (need_x, need_act, need_weight))
        computed = impl.backward(*args, saved=saved) if saved.numel() else impl.backward(*args)
        grads = tuple(
            _checked(impl, f"d{name}", g, tuple(t.shape), x.dtype) if need else None
            for name, g, t, need in zip(("x", "act", "weight"), computed, (x, act, weight),
                                        (need_x, need_act, need_weight), strict=True))
    # a fresh empty tensor per missing gradient: outputs of a custom op may not alias
    return tuple(g if g is not None else x.new_empty(0) for g in grads)  # type: ignore[return-value]


@estimator_backward_op.register_fake
def _estimator_backward_fake(dy, x, act, weight, saved, needs, backend):
    check_inputs(x, act, weight)
    return tuple(t.new_empty(t.shape) if need else t.new_empty(0)
                 for t, need in zip((x, act, weight), needs, strict=True))


def _setup_context(ctx, inputs, output):
    x, act, weight, _bias, backend, *_ = inputs
    saved = output[1]
    ctx.mark_non_differentiable(saved)
    ctx.save_for_backward(x, act, weight, saved)
    ctx.backend = backend


def _backward(ctx, dy, _dsaved):
    x, act, weight, saved = ctx.saved_tensors
    need_x, need_act, need_weight, need_bias = ctx.needs_input_grad[:4]
    dx = dact = dweight = dbias = None
    if need_x or need_act or need_weight:
        gx, gact, gweight = estimator_backward_op(
            dy, x, act, weight, saved, [need_x, need_act, need_weight], ctx.backend)
        dx = gx if need_x else None
        dact = gact if need_act else None
        dweight = gweight if need_weight else None
    if need_bias:
        dbias = dy.sum(0, dtype=accumulation_dtype(dy.dtype)).to(dy.dtype)
    return dx, dact, dweight, dbias, None, None


estimator_op.register_autograd(_backward, setup_context=_setup_context)


def estimator(
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """The GLAI estimator: y[b, o] = sum_i sum_s x[b, i] * act[b, s] * weight[o, i, s] + bias[o].

    Args:
        x: [B, I] inputs.
        act: [B, P] path activations (0/1 from the selector, or any real soft gate).
        weight: [O, I, P] path weights.
        bias: optional [O].
        backend: a registered backend name or "auto"; None means $GLAI_BACKEND, else "auto".

    Returns:
        y: [B, O], the inputs' dtype. Differentiable in x, act, weight and bias.
    """
    check_inputs(x, act, weight, bias)
    impl = registry.resolve(backend, x.device, x.dtype)
    save = torch.is_grad_enabled() and act.requires_grad
    y, _ = estimator_op(x, act, weight, bias, impl.name, save)
    return y
