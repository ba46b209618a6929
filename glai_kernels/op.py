"""The one op: `glai::estimator`, its backward op, fake implementations and autograd.

Every backend runs behind these two custom ops, so autograd, torch.compile and opcheck see
one contract whatever computes it. The ops take the backend's name as a string argument;
the public `estimator` resolves "auto" and $GLAI_BACKEND to a concrete name first, so a
forward and its backward always run on the same backend. What the ops do besides checking
their arguments (the forward body, the plain backward, the fakes, autograd, the eager route
that skips torch.library's Python) is the core both ops share, glai_kernels/calls.py.

Like aten's native_layer_norm, the forward op returns a second tensor, `saved`, that only
its backward reads: empty unless `save` is true and the backend has a `forward_saving`; it is
in the accumulation dtype (float32 for half inputs), so a kept partial sum cannot overflow.

Autocast: inside a `torch.autocast` region the op runs the way aten's matmul does: its
floating inputs (float64 excepted) are cast to the region's dtype, and the backend then runs
in that dtype, with float32 accumulation, under no autocast of its own (autocast.py). Double
backward: the backward op has its own autograd formula, written with the two ops themselves
(the op is linear in each argument), so gradients of gradients run on the same backend.
"""

from __future__ import annotations

import torch

from glai_kernels import autocast, calls, dispatch, registry, transforms
from glai_kernels.autocast import autocast_dtype, autocast_inputs
from glai_kernels.contract import Shape, check_inputs


def _resolved(backend: str | None, device: torch.device, dtype: torch.dtype,
              call: dispatch.Call | None = None) -> str:
    if device.type == "meta":
        return registry.requested_name(backend)
    return registry.resolve(backend, device, dtype, call).name


@torch._dynamo.assume_constant_result
def resolved_name(backend: str | None, device: torch.device, dtype: torch.dtype,
                  call: dispatch.Call | None = None) -> str:
    """The concrete backend name `estimator(..., backend=backend)` runs for tensors on
    `device` of `dtype` (the argument, else $GLAI_BACKEND, else the auto pick, which
    consults the machine's dispatch table for `call`'s mode and shape when given).

    torch.compile takes the answer as a constant when it traces (the auto pick is not
    traceable, and an availability check may build an extension), so a compiled graph
    keeps the backend chosen when it was traced. Meta tensors never reach a backend (the
    fake implementation computes their shapes): for them the name is only validated.
    """
    return _resolved(backend, device, dtype, call)


def auto_call(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
              backend: str | None, device_type: str) -> dispatch.Call | None:
    """What "auto" is told of a call (its mode and shape, as a plain tuple in `Call`'s
    order: this runs on every call), or None where it cannot use it: a named backend, or
    inside torch.compile, whose graph keeps one backend for every batch (the priorities
    choose it), or on a machine kind without a dispatch table (the same priorities)."""
    if ((backend is not None and backend != registry.AUTO) or torch.compiler.is_compiling()
            or not dispatch.has_table(device_type)):
        return None
    batch, inputs = x.shape
    return (dispatch.call_mode(x, act, weight), batch, inputs, act.shape[1],  # type: ignore[return-value]
            weight.shape[0])


def backend_for(x: torch.Tensor, backend: str | None = None,
                act: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> str:
    """The backend name an `estimator` call with first argument `x` runs on: `resolved_name`
    for x's device and the dtype the call runs in (the autocast dtype inside a region).
    With the call's `act` and `weight`, "auto" follows the dispatch table for its mode and
    shape as `estimator` does; without them, the priorities."""
    dtype = autocast_dtype(x.device.type)
    if dtype is None or not x.is_floating_point() or x.dtype == torch.float64:
        dtype = x.dtype
    call = (auto_call(x, act, weight, backend, x.device.type)
            if act is not None and weight is not None else None)
    return resolved_name(backend, x.device, dtype, call)


_NAMES = ("x", "act", "weight")  # the gradients' names in the result checks


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
    return calls.forward_op(registry.resolve(backend, x.device, x.dtype), shape,
                            (x, act, weight), (), bias, save)


@estimator_op.register_fake
def _estimator_fake(x, act, weight, bias, backend, save=False):
    return calls.fake_forward(registry.ESTIMATOR, backend, check_inputs(x, act, weight, bias),
                              x, save)


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
    impl = registry.resolve(backend, x.device, x.dtype)
    return calls.backward(  # type: ignore[return-value]
        impl, dy, (x, act, weight), (), saved, _NAMES, needs, calls.is_empty(shape))


@estimator_backward_op.register_fake
def _estimator_backward_fake(dy, x, act, weight, saved, needs, backend):
    check_inputs(x, act, weight)
    return calls.fake_gradients((x, act, weight), needs)


def _setup_context(ctx, inputs, output):
    x, act, weight, _bias, backend, *_ = inputs
    calls.setup_context(ctx, (x, act, weight), (), output[1], backend)


def _backward(ctx, dy, _dsaved):
    return (*calls.op_gradients(ctx, dy, estimator_backward_op, bias_position=3), None, None)


estimator_op.register_autograd(_backward, setup_context=_setup_context)


# ---- double backward ------------------------------------------------------------------------
# The backward op has its own autograd formula, written with the two ops (calls.py, "the
# backward ops' autograd"), so gradients of gradients run on the same backend.


def _backward_setup_context(ctx, inputs, output):
    dy, x, act, weight, _saved, _needs, backend = inputs
    calls.backward_setup_context(ctx, dy, (x, act, weight), (), backend)


def _forward_of(x, act, weight, _rest, backend: str) -> torch.Tensor:
    return estimator_op(x, act, weight, None, backend, False)[0]


def _grad_of(which: int, dy, x, act, weight, _rest, backend: str) -> torch.Tensor:
    """One gradient (0: x, 1: act, 2: weight) of the op at (x, act, weight) for dy."""
    needs = [which == 0, which == 1, which == 2]
    return estimator_backward_op(dy, x, act, weight, x.new_empty(0), needs, backend)[which]


def _double_backward(ctx, ggx, ggact, ggweight):
    return (*calls.double_backward(ctx, (ggx, ggact, ggweight), _forward_of, _grad_of),
            None, None, None)


estimator_backward_op.register_autograd(_double_backward,
                                        setup_context=_backward_setup_context)


# ---- autocast ------------------------------------------------------------------------------
# glai_kernels/autocast.py: the inputs cast to the region's dtype at the Autocast<Device> keys,
# the backend run outside autocast.
autocast.register("estimator", estimator_op, "estimator_backward", estimator_backward_op)


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
        y: [B, O], the inputs' dtype (inside torch.autocast: the region's dtype, the inputs
        cast to it as aten's matmul casts them). Differentiable in x, act, weight and bias,
        twice and more.
    """
    dtype = autocast_dtype(x.device.type) if isinstance(x, torch.Tensor) else None
    if dtype is not None:
        # cast here, not only in the op, so the checks and the backend see the dtype it runs
        x, act, weight, bias = autocast_inputs((x, act, weight, bias), x.device.type, dtype)
    shape = check_inputs(x, act, weight, bias)
    if torch.compiler.is_compiling() and calls.transformed():
        # torch.compile of a torch.func transform: the custom op's torch.library autograd is
        # not functorch-ready, so the transform's Function, traced (one backend: priorities)
        impl = registry.resolve(resolved_name(backend, x.device, x.dtype), x.device, x.dtype)
        return transforms.forward(_contraction(impl), x, act, weight, (), bias)
    if torch.compiler.is_compiling():
        # a compiled graph keeps one backend, chosen by the priorities (auto_call is None)
        name = resolved_name(backend, x.device, x.dtype)
    else:
        device = x.device
        call = auto_call(x, act, weight, backend, device.type)
        tensors = (x, act, weight, bias)
        if calls.transformed():
            # batched or dual tensors: the op as a functorch-ready Function (transforms.py);
            # asked first, as eager_route would only find the same after its tensor checks
            impl = registry.resolve(backend, device, x.dtype, call)
            return transforms.forward(_contraction(impl), x, act, weight, (), bias)
        if dtype is None and calls.eager_route(tensors):
            # plain tensors in eager mode: the op's work without its Python (calls.py)
            impl = registry.resolve(backend, device, x.dtype, call)
            if not calls.records_gradient(tensors):
                return calls.direct_forward(impl, shape, (x, act, weight), (), bias)
            save = act.requires_grad
            if impl.eager is not None and not calls.is_empty(shape):
                return impl.eager(x, act, weight, bias, save)
            return _EagerEstimator.apply(x, act, weight, bias, (), impl, shape, save)
        # eager: the same answer without the wrapper torch.compile needs (a few µs a call)
        name = _resolved(backend, device, x.dtype, call)
    save = torch.is_grad_enabled() and act.requires_grad
    y, _ = estimator_op(x, act, weight, bias, name, save)
    return y


def _check(x, act, weight, _rest) -> Shape:
    return check_inputs(x, act, weight)


_CONTRACTIONS: dict[int, tuple[registry.Backend, transforms.Contraction]] = {}


def _contraction(impl: registry.Backend) -> transforms.Contraction:
    """The dense op on `impl` for transforms.py: stacked weights fold into the outputs. Made
    once per backend (every call under a transform asks; the identity check keeps a new
    backend object from reusing a dead one's entry)."""
    kept = _CONTRACTIONS.get(id(impl))
    if kept is None or kept[0] is not impl:
        kept = _CONTRACTIONS[id(impl)] = (impl, transforms.Contraction(impl, _check, _NAMES,
                                                                       fold_outputs=True))
    return kept[1]


class _EagerEstimator(calls.EagerFunction):
    """The dense op's eager node (calls.EagerFunction); a backward that builds a graph
    (create_graph) calls the backward op, whose own autograd formula gives gradients of
    gradients."""

    names = _NAMES
    graph_backward = estimator_backward_op
