"""The sparse op: `glai::sparse_estimator`, its backward op, fakes and autograd.

As glai_kernels/op.py for the dense op: every sparse backend runs behind these two custom
ops, which take the values, the ten KeptIndex tensors (as a list, in KeptIndex order) and
the backend's name; the public `estimator` resolves "auto" and $GLAI_BACKEND first, so a
forward and its backward run on one backend. The forward returns `saved`, the group sums
Zg [B, G] (layout.py), when `save` is true and the backend has a forward_saving; else an
empty tensor. `save` has no default on purpose: the dispatcher drops an argument equal to
its default, and the autograd wrapper for an op with a list input then expects one fewer
gradient.
"""

from __future__ import annotations

import os

import torch

from glai_kernels import calls
from glai_kernels.contract import accumulation_dtype, bias_gradient
from glai_kernels.registry import AUTO, ENV_VAR, Backend
from glai_kernels.sparse.contract import as_index, check_inputs
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, SparseShape
from glai_kernels.sparse.weight import SparsePathWeight


def _is_empty(shape: SparseShape) -> bool:
    return 0 in (shape.batch, shape.inputs, shape.paths, shape.outputs, shape.nnz)




@torch.library.custom_op("glai::sparse_estimator", mutates_args=())
def sparse_estimator_op(
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: list[torch.Tensor],
    bias: torch.Tensor | None,
    backend: str,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, O], saved) on the named sparse backend."""
    shape = check_inputs(x, act, values, index, bias, weight_name="values")
    impl = SPARSE_ESTIMATOR.resolve(backend, x.device, x.dtype)
    saved = x.new_empty(0)
    if _is_empty(shape):
        y = x.new_zeros(shape.batch, shape.outputs)  # an empty sum is zero
    else:
        args = (x.contiguous(), act.contiguous(), values.contiguous(),
                as_index([t.contiguous() for t in index]))
        keep = calls.saves(impl, save, empty=False)
        y, kept = calls.forward(impl, args, (shape.batch, shape.outputs), x.dtype,
                                impl.saved_shape(shape) if keep else None)
        saved = kept if kept is not None else saved
    if bias is not None:
        y = y + bias
    return y, saved


@sparse_estimator_op.register_fake
def _sparse_fake(x, act, values, index, bias, backend, save):
    shape = check_inputs(x, act, values, index, bias, weight_name="values")
    saved = x.new_empty(0)
    if backend != AUTO:
        impl = SPARSE_ESTIMATOR.get(backend)
        if calls.saves(impl, save, _is_empty(shape)):
            saved = x.new_empty(impl.saved_shape(shape), dtype=accumulation_dtype(x.dtype))
    return x.new_empty(shape.batch, shape.outputs), saved


@torch.library.custom_op("glai::sparse_estimator_backward", mutates_args=())
def sparse_estimator_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: list[torch.Tensor],
    saved: torch.Tensor,
    needs: list[bool],
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [B, I], dact [B, P], dvalues [K]) for dy [B, O]; a gradient not in `needs` comes
    back as an empty tensor of shape [0] (custom ops cannot return None)."""
    shape = check_inputs(x, act, values, index, weight_name="values")
    impl = SPARSE_ESTIMATOR.resolve(backend, x.device, x.dtype)
    args = (dy.contiguous(), x.contiguous(), act.contiguous(), values.contiguous(),
            as_index([t.contiguous() for t in index]))
    return calls.backward(  # type: ignore[return-value]
        impl, args, saved, (("x", x), ("act", act), ("values", values)), needs,
        _is_empty(shape))


@sparse_estimator_backward_op.register_fake
def _sparse_backward_fake(dy, x, act, values, index, saved, needs, backend):
    check_inputs(x, act, values, index, weight_name="values")
    return tuple(t.new_empty(t.shape) if need else t.new_empty(0)
                 for t, need in zip((x, act, values), needs, strict=True))


def _setup_context(ctx, inputs, output):
    x, act, values, index, _bias, backend, *_ = inputs
    saved = output[1]
    ctx.mark_non_differentiable(saved)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for Zg (the dense op's reason)
    ctx.save_for_backward(x, act, values, saved, *index)
    ctx.backend = backend


def _backward(ctx, dy, _dsaved):
    x, act, values, saved, *index = ctx.saved_tensors
    no_index_grads = [None] * len(index)  # a list input takes a list of (no) gradients
    need_x, need_act, need_values, _, need_bias = ctx.needs_input_grad[:5]
    dx = dact = dvalues = dbias = None
    if dy is None:  # y reached no loss: every gradient is None
        return dx, dact, dvalues, no_index_grads, dbias, None, None
    if need_x or need_act or need_values:
        gx, gact, gvalues = sparse_estimator_backward_op(
            dy, x, act, values, index, saved, [need_x, need_act, need_values], ctx.backend)
        dx = gx if need_x else None
        dact = gact if need_act else None
        dvalues = gvalues if need_values else None
    if need_bias:
        dbias = bias_gradient(dy)
    return dx, dact, dvalues, no_index_grads, dbias, None, None


sparse_estimator_op.register_autograd(_backward, setup_context=_setup_context)


def estimator(
    x: torch.Tensor,
    act: torch.Tensor,
    sw: SparsePathWeight,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """The estimator on a kept-path weight: y[b, o] = sum_k v[k] x[b, i_k] act[b, s_k] + bias[o].

    Args:
        x: [B, I] inputs.
        act: [B, P] path activations (0/1 gates or soft gates).
        sw: the kept-path weight (`from_dense(weight, mask)`), shape (O, I, P), values [K].
        bias: optional [O].
        backend: a registered sparse backend name or "auto"; None means $GLAI_BACKEND
            (which must then name a sparse backend), else "auto".

    Returns:
        y: [B, O], the inputs' dtype; differentiable in x, act, sw.values and bias.
    """
    if not isinstance(sw, SparsePathWeight):
        raise TypeError(f"sparse estimator: sw must be a SparsePathWeight (glai_kernels.sparse."
                        f"from_dense(weight, mask)), got {type(sw).__name__}")
    return run_resolved(x, act, sw, bias, None, backend)


def run_resolved(x: torch.Tensor, act: torch.Tensor, sw: SparsePathWeight,
                 bias: torch.Tensor | None, impl: Backend | None,
                 backend: str | None = None) -> torch.Tensor:
    """`estimator` on the backend `impl` when the caller resolved it already (`resolve(backend,
    x.device, x.dtype)`; GLAIHead records it), so it is not resolved twice; `impl` None:
    resolve `backend` after the argument checks, as `estimator` does.

    Shapes as `estimator`: x [B, I], act [B, P], sw (O, I, P) with values [K], bias [O] ->
    y [B, O]; the same checks of every argument, in the same order.
    """
    index = sw.index
    # the remembered checks key on tensor ids and write to the module: eager calls only
    # (under torch.compile the checks run once, while tracing)
    remembered = None if torch.compiler.is_compiling() else sw.checked_index_sizes
    shape = check_inputs(x, act, sw.values, index, bias, index_check=remembered)
    if impl is None:
        impl = resolve(backend, x.device, x.dtype)
    save = torch.is_grad_enabled() and act.requires_grad
    if _eager(x, act, sw.values, bias):
        return _EagerSparse.apply(x, act, sw.values, bias, index, impl, shape, save)
    y, _ = sparse_estimator_op(x, act, sw.values, list(index), bias, impl.name, save)
    return y


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a Parameter is a plain tensor to dispatch


def _eager(*tensors: torch.Tensor | None) -> bool:
    """Whether `estimator` may skip the custom ops: plain tensors, no torch.compile tracing, no
    dispatch or function mode (fake tensors, functorch, __torch_function__ overrides)."""
    return (not torch.compiler.is_compiling()
            and all(t is None or type(t) in _PLAIN for t in tensors)
            and not torch._C._is_torch_function_mode_enabled()
            and not torch._C._are_functorch_transforms_active()
            and torch._C._len_torch_dispatch_stack() == 0)


def contiguous_index(index: KeptIndex) -> KeptIndex:
    """`index` itself when every tensor of it is contiguous (the kernels' layout), else a
    contiguous copy."""
    if all(t.is_contiguous() for t in index):
        return index
    return KeptIndex(*(t.contiguous() for t in index))


class _EagerSparse(torch.autograd.Function):
    """The two custom ops' work as one autograd.Function, for eager calls of `estimator`.

    The custom ops cost ≈ 0.1-0.2 ms of Python per call (the checks run again inside each,
    the custom-op and autograd wrappers), as much as the `cpp` kernels themselves at the
    paper's B = 16 (bench/NOTES.md, "cpp performance pass"). Same backends, same checks of
    their results, same gradients ("only those needed"); torch.compile, opcheck and direct
    callers of torch.ops.glai.sparse_estimator still get the custom ops.
    """

    @staticmethod
    def forward(ctx, x, act, values, bias, index, impl, shape, save):
        saved = None
        if _is_empty(shape):
            y = x.new_zeros(shape.batch, shape.outputs)  # an empty sum is zero
        else:
            x, act, values = x.contiguous(), act.contiguous(), values.contiguous()
            index = contiguous_index(index)
            keep = calls.saves(impl, save, empty=False)
            y, saved = calls.forward(impl, (x, act, values, index), (shape.batch, shape.outputs),
                                     x.dtype, impl.saved_shape(shape) if keep else None)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, act, values, saved)
        ctx.index, ctx.impl, ctx.shape = index, impl, shape
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, act, values, saved = ctx.saved_tensors
        wanted = tuple(ctx.needs_input_grad[:3])
        grads: tuple = (None, None, None)
        if any(wanted):
            grads = eager_backward(ctx.impl, dy.contiguous(), x, act, values, ctx.index, saved,
                                    wanted, _is_empty(ctx.shape))
        dbias = None
        if ctx.needs_input_grad[3]:
            dbias = bias_gradient(dy)
        return (*grads, dbias, None, None, None, None)


def eager_backward(impl: Backend, dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor,
                    values: torch.Tensor, index: KeptIndex, saved: torch.Tensor | None,
                    wanted: tuple[bool, bool, bool], empty: bool) -> tuple:
    """(dx, dact, dvalues), None where not `wanted`: `calls.backward`'s work and result checks
    (`calls.checked`) without its custom-op plumbing (an empty [0] tensor standing for each
    gradient not asked for), which the eager path would turn back into None."""
    wrt = (("x", x), ("act", act), ("values", values))
    if empty:
        return tuple(torch.zeros_like(t) if need else None
                     for (_, t), need in zip(wrt, wanted, strict=True))
    args = (dy, x, act, values, index, wanted)
    computed = impl.backward(*args, saved=saved) if saved is not None and saved.numel() \
        else impl.backward(*args)
    return tuple(calls.checked(impl, f"d{name}", g, t.shape, t.dtype) if need else None
                 for (name, t), g, need in zip(wrt, computed, wanted, strict=True))


def resolve(backend: str | None, device: torch.device, dtype: torch.dtype) -> Backend:
    """The sparse backend that runs for these tensors: `backend`, else $GLAI_BACKEND, else
    auto. A $GLAI_BACKEND naming a backend only the dense op has is an error that says so."""
    if backend is None:
        chosen = os.environ.get(ENV_VAR, "")
        if chosen and chosen != AUTO and chosen not in SPARSE_ESTIMATOR.names():
            known = ", ".join([AUTO, *sorted(SPARSE_ESTIMATOR.names())])
            raise ValueError(f"${ENV_VAR}={chosen!r} names no sparse estimator backend; "
                             f"sparse backends: {known} (pass backend= to override)")
    if SPARSE_ESTIMATOR.requested_name(backend) == AUTO:
        return _pick_auto(device.type, dtype)
    return SPARSE_ESTIMATOR.resolve(backend, device, dtype)


def _pick_auto(device_type: str, dtype: torch.dtype) -> Backend:
    """Registry.pick_auto as a plain loop: torch.compile cannot trace its max(key=...), and a
    module's forward resolves "auto" inside the compiled region."""
    best = None
    for candidate in SPARSE_ESTIMATOR.backends():
        rank = candidate.auto_priority.get(device_type)
        if rank is None or candidate.unsupported_reason(device_type, dtype) is not None:
            continue
        if best is None or rank > best.auto_priority[device_type]:
            best = candidate
    if best is None:
        raise RuntimeError(f"no sparse_estimator backend is available for {device_type} {dtype}; "
                           f"see glai_kernels.sparse.backends()")
    return best
