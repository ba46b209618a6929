"""The one core of both ops: how an op calls a backend, whatever its arguments.

The dense op (`glai_kernels/op.py`) and the sparse kept-path op (`glai_kernels/sparse/op.py`)
differ in their arguments, not in how they call a backend, so each keeps its argument checks
and its custom-op schemas and takes the rest from here:

- the forward body (`run_forward`; `forward_op` for the custom op): an empty problem answered
  with zeros, contiguous inputs, a saving forward when the backward will want it, each result
  of the shape and dtype the contract says (else a RuntimeError naming the backend), the bias
  added;
- the plain backward (`gradients`, and `backward` for the custom op, an empty [0] tensor for
  each gradient not asked for);
- the fakes (`fake_forward`, `fake_gradients`) and the empty check (`is_empty`);
- the custom ops' autograd (`setup_context`, `op_gradients`);
- the eager route (`eager_route`, `records_gradient`, `direct_forward`, `EagerFunction`):
  plain tensors in eager mode skip the custom ops' Python (module comment below).

Tensor arguments come as (x [B, I], act [B, P], weight) with weight the dense [O, I, P]
weight or the sparse values [K], and `rest`, what follows them in the backend's signature
(the sparse op's KeptIndex; nothing for the dense op).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.autograd import forward_ad

from glai_kernels.contract import accumulation_dtype, bias_gradient
from glai_kernels.registry import AUTO, Backend, Registry

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (x, act, weight or values)


def checked(impl: Backend, what: str, result: torch.Tensor | None,
            shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A backend's result, contiguous, once its shape and dtype are what the contract says."""
    if result is None or tuple(result.shape) != tuple(shape) or result.dtype != dtype:
        got = "nothing" if result is None else f"{result.dtype} {list(result.shape)}"
        op = "" if impl.op in ("", "estimator") else f" ({impl.op})"
        raise RuntimeError(f"backend {impl.name!r}{op} returned {got} for {what}, expected "
                           f"{dtype} {list(shape)}")
    return result.contiguous()


def is_empty(shape) -> bool:
    """Whether a call's shape (contract.Shape or sparse SparseShape) has a zero size: its
    sum is then zero, and no backend sees it."""
    return 0 in vars(shape).values()


def saves(impl: Backend, save: bool, empty: bool) -> bool:
    """Whether a forward keeps a tensor for its backward: asked for, offered, and not empty."""
    return save and impl.forward_saving is not None and not empty


def forward(impl: Backend, args: Sequence, out_shape: Sequence[int], dtype: torch.dtype,
            saved_shape: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, saved) from `impl` on `args` (tensors already contiguous): its saving forward when
    `saved_shape` is given (saved then in the accumulation dtype), else its plain forward."""
    if saved_shape is not None:
        y, saved = impl.forward_saving(*args)
        saved = checked(impl, "saved", saved, saved_shape, accumulation_dtype(dtype))
    else:
        y, saved = impl.forward(*args), None
    return checked(impl, "y", y, out_shape, dtype), saved


def run_forward(impl: Backend, shape, tensors: Tensors, rest: tuple,
                bias: torch.Tensor | None, save: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward op's body once its inputs are checked (`shape`) and `impl` resolved:
    (y [B, O] with the bias added, what `impl` kept for the backward when `save`, else None).
    `rest` is passed to the backend as it is (contiguous)."""
    x, act, weight = tensors
    saved = None
    if is_empty(shape):
        # An empty sum is zero; no backend needs to see a zero-sized launch.
        y = x.new_zeros(shape.batch, shape.outputs)
    else:
        keep = saves(impl, save, empty=False)
        y, saved = forward(impl, (x.contiguous(), act.contiguous(), weight.contiguous(), *rest),
                           (shape.batch, shape.outputs), x.dtype,
                           impl.saved_shape(shape) if keep else None)
    if bias is not None:
        y = y + bias
    return y, saved


def forward_op(impl: Backend, shape, tensors: Tensors, rest: tuple, bias: torch.Tensor | None,
               save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`run_forward` as the forward op returns it: an empty [0] tensor for nothing saved (a
    custom op returns tensors)."""
    y, saved = run_forward(impl, shape, tensors, rest, bias, save)
    return y, tensors[0].new_empty(0) if saved is None else saved


def gradients(impl: Backend, dy: torch.Tensor, tensors: Tensors, rest: tuple,
              saved: torch.Tensor | None, names: Sequence[str], needs: Sequence[bool],
              empty: bool) -> tuple[torch.Tensor | None, ...]:
    """The plain backward: the gradients of `tensors` (called `names`, in the backend's return
    order), None for each one not in `needs`: zeros when the problem is `empty`, else
    `impl.backward(dy, *tensors, *rest, needs)` on contiguous tensors (with `saved=` when the
    forward kept something: not None, not empty), each checked."""
    needs = tuple(needs)  # Python bools already (autograd's flags, a list[bool] schema)
    if empty:
        return tuple(torch.zeros_like(t) if need else None
                     for t, need in zip(tensors, needs, strict=True))
    x, act, weight = tensors
    call = (dy.contiguous(), x.contiguous(), act.contiguous(), weight.contiguous(), *rest, needs)
    computed = (impl.backward(*call, saved=saved) if saved is not None and saved.numel()
                else impl.backward(*call))
    return tuple(checked(impl, f"d{name}", g, t.shape, t.dtype) if need else None
                 for name, t, g, need in zip(names, tensors, computed, needs, strict=True))


def backward(impl: Backend, dy: torch.Tensor, tensors: Tensors, rest: tuple,
             saved: torch.Tensor | None, names: Sequence[str], needs: Sequence[bool],
             empty: bool) -> tuple[torch.Tensor, ...]:
    """`gradients` as the backward op returns them: an empty [0] tensor for each one not in
    `needs` (a custom op cannot return None, and its outputs may not alias)."""
    grads = gradients(impl, dy, tensors, rest, saved, names, needs, empty)
    like = tensors[0]
    return tuple(g if g is not None else like.new_empty(0) for g in grads)


# ---- fakes ---------------------------------------------------------------------------------

def fake_forward(registry: Registry, backend: str, shape, x: torch.Tensor,
                 save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op's fake: (y [B, O], saved of `backend`'s saved_shape when it would save,
    in the accumulation dtype, else [0])."""
    saved = x.new_empty(0)
    if backend != AUTO:
        impl = registry.get(backend)
        if saves(impl, save, is_empty(shape)):
            saved = x.new_empty(impl.saved_shape(shape), dtype=accumulation_dtype(x.dtype))
    return x.new_empty(shape.batch, shape.outputs), saved


def fake_gradients(tensors: Tensors, needs: Sequence[bool]) -> tuple[torch.Tensor, ...]:
    """The backward op's fake: each gradient shaped as its input, [0] when not needed."""
    return tuple(t.new_empty(t.shape) if need else t.new_empty(0)
                 for t, need in zip(tensors, needs, strict=True))


# ---- the custom ops' autograd ----------------------------------------------------------------

def setup_context(ctx, tensors: Tensors, rest: tuple, saved: torch.Tensor,
                  backend: str) -> None:
    """Keep on `ctx` what the forward op's backward needs: the inputs, the saved tensor and
    `rest`'s tensors (the sparse index), and the backend's name."""
    ctx.mark_non_differentiable(saved)
    # otherwise autograd hands the backward a zero-filled gradient for `saved` (the dense
    # Z [B, O, P]: a fresh 4.8 MB fill at A1, B = 256, 42 MB at B1, per backward;
    # docs/notes/cpu-kernels.md, "Two threads without waiting ...")
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*tensors, saved, *rest)
    ctx.backend = backend


def op_gradients(ctx, dy: torch.Tensor | None, backward_op: Callable,
                 bias_position: int) -> tuple[torch.Tensor | None, ...]:
    """(dx, dact, dweight, dbias) of the forward op for `dy`, None where not needed:
    `backward_op(dy, x, act, weight, [rest] if any, saved, needs, backend)` from what
    `setup_context` kept (`rest` as the one list it was given to the op as: the sparse
    index); the bias is input `bias_position` of the forward op."""
    x, act, weight, saved, *rest = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    if dy is None:  # y reached no loss: every gradient is None, as without the op
        return None, None, None, None
    grads: list[torch.Tensor | None] = [None, None, None]
    if any(needs):
        computed = backward_op(dy, x, act, weight, *([rest] if rest else []), saved, needs,
                               ctx.backend)
        grads = [g if need else None for g, need in zip(computed, needs, strict=True)]
    dbias = bias_gradient(dy) if ctx.needs_input_grad[bias_position] else None
    return (*grads, dbias)


# ---- the backward ops' autograd: gradients of gradients -----------------------------------
# The backward op maps (dy, x, act, weight) to
#     gx = Bx(dy, act, weight)    gact = Bact(dy, x, weight)    gweight = Bw(dy, x, act),
# each linear in each argument, so for incoming gradients (ggx, ggact, ggweight):
#     d dy     = E(ggx, act, weight) + E(x, ggact, weight) + E(x, act, ggweight)
#     d x      = Bx(dy, ggact, weight) + Bx(dy, act, ggweight)
#     d act    = Bact(dy, ggx, weight) + Bact(dy, x, ggweight)
#     d weight = Bw(dy, ggx, act) + Bw(dy, x, ggact)
# with E the forward (for the sparse op, weight is the values on the same index, which gets
# no gradient). Both ops are differentiable, so higher orders follow.


def backward_setup_context(ctx, dy: torch.Tensor, tensors: Tensors, rest: tuple,
                           backend: str) -> None:
    """Keep on `ctx` what `double_backward` needs: dy, the inputs, `rest`'s tensors (the
    sparse index), the backend's name."""
    ctx.save_for_backward(dy, *tensors, *rest)
    ctx.backend = backend


def _present(g: torch.Tensor | None, like: torch.Tensor) -> bool:
    # a gradient the first backward did not compute is an empty [0]; so is its incoming one
    return g is not None and tuple(g.shape) == tuple(like.shape)


def double_backward(ctx, incoming: Sequence[torch.Tensor | None], forward_of: Callable,
                    grad_of: Callable) -> tuple[torch.Tensor | None, ...]:
    """(d dy, d x, d act, d weight) of the backward op for the incoming (ggx, ggact,
    ggweight), None where not needed, by the formulas above: `forward_of(x, act, weight,
    rest, backend)` is E, `grad_of(which, dy, x, act, weight, rest, backend)` one gradient
    (0: x, 1: act, 2: weight), each an op call (so differentiable again); `rest` is the tuple
    of the tensors `backward_setup_context` kept after the inputs."""
    dy, x, act, weight, *kept = ctx.saved_tensors
    rest, name = tuple(kept), ctx.backend
    need_dy, *needed = ctx.needs_input_grad[:4]
    args = (x, act, weight)
    # each incoming gradient stands in for its argument in turn, in the order x, act,
    # weight, so each total sums its terms in that order
    dy_terms: list[torch.Tensor] = []
    arg_terms: list[list[torch.Tensor]] = [[], [], []]
    for j, (gg, like) in enumerate(zip(incoming, args, strict=True)):
        if not _present(gg, like):
            continue
        at = tuple(gg if k == j else a for k, a in enumerate(args))
        if need_dy:
            dy_terms.append(forward_of(*at, rest, name))
        for k in range(3):
            if k != j and needed[k]:
                arg_terms[k].append(grad_of(k, dy, *at, rest, name))

    def total(parts: list[torch.Tensor], like: torch.Tensor, need: bool) -> torch.Tensor | None:
        if not need:
            return None
        return sum(parts[1:], parts[0]) if parts else torch.zeros_like(like)

    return (total(dy_terms, dy, need_dy),
            *(total(parts, like, need) for parts, like, need in zip(arg_terms, args, needed,
                                                                     strict=True)))


# ---- eager calls that autograd will not record ---------------------------------------------
# Through torch.library a custom op call costs ~20 µs of Python (autograd wrapper, dispatch,
# argument checks) before its body runs: 15% of the dense C2 forward at B = 16, as much as the
# sparse `cpp` kernels themselves at the paper's B = 16 (docs/notes/cpu-kernels.md, "Small batch"
# and "cpp performance pass"). When nothing could observe the difference (plain tensors, no
# torch.compile, no dispatch or function mode, no functorch transform) the body runs directly,
# with the same checks and the same result checks.

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a Parameter is a plain tensor to dispatch


def transformed() -> bool:
    """Whether a torch.func transform or a torch.autograd.forward_ad level is active: a call
    may then see batched or dual tensors, which neither the custom ops nor the backends'
    kernels follow, so it runs as glai_kernels/transforms.py's Function. (A dual tensor
    exists only inside a level, and torch.func.jvp opens one.)"""
    return (torch._C._are_functorch_transforms_active()
            or forward_ad._current_level >= 0)


def eager_route(tensors: tuple) -> bool:
    """Whether a call on `tensors` may skip the custom ops: plain tensors (not meta), outside
    torch.compile, under no dispatch or function mode, no functorch transform and no
    forward-AD level."""
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or t.is_meta):
            return False
    return not (torch.compiler.is_compiling()
                or torch._C._len_torch_dispatch_stack()
                or torch._C._is_torch_function_mode_enabled()
                or transformed())


def records_gradient(tensors: tuple) -> bool:
    """Whether autograd records a call on `tensors`: grad mode on and one needs a gradient.
    Plain tensors that it does not record may skip autograd too (`direct_forward`)."""
    if not torch.is_grad_enabled():
        return False
    # a loop, not any() over a generator (ruff's SIM110): ≈ 1 µs less on every call
    for t in tensors:  # noqa: SIM110
        if t is not None and t.requires_grad:
            return True
    return False


def refuse_aliasing(impl: Backend, inputs: tuple, y: torch.Tensor) -> None:
    """The check torch.library makes of a custom op's outputs (the same C++ function): a
    result may not alias an input. Not while torch.compile traces (Dynamo cannot trace the
    C++ check, which would break the graph): it runs on the same backend's eager calls."""
    if torch.compiler.is_compiling():
        return
    if torch._C._any_output_is_alias_to_input_or_output(inputs, {}, (y,)):
        raise RuntimeError(f"glai::{impl.op}: backend {impl.name!r} returned an output that "
                           "aliases an input; a custom op's outputs must be new tensors")


def direct_forward(impl: Backend, shape, tensors: Tensors, rest: tuple,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """The forward op's y without the op: its body, and the check the op makes that a result
    does not alias an input."""
    y, _ = run_forward(impl, shape, tensors, rest, bias, False)
    refuse_aliasing(impl, (*tensors, bias), y)
    return y


# ---- eager calls that autograd records -----------------------------------------------------
# The custom op's autograd (torch.library's generated Function, then the backward op's own
# dispatch) cost ≈ 17 µs of Python in the forward and ≈ 47 µs in the backward: at the paper's
# B = 16 as long as the dense kernels at A2 and C1 (docs/notes/cpu-kernels.md, "The paper's batch at
# two threads"). For plain tensors in eager mode a Function records the same node: the same bodies,
# the same checks of every result.


def record(function: type[EagerFunction], impl: Backend, shape, tensors: Tensors, rest: tuple,
           bias: torch.Tensor | None, save: bool) -> torch.Tensor:
    """y [B, O] for an eager call that autograd records (`eager_route` and `records_gradient`
    hold): the backend's own node when it has one (`Backend.eager`, called (x, act, weight,
    bias, save, *rest): a node in C++ that spares the Python Function's apply, context and
    backward, ≈ 0.1 ms of the sparse op's ordinary training step at A1, A2 and C1 at the
    paper's batch; docs/notes/pipeline.md, "A cheaper ordinary GLAI step (issue 41 item 2,
    stop 45)") and the problem is not empty, else `function` (the op's EagerFunction)."""
    if impl.eager is not None and not is_empty(shape):
        return impl.eager(*tensors, bias, save, *rest)
    return function.apply(*tensors, bias, rest, impl, shape, save)


class EagerFunction(torch.autograd.Function):
    """Both custom ops' work as one autograd.Function: apply(x, act, weight, bias, rest, impl,
    shape, save) -> y [B, O]. Each op subclasses it (the node's name says which op recorded
    it) and sets `names`, its gradients' names for the result checks, and `graph_backward`,
    its backward op, called (dy, x, act, weight, *rest, saved, needs, backend name) for a
    backward that builds a graph (create_graph), whose own autograd formula then gives
    gradients of gradients; without one, the plain backward runs."""

    names: tuple[str, str, str] = ("x", "act", "weight")
    graph_backward: Callable | None = None

    @staticmethod
    def forward(ctx, x, act, weight, bias, rest, impl: Backend, shape, save: bool):
        y, saved = run_forward(impl, shape, (x, act, weight), rest, bias, save)
        refuse_aliasing(impl, (x, act, weight, bias), y)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, act, weight, saved)  # saved None: nothing kept, nothing made
        ctx.impl, ctx.rest, ctx.empty = impl, rest, is_empty(shape)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, act, weight, saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        grads: tuple = (None, None, None)
        if dy is not None and any(needs):
            op = ctx._forward_cls  # the subclass that recorded this node
            graph_backward = op.graph_backward
            if torch.is_grad_enabled() and graph_backward is not None:
                if saved is None:  # the op takes a tensor
                    saved = x.new_empty(0)
                computed = graph_backward(dy, x, act, weight, *ctx.rest, saved, list(needs),
                                          ctx.impl.name)
                grads = tuple(g if need else None for g, need in zip(computed, needs,
                                                                     strict=True))
            else:
                grads = gradients(ctx.impl, dy, (x, act, weight), ctx.rest, saved, op.names,
                                  needs, ctx.empty)
        dbias = bias_gradient(dy) if dy is not None and ctx.needs_input_grad[3] else None
        return (*grads, dbias, None, None, None, None)
