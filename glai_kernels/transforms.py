"""Both ops under PyTorch's transforms: torch.func (grad, vjp, jacrev, jvp, jacfwd, hessian,
vmap, functional_call) and torch.autograd.forward_ad.

The custom ops have no forward-mode formula and torch.library's autograd Function is not
functorch-ready; the eager fast paths (calls.py) and the backends' compiled or C++ kernels do
not see dual or batched tensors. So while a transform or a forward-AD level is active
(`calls.transformed`) each op runs as `_Slot`, a functorch-ready autograd.Function
(setup_context, backward, jvp, vmap) whose work is the backend's forward or one gradient.

Why one Function serves every derivative: the op is the trilinear form
    T(y, x, act, w) = sum_{b,o,i,s} y[b,o] x[b,i] act[b,s] w[o,i,s]
(sparse: the sum over the kept paths k, w the values [K] on the fixed index). Call its four
arguments slots 0..3 (y [B, O], x [B, I], act [B, P], w). The forward is G_0 = dT/dy, and the
gradients of x, act and w are G_1, G_2, G_3 (G_k = dT/d slot k, a function of the other
three slots). Each G_k is linear in each of its arguments, so
- its vjp for the incoming g (slot k's shape) with respect to slot j is G_j of the same
  slots with slot k replaced by g;
- its jvp is the sum over j of G_k with slot j replaced by its tangent;
all of them calls of the op itself, on the same backend, differentiable again.

The eager fast paths (the backend's C++ node, calls.EagerFunction) stay old-style: the
eager route's test never takes them under a transform, and a setup_context Function binds its
arguments with inspect.signature on every call, which the paper's B = 16 would pay each step.
Below every transform (inside the innermost vmap's rule, once its level is popped) a call is an
eager one again and `apply` takes it eagerly; the innermost vmap or grad level itself the op
takes directly, without functorch's generic rule (section "the innermost vmap or grad").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from glai_kernels import calls
from glai_kernels.contract import Shape, bias_gradient
from glai_kernels.registry import Backend

try:  # functorch's internals, for the innermost vmap or grad taken directly (`_innermost`)
    from torch._C._functorch import (
        CGradInterpreterPtr,
        CVmapInterpreterPtr,
        TransformType,
        _add_batch_dim,
        _unwrap_batched,
        _unwrap_for_grad,
        _wrap_for_grad,
        get_single_level_autograd_function_allowed,
        peek_interpreter_stack,
        pop_dynamic_layer_stack,
        push_dynamic_layer_stack,
        set_single_level_autograd_function_allowed,
        unwrap_if_dead,
    )
    from torch._functorch.autograd_function import custom_function_call
    from torch._functorch.utils import unwrap_dead_wrappers
    from torch.autograd.function import _SingleLevelFunction
except ImportError:  # another torch's layout: every call takes autograd.Function.apply
    peek_interpreter_stack = None

Y, X, ACT, W = range(4)  # the slots
_R = TypeVar("_R", torch.Tensor, list)  # a result one level down: one tensor, or a list


@dataclass(frozen=True, eq=False)
class Contraction:
    """One op on one backend. `pack(rest)` turns the tensors after the slots (the Function's
    arguments are tensors) into the backend's arguments after (x, act, w): () for the dense
    op, (KeptIndex,) for the sparse one; `check(x, act, w, packed)` gives the call's shape
    (the op's own argument checks, naming the argument at fault); `names` are the gradients'
    names for the result checks; `fold_outputs` says that stacked weights [N, O, I, P] are
    one weight [N*O, I, P] (the dense op; a sparse index cannot be stacked that way)."""

    impl: Backend
    check: Callable
    names: tuple[str, str, str]
    fold_outputs: bool
    pack: Callable[[tuple], tuple] = tuple

    def compute(self, k: int, slots: Sequence, rest: tuple) -> torch.Tensor:
        """G_k of the other slots: k = 0 the forward y [B, O] (no bias), else the gradient of
        slot k for dy = slots[0]. slots[k] only gives its shape (the backends' backward takes
        every tensor)."""
        dy, x, act, w = slots
        rest = self.pack(rest)
        shape = self.check(x, act, w, rest)
        if k == Y:
            y, _ = calls.run_forward(self.impl, shape, (x, act, w), rest, None, False)
            calls.refuse_aliasing(self.impl, (x, act, w), y)
            return y
        needs = (k == X, k == ACT, k == W)
        grads = calls.gradients(self.impl, dy, (x, act, w), rest, None, self.names, needs,
                                calls.is_empty(shape))
        return grads[k - 1]  # type: ignore[return-value]


def apply(c: Contraction, k: int, slots: Sequence, rest: tuple) -> torch.Tensor:
    """G_k (module docstring) recorded for every active transform; slots[k] may be None for
    k = 0 (the forward needs no y).

    Where no transform is left to see it (inside a vmap rule at the last level, a backward
    outside every transform) the call is the eager one: with nothing to record, the
    backend's call itself; a dense forward that only autograd records, the backend's own
    eager node where it has one (cpp's C++ node, as an eager call of the op takes). Either
    way the same bits, without _Slot's Python (docs/notes/cpu-kernels.md, "vmap over stacked
    heads (issue 43, stop 45)")."""
    tensors = (*slots, *rest)
    if calls.eager_route(tensors):
        # slot k only gives the result's shape: the result depends on the other tensors alone
        if not calls.records_gradient((*slots[:k], *slots[k + 1:], *rest)):
            return c.compute(k, slots, rest)
        if k == Y and c.impl.eager is not None and c.impl.op == "estimator":
            _, x, act, w = slots
            if not calls.is_empty(c.check(x, act, w, c.pack(rest))):
                return c.impl.eager(x, act, w, None, act.requires_grad)
    top = _innermost()
    if top is not None:
        if top.key() == TransformType.Vmap:
            return _vmapped(top, c, k, list(slots), rest, None)
        if top.key() == TransformType.Grad:
            return _through_grad(top, c, k, slots, rest)
    if peek_interpreter_stack is not None and torch._C._are_functorch_transforms_active():
        # what Function.apply ends in, without its inspect.signature binding (_Slot.forward
        # has no defaults: the binding changes nothing)
        return custom_function_call(_Slot, c, k, *slots, *rest)
    if peek_interpreter_stack is not None and not torch.compiler.is_compiling():
        # no functorch transform (a forward-AD level, or autograd below every transform):
        # Function.apply's own end, without its binding (≈ 19 µs of 35 a call here);
        # torch.compile keeps Function.apply, which Dynamo traces as such
        return _SLOT_APPLY(c, k, *unwrap_dead_wrappers((*slots, *rest)))
    return _Slot.apply(c, k, *slots, *rest)


def forward(c: Contraction, x: torch.Tensor, act: torch.Tensor, w: torch.Tensor, rest: tuple,
            bias: torch.Tensor | None) -> torch.Tensor:
    """The op's y [B, O] under a transform: G_0 plus the bias (an aten add, which every
    transform knows; under the innermost vmap or grad the op adds it one level down, inside
    its own call)."""
    top = _innermost()
    if top is not None:
        if top.key() == TransformType.Vmap:
            return _vmapped(top, c, Y, [None, x, act, w], rest, bias)
        if top.key() == TransformType.Grad:
            return _through_grad(top, c, Y, (None, x, act, w), rest, bias)
    y = apply(c, Y, (None, x, act, w), rest)
    return y if bias is None else y + bias


class _Slot(torch.autograd.Function):
    """apply(contraction, k, y, x, act, w, *rest) -> G_k (module docstring). The tensor in
    slot k gives only the result's shape: it gets no gradient and no tangent."""

    @staticmethod
    def forward(c, k, y, x, act, w, *rest):
        return c.compute(k, (y, x, act, w), rest)

    @staticmethod
    def setup_context(ctx, inputs, output):
        c, k, *tensors = inputs
        ctx.c, ctx.k = c, k
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)

    @staticmethod
    def backward(ctx, g):
        slots, rest = ctx.saved_tensors[:4], tuple(ctx.saved_tensors[4:])
        k, needs = ctx.k, ctx.needs_input_grad
        grads: list = [None] * 4
        if g is not None:
            grads = _gradients(ctx.c, k, g, slots, rest,
                               [j != k and needs[2 + j] for j in range(4)], False)[:4]
        return (None, None, *grads, *(None for _ in rest))

    @staticmethod
    def jvp(ctx, _dc, _dk, *tangents):
        slots, rest = ctx.saved_tensors[:4], tuple(ctx.saved_tensors[4:])
        k = ctx.k
        total = None
        # the terms in slot order (x, act, w), as the double backward sums them
        for j in range(4):
            t = tangents[j]
            if j != k and t is not None:
                term = apply(ctx.c, k, _replaced(slots, j, t), rest)
                total = term if total is None else total + term
        return total

    @staticmethod
    def vmap(info, in_dims, c, k, *tensors):
        return batched(info.batch_size, in_dims[2:], c, k, tensors)


# what Function.apply calls once it has bound the arguments, outside every functorch transform
_SLOT_APPLY = super(torch.autograd.Function, _Slot).apply


def _replaced(slots: Sequence, j: int, t: torch.Tensor) -> list:
    out = list(slots)
    out[j] = t
    return out


# ---- the innermost vmap or grad, taken directly ---------------------------------------------
# Under a transform, _Slot.apply goes through functorch's custom_function_call: a dispatch in
# Python, then a rule per transform. Under vmap the rule unwraps the operands at the vmap's
# level (pytree), pops the level, runs _Slot.vmap and wraps the results; under grad it builds
# a new single-level autograd.Function class for the call, lifts the operands to its level and
# applies that class, whose forward unwraps them, pops the level and calls custom_function_call
# again one level down. When the innermost transform is a vmap or a grad the op takes those
# steps itself: `batched` as the vmap rule, one single-level Function class per grad level
# (made once) whose forward calls the op one level down, so the level below is taken
# directly too. The same tensors, the same autograd records, without about half of the Python
# of a vmapped call of a stacked head (docs/notes/cpu-kernels.md, "vmap over stacked heads
# (issue 43, stop 45)"). The bias is added on the unwrapped tensors, as functorch's batching
# rule of add does; under a grad it is an operand of the level's Function, added one level
# down (in the folded call of stacked heads), its gradient the sum of g over the rows. A call
# that the grad level would not record (nothing it depends on needs a gradient there) skips
# the Function: unwrapped, one level down, wrapped, as functorch takes an aten op there
# (docs/notes/cpu-kernels.md, "vmap over stacked heads, third pass (issue 43, stop 47)").


def _innermost():
    """The innermost active transform's interpreter (functorch's CInterpreter), or None where
    there is none or something else (torch.compile, a dispatch or function mode) may need to
    see the call."""
    if peek_interpreter_stack is None:
        return None
    top = peek_interpreter_stack()
    if (top is None or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()):
        return None
    return top


class _Lowered:
    """The innermost level popped inside (functorch's interpreter.lower()); a grad level
    entered from no_grad also restores no_grad inside, as its interpreter does."""

    def __init__(self, no_grad: bool = False):
        self.no_grad = torch.no_grad() if no_grad else None

    def __enter__(self):
        if self.no_grad is not None:
            self.no_grad.__enter__()
        self.saved = pop_dynamic_layer_stack()

    def __exit__(self, *exc):
        push_dynamic_layer_stack(self.saved)
        if self.no_grad is not None:
            self.no_grad.__exit__(*exc)


def _unwrapped(t: torch.Tensor | None, level: int) -> tuple[torch.Tensor | None, int | None]:
    """(t's tensor at the level below, its batch dim at `level` or None). A wrapper of a
    transform that has exited (a vjp's pull runs after its level) is unwrapped first, as
    functorch's dispatch does before any rule."""
    return (None, None) if t is None else _unwrap_batched(unwrap_if_dead(t), level)


def _vmapped(top, c: Contraction, k: int, slots: list, rest: tuple,
             bias: torch.Tensor | None) -> torch.Tensor:
    """G_k (plus `bias` for the forward) under the innermost vmap `top`: unwrapped, one level
    down `_folded_forward` (stacked heads' forward) or `batched`, wrapped at its level."""
    level, n = top.level(), CVmapInterpreterPtr(top).batchSize()
    parts = [_unwrapped(t, level) for t in (*slots, *rest, bias)]
    tensors, dims = [p[0] for p in parts], [p[1] for p in parts]
    b, bias_dim = tensors.pop(), dims.pop()
    with _Lowered():
        folded = (_folded_forward(n, c, tensors, dims, b, bias_dim) if k == Y and c.fold_outputs
                  else None)
        if folded is not None:  # stacked heads: the folded call with its bias, as it is
            out, out_dim, b = folded, 1, None
        elif all(d is None for d in dims):  # nothing batched at this level: one plain call
            out, out_dim = apply(c, k, tensors[:4], tuple(tensors[4:])), None
        else:
            out, out_dim = batched(n, dims, c, k, tensors)
        if b is not None:
            if out_dim is None and bias_dim is None:
                out = out + b
            else:  # [N, B, O] + [N, 1, O] or [O]
                y = out if out_dim is None else out.movedim(out_dim, 0)
                out = y + (b if bias_dim is None else b.movedim(bias_dim, 0).unsqueeze(1))
                out_dim = 0
    return out if out_dim is None else _add_batch_dim(out, out_dim, level)


def _folded_forward(n: int, c: Contraction, tensors: list, dims: list,
                    b: torch.Tensor | None, bias_dim: int | None) -> torch.Tensor | None:
    """y [B, N, O] (batched at 1) of stacked heads, one level below their vmap: weights
    `tensors`[W] [N, O, I, P] and biases `b` [N, O] batched, x and act shared, as ONE eager
    call of the op on the folded weight [N*O, I, P] and bias [N*O], the very call an eager
    `estimator` on them makes (its checks, the backend's call and the bias added in
    calls.run_forward, or the backend's eager node where autograd records). None where that
    is not the case here (rows batched, a bias shared or batched alone, another transform
    or mode below, an empty problem that autograd records): `batched` then, the bias added
    after. The same bits either way (the bias added to the same y elements); fewer steps and
    no extra [N, B, O] add (docs/notes/cpu-kernels.md, "vmap over stacked heads, second pass
    (issue 43, stop 46)")."""
    if (len(tensors) != 4 or dims[X] is not None or dims[ACT] is not None or dims[W] is None
            or (b is not None and bias_dim is None)):
        return None
    _, x, act, w = tensors
    # a view op costs ≈ 0.7 µs here: none where the batch dim is already first (as
    # stack_module_state stacks)
    w = w if dims[W] == 0 else w.movedim(dims[W], 0)
    outputs = w.shape[1]  # O (explicit sizes: a view of an empty tensor needs them)
    weight = w.reshape(n * outputs, *w.shape[2:])
    if b is not None:
        b = (b if bias_dim == 0 else b.movedim(bias_dim, 0)).reshape(n * outputs)
    called = (x, act, weight, b)
    if not calls.eager_route(called):
        return None
    # the op checked each head's arguments on entry, on the batched tensors (ranks, sizes,
    # dtypes, devices, naming the argument): the folded call's follow, only its shape is new
    shape = Shape(x.shape[0], x.shape[1], act.shape[1], n * outputs)
    if not calls.records_gradient(called):
        y = calls.direct_forward(c.impl, shape, (x, act, weight), (), b)
    elif c.impl.eager is not None and c.impl.op == "estimator" and not calls.is_empty(shape):
        y = c.impl.eager(x, act, weight, b, act.requires_grad)
    else:
        return None
    return y.view(shape.batch, n, outputs)


_GRAD_FUNCTIONS: dict[int, type] = {}


def _grad_function(level: int) -> type:
    """The single-level autograd.Function of grad level `level`: apply(c, k, bias, *tensors)
    -> G_k, plus `bias` (None, or for the forward its bias) with the tensors and the bias
    lifted to the level; its forward is G_k one level down (`_lowered_call`), its backward
    `_gradients`, the bias's gradient with the slots' (functorch's generated class, made
    once). No jvp: a grad level's Function is never asked for one (torch's generated class
    keeps its jvp for jvp levels only)."""
    if level in _GRAD_FUNCTIONS:
        return _GRAD_FUNCTIONS[level]

    def forward(c, k, bias, *tensors):
        top = peek_interpreter_stack()  # this level's interpreter
        inner = [None if t is None else _unwrap_for_grad(t, level) for t in tensors]
        b = None if bias is None else _unwrap_for_grad(bias, level)
        # the single-level Function turned off both gradient modes: on again (forward-mode
        # AD) and the grad mode the level was entered with, as functorch's generated forward
        # and its interpreter's lower() set them (flags, not context managers: ≈ 2 µs a call)
        grad_mode, fwd_mode = torch.is_grad_enabled(), torch._C._is_fwd_grad_enabled()
        torch._C._set_grad_enabled(CGradInterpreterPtr(top).prevGradMode())
        torch._C._set_fwd_grad_enabled(True)
        saved = pop_dynamic_layer_stack()
        try:
            out = _lowered_call(c, k, inner, b)
        finally:
            push_dynamic_layer_stack(saved)
            torch._C._set_fwd_grad_enabled(fwd_mode)
            torch._C._set_grad_enabled(grad_mode)
        return _wrap_for_grad(out, level)

    def setup_context(ctx, inputs, output):
        c, k, _bias, *tensors = inputs
        ctx.c, ctx.k = c, k
        ctx.save_for_backward(*tensors)

    def backward(ctx, g):
        slots, rest = ctx.saved_tensors[:4], tuple(ctx.saved_tensors[4:])
        k, needs = ctx.k, ctx.needs_input_grad  # (c, k, bias, y, x, act, w, *rest)
        if g is None:
            return (None,) * len(needs)
        *grads, dbias = _gradients(ctx.c, k, g, slots, rest,
                                   [j != k and needs[3 + j] for j in range(4)], needs[2])
        return (None, None, dbias, *grads, *(None for _ in rest))

    function = type(f"_SlotGrad{level}", (_SingleLevelFunction,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
    })
    _GRAD_FUNCTIONS[level] = function
    return function


def _lowered_call(c: Contraction, k: int, tensors: Sequence, bias: torch.Tensor | None):
    """G_k of `tensors` (slots, then rest), plus `bias` for the forward, one level below a
    grad (its level popped)."""
    if k == Y:
        return forward(c, tensors[X], tensors[ACT], tensors[W], tuple(tensors[4:]), bias)
    return apply(c, k, tensors[:4], tuple(tensors[4:]))


def _through_grad(top, c: Contraction, k: int, slots: Sequence, rest: tuple,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """G_k (plus `bias` for the forward) under the innermost grad `top`: where autograd at its
    level records the call (a tensor G_k depends on needs a gradient there), the operands
    lifted to its level, then its single-level Function (custom_function_call's grad rule,
    without a new class a call); where it does not, the call one level down, wrapped, as
    functorch's grad level takes an aten op that it does not record (`_below_grad`)."""
    tensors = [None if t is None else unwrap_if_dead(t) for t in (*slots, *rest)]
    if bias is not None:
        bias = unwrap_if_dead(bias)
    # slot k only gives the result's shape
    if not calls.records_gradient((*tensors[:k], *tensors[k + 1:], bias)):
        return _below_grad(top, (*tensors, bias),
                           lambda inner: _lowered_call(c, k, inner[:-1], inner[-1]))
    lift = CGradInterpreterPtr(top).lift
    lifted = [None if t is None else lift(t) for t in tensors]
    # torch's enable_single_level_autograd_function, without its generator context manager
    # (0.75 µs of 0.88 a call, twice in each step of a grad under vmap)
    allowed = get_single_level_autograd_function_allowed()
    set_single_level_autograd_function_allowed(True)
    try:
        return _grad_function(top.level()).apply(c, k, None if bias is None else lift(bias),
                                                 *lifted)
    finally:
        set_single_level_autograd_function_allowed(allowed)


def _below_grad(top, tensors: Sequence, call: Callable[[list], _R]) -> _R:
    """`call` of `tensors` (None kept; no dead wrappers) one level below the grad `top`, whose
    autograd records nothing of it: unwrapped at its level, the level popped (and no_grad
    restored where the level was entered from it), the result (a tensor, or a list of
    tensors and None) wrapped at the level, as functorch's grad level takes an aten op."""
    level = top.level()
    inner = [None if t is None else _unwrap_for_grad(t, level) for t in tensors]
    with _Lowered(no_grad=not CGradInterpreterPtr(top).prevGradMode()):
        out = call(inner)
    if isinstance(out, torch.Tensor):
        return _wrap_for_grad(out, level)
    return [None if t is None else _wrap_for_grad(t, level) for t in out]


# ---- gradients ------------------------------------------------------------------------------
# A backward (of _Slot or of a grad level's Function) asks for the gradients of the slots G_k
# depends on, and of the forward's bias. Each is an op call (module docstring), recorded by
# every transform active: `apply` per gradient, the bias's an aten sum of g over the rows.
# Two cases are taken whole, one level down at a time (docs/notes/cpu-kernels.md, "vmap over
# stacked heads, third pass (issue 43, stop 47)"):
# - under the innermost grad, gradients that nothing requiring a gradient at its level feeds
#   (a sum loss's cotangent, x and act not differentiated) are computed one level down and
#   wrapped, as the grad level takes an aten op it does not record: no Function at its level;
# - under the innermost vmap, stacked heads' weight and bias gradients (the forward's, with
#   x and act shared and not differentiated) are ONE eager backend call on the folded dy
#   [B, N*O] and weight [N*O, I, P], as an eager backward of the op on the folded weight
#   makes it, and the bias's the same sum over B of the folded dy.


def _gradients(c: Contraction, k: int, g: torch.Tensor, slots: Sequence, rest: tuple,
               needs: Sequence[bool], need_bias: bool) -> list:
    """[the gradients of slots 0..3 where `needs` (None elsewhere), then the bias's where
    `need_bias`] of G_k at `slots` for its incoming gradient `g` (slot k's shape)."""
    top = _innermost()
    if top is not None:
        if top.key() == TransformType.Grad:
            g, slots = unwrap_if_dead(g), [None if t is None else unwrap_if_dead(t)
                                           for t in slots]
            # slot i feeds every gradient asked for but its own (slot k's place is g's)
            asked = sum(needs)
            feeds = (g, *rest, *(t for i, t in enumerate(slots) if i != k and asked > needs[i]))
            if not calls.records_gradient(feeds):
                return _below_grad(top, (g, *slots, *rest), lambda inner: _gradients(
                    c, k, inner[0], inner[1:5], tuple(inner[5:]), needs, need_bias))
        elif top.key() == TransformType.Vmap:
            folded = _folded_gradients(top, c, k, g, slots, rest, needs, need_bias)
            if folded is not None:
                return folded
    # slot j's own tensor stands in its place: it gives the result's shape
    grads = [apply(c, j, _replaced(slots, k, g), rest) if need else None
             for j, need in enumerate(needs)]
    return [*grads, bias_gradient(g) if need_bias else None]


def _folded_gradients(top, c: Contraction, k: int, g: torch.Tensor, slots: Sequence,
                      rest: tuple, needs: Sequence[bool], need_bias: bool) -> list | None:
    """Stacked heads' weight and bias gradients of the forward (k = Y) under the innermost
    vmap `top`, dy = `g` and the weight [N, O, I, P] batched, x and act shared and not
    differentiated, as ONE eager backend call one level down: `calls.gradients` on the folded
    dy [B, N*O] and weight [N*O, I, P] (each output's sums its own, the loop's bits), the
    bias's `bias_gradient` of the folded dy (the folded call's bits). None where that is not
    the case (or autograd records the call one level down): `_gradients`' call per slot."""
    if (k != Y or not c.fold_outputs or rest or needs[X] or needs[ACT]
            or not (needs[W] or need_bias)):
        return None
    level, n = top.level(), CVmapInterpreterPtr(top).batchSize()
    (dy, dy_dim), (x, x_dim), (act, act_dim), (w, w_dim) = (
        _unwrapped(t, level) for t in (g, *slots[1:]))
    if dy_dim is None or w_dim is None or x_dim is not None or act_dim is not None:
        return None
    with _Lowered():
        if not calls.eager_route((dy, x, act, w)) or calls.records_gradient((dy, x, act)):
            return None
        dy = dy.movedim(dy_dim, 1)  # [B, N, O]
        rows, outputs = dy.shape[0], dy.shape[2]  # explicit sizes: a view of an empty tensor
        dy = dy.reshape(rows, n * outputs)  # dy's one copy (a cotangent is often expanded)
        dw = None
        if needs[W]:
            w = w if w_dim == 0 else w.movedim(w_dim, 0)
            weight = w.reshape(n * outputs, *w.shape[2:])
            shape = Shape(rows, x.shape[1], act.shape[1], n * outputs)
            dw = calls.gradients(c.impl, dy, (x, act, weight), (), None, c.names,
                                 (False, False, True), calls.is_empty(shape))[W - 1]
            dw = _add_batch_dim(dw.view(w.shape), 0, level)
        db = (_add_batch_dim(bias_gradient(dy).view(n, outputs), 0, level) if need_bias
              else None)
    return [None, None, None, dw, db]


# ---- vmap ----------------------------------------------------------------------------------
# Rows [B, ...] (y, x, act) batched over N, the weight not: one call on N*B rows, for the
# forward and the gradients of x and act (each row's result its own). Stacked weights
# [N, O, I, P] (an ensemble) with x and act shared: one call on the weight [N*O, I, P], for
# the forward and the weight's gradient (each output's result its own). Anything else (the
# weight's gradient for batched rows, batched rows and weights together, the sparse op's
# stacked values or index): one call per n, stacked.

_ROWS = (Y, X, ACT)


def batched(n: int, dims: Sequence[int | None], c: Contraction, k: int,
            tensors: Sequence) -> tuple[torch.Tensor, int | None]:
    """(G_k over a batch of `n`, its batch dim) for `tensors` = (y, x, act, w, *rest), each
    batched at `dims` (None: shared)."""
    slots, rest = list(tensors[:4]), tuple(tensors[4:])
    slot_dims, rest_dims = list(dims[:4]), dims[4:]
    inputs = [j for j in range(4) if j != k and slot_dims[j] is not None]
    if not inputs and all(d is None for d in rest_dims):
        # only the shape-giving slot is batched: the result is the same for every n
        if slot_dims[k] is not None:
            slots[k] = slots[k].select(slot_dims[k], 0)
        return apply(c, k, slots, rest), None
    if all(d is None for d in rest_dims) and slot_dims[W] is None and k != W:
        return _fold_rows(n, slots, slot_dims, rest, c, k), 0
    if (c.fold_outputs and slot_dims[X] is None and slot_dims[ACT] is None and k in (Y, W)
            and all(d is None for d in rest_dims)):
        return _fold_outputs(n, slots, slot_dims, rest, c, k)
    results = []
    for i in range(n):
        one = [t if d is None or t is None else t.select(d, i)
               for t, d in zip(slots, slot_dims, strict=True)]
        one_rest = tuple(t if d is None else t.select(d, i)
                         for t, d in zip(rest, rest_dims, strict=True))
        results.append(apply(c, k, one, one_rest))
    return torch.stack(results), 0


def _stacked(t: torch.Tensor, d: int | None, n: int) -> torch.Tensor:
    """`t` with its batch dim first (expanded to `n` when shared)."""
    return t.expand(n, *t.shape) if d is None else t.movedim(d, 0)


def _fold_rows(n: int, slots: list, dims: list, rest: tuple, c: Contraction,
               k: int) -> torch.Tensor:
    """G_k on the N*B rows, [N, B, ...]: the rows of each n stay their own."""
    folded = list(slots)
    # B, explicit (a view of an empty tensor needs its sizes); x is always there
    rows = _stacked(slots[X], dims[X], n).shape[1]
    for j in _ROWS:
        if slots[j] is not None:
            t = _stacked(slots[j], dims[j], n)
            folded[j] = t.reshape(n * rows, *t.shape[2:])
    out = apply(c, k, folded, rest)
    return out.view(n, rows, *out.shape[1:])


def _fold_outputs(n: int, slots: list, dims: list, rest: tuple, c: Contraction,
                  k: int) -> tuple[torch.Tensor, int]:
    """G_k (the forward or the weight's gradient) of the dense weight [N*O, I, P]: the
    outputs of each n stay their own. y [B, N*O] comes back as [B, N, O], batched at 1."""
    folded = list(slots)
    w = _stacked(slots[W], dims[W], n)
    outputs = w.shape[1]  # O (explicit sizes: a view of an empty tensor needs them)
    folded[W] = w.reshape(n * outputs, *w.shape[2:])
    if slots[Y] is not None:
        dy = _stacked(slots[Y], dims[Y], n)  # [N, B, O] -> [B, N*O]
        folded[Y] = dy.movedim(0, 1).reshape(dy.shape[1], n * outputs)
    out = apply(c, k, folded, rest)
    if k == Y:
        return out.view(out.shape[0], n, outputs), 1
    return out.view(w.shape), 0
