"""The sparse op: `glai::sparse_estimator`, its backward op, fakes and autograd.

As glai_kernels/op.py for the dense op, and with the same core (glai_kernels/calls.py: the
forward body, the plain backward, the fakes, the autograd and the eager route; the same
selection, `Registry.resolve`, so "auto" follows the machine's sparse dispatch table when it
ships one): every sparse backend runs behind these two custom
ops, which take the values, the ten KeptIndex tensors (as a list, in KeptIndex order) and
the backend's name; the public `estimator` resolves "auto" and $GLAI_BACKEND first, so a
forward and its backward run on one backend. The forward returns `saved`, the group sums
Zg [B, G] (layout.py), when `save` is true and the backend has a forward_saving; else an
empty tensor. `save` has no default on purpose: the dispatcher drops an argument equal to
its default, and the autograd wrapper for an op with a list input then expects one fewer
gradient.

An eager call on a SparsePathWeight (plain tensors, no autocast, mode or transform) remembers
that its checks passed; the next such call with the same unedited index runs without
`check_inputs`' Python ("eager calls on a SparsePathWeight checked before", below).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch.autograd import forward_ad

from glai_kernels import autocast, calls, dispatch, transforms
from glai_kernels.autocast import autocast_dtype, autocast_inputs
from glai_kernels.registry import AUTO, ENV_VAR, Backend, environment_backend
from glai_kernels.sparse import checked
from glai_kernels.sparse.contract import SparseShape, as_index, check_inputs
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR
from glai_kernels.sparse.weight import SparsePathWeight

_NAMES = ("x", "act", "values")  # the gradients' names in the result checks


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
    return calls.forward_op(impl, shape, (x, act, values), (_contiguous_list(index),), bias,
                            save)


def _contiguous_list(index: list[torch.Tensor]) -> KeptIndex:
    return as_index([t.contiguous() for t in index])


@sparse_estimator_op.register_fake
def _sparse_fake(x, act, values, index, bias, backend, save):
    shape = check_inputs(x, act, values, index, bias, weight_name="values")
    return calls.fake_forward(SPARSE_ESTIMATOR, backend, shape, x, save)


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
    return calls.backward(  # type: ignore[return-value]
        impl, dy, (x, act, values), (_contiguous_list(index),), saved, _NAMES, needs,
        calls.is_empty(shape))


@sparse_estimator_backward_op.register_fake
def _sparse_backward_fake(dy, x, act, values, index, saved, needs, backend):
    check_inputs(x, act, values, index, weight_name="values")
    return calls.fake_gradients((x, act, values), needs)


def _setup_context(ctx, inputs, output):
    x, act, values, index, _bias, backend, *_ = inputs
    calls.setup_context(ctx, (x, act, values), tuple(index), output[1], backend)


def _backward(ctx, dy, _dsaved):
    dx, dact, dvalues, dbias = calls.op_gradients(ctx, dy, sparse_estimator_backward_op,
                                                  bias_position=4)
    no_index_grads = [None] * len(KeptIndex._fields)  # a list input takes a list
    return dx, dact, dvalues, no_index_grads, dbias, None, None


sparse_estimator_op.register_autograd(_backward, setup_context=_setup_context)


# ---- double backward ------------------------------------------------------------------------
# As the dense op's (calls.py, "the backward ops' autograd"): the values in place of the
# weight, the index a non-differentiable list.


def _backward_setup_context(ctx, inputs, output):
    dy, x, act, values, index, _saved, _needs, backend = inputs
    calls.backward_setup_context(ctx, dy, (x, act, values), tuple(index), backend)


def _forward_of(x, act, values, index, backend: str) -> torch.Tensor:
    return sparse_estimator_op(x, act, values, list(index), None, backend, False)[0]


def _grad_of(which: int, dy, x, act, values, index, backend: str) -> torch.Tensor:
    """One gradient (0: x, 1: act, 2: values) of the op at (x, act, values) for dy."""
    needs = [which == 0, which == 1, which == 2]
    return sparse_estimator_backward_op(dy, x, act, values, list(index), x.new_empty(0), needs,
                                        backend)[which]


def _double_backward(ctx, ggx, ggact, ggvalues):
    grads = calls.double_backward(ctx, (ggx, ggact, ggvalues), _forward_of, _grad_of)
    return (*grads, [None] * len(KeptIndex._fields), None, None, None)


sparse_estimator_backward_op.register_autograd(_double_backward,
                                               setup_context=_backward_setup_context)


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
                 backend: str | None = None, *, ones: bool = False) -> torch.Tensor:
    """`estimator` on the backend `impl` when the caller resolved it already (`resolve(backend,
    x.device, x.dtype, auto_call(...))`; GLAIHead records it), so it is not resolved twice;
    `impl` None: resolve `backend` after the argument checks, as `estimator` does.

    Shapes as `estimator`: x [B, I], act [B, P], sw (O, I, P) with values [K], bias [O] ->
    y [B, O]; the same checks of every argument, in the same order. `ones`: x is [B, I - 1]
    and the weight's last input is the constant 1 (a GLAI head's, carrying its hidden biases):
    the call is that of `torch.constant_pad_nd(x, (0, 1), 1.0)`, the same values and gradients,
    made without that tensor where the backend's eager node supplies the ones
    (docs/notes/pipeline.md, "The constant-1 row written by the transpose, x^T kept for the
    backward (issue 41, stop 50)").
    """
    if ones:
        # a backend resolved already whose eager node cannot supply the ones (any but `cpp`)
        # gets x padded at once: one remembered-call attempt, not two
        if impl is None or getattr(impl.eager, "supplies_ones", False):
            y = _remembered_call(x, act, sw, bias, impl, backend, True)
            if y is not None:
                return y
        x = torch.constant_pad_nd(x, (0, 1), 1.0)
    y = _remembered_call(x, act, sw, bias, impl, backend)
    if y is not None:
        return y
    index, values = sw.index, sw.values
    dtype = autocast_dtype(x.device.type) if isinstance(x, torch.Tensor) else None
    if dtype is not None:
        # a torch.autocast region: the dense op's casts (op.py), before the checks, and the
        # custom op below (not the eager route), whose Autocast key runs the backend outside it
        x, act, values, bias = autocast_inputs((x, act, values, bias), x.device.type, dtype)
    # the remembered checks key on tensor ids and versions: eager calls only (under
    # torch.compile the sizes are checked while tracing, and the compiled code's custom op
    # call checks the real tensors)
    remembered = None if torch.compiler.is_compiling() else sw.checked_index_sizes
    shape = check_inputs(x, act, values, index, bias, index_check=remembered)
    if impl is None:
        impl = resolve(backend, x.device, x.dtype, auto_call(x, act, sw, backend))
    tensors = (x, act, values, bias)
    if dtype is None and calls.eager_route(tensors):
        # plain tensors in eager mode: the op's work without its Python (calls.py)
        rest = (contiguous_index(index),)
        _remember(sw, index, rest[0], x, shape)
        if not calls.records_gradient(tensors):
            return calls.direct_forward(impl, shape, (x, act, values), rest, bias)
        return calls.record(_EagerSparse, impl, shape, (x, act, values), rest, bias,
                            act.requires_grad)
    if calls.transformed():
        # batched or dual tensors: the op as a functorch-ready Function (transforms.py)
        return transforms.forward(_contraction(impl), x, act, values, tuple(index), bias)
    save = torch.is_grad_enabled() and act.requires_grad
    y, _ = sparse_estimator_op(x, act, values, list(index), bias, impl.name, save)
    return y


def contiguous_index(index: KeptIndex) -> KeptIndex:
    """`index` itself when every tensor of it is contiguous (the kernels' layout), else a
    contiguous copy."""
    if all(t.is_contiguous() for t in index):
        return index
    return KeptIndex(*(t.contiguous() for t in index))


# ---- eager calls on a SparsePathWeight checked before ------------------------------------
# In an ordinary training step at the paper's B = 16 the Python around the kernels costs 2-3x
# what it costs timed alone (the step's working set evicts it between calls): `check_inputs`
# measured ≈ 16 µs of the A2 step against ≈ 7 µs alone (docs/notes/pipeline.md, "The
# ordinary GLAI step, second pass (issue 41, stop 46)"). An eager call on a SparsePathWeight
# whose index passed `check_inputs` remembers that check on the index's entry in
# sparse/checked.py's memory: the next call with the same index tensors, unedited (that
# memory's one key: identity, version, data pointer, shape), and inputs the checks would pass
# runs without the checks' Python; anything else takes the full path, whose checks raise the
# errors.


_INDEX_TENSORS = len(KeptIndex._fields)


class _Remembered(NamedTuple):
    """What the last eager call with one index found, kept on that index's entry in
    sparse/checked.py's memory (under its key: identities, versions, data pointers, shapes)."""

    dtype: torch.dtype
    device: torch.device
    autocast: str | None  # the device type when torch.autocast has one for it
    sizes: tuple[int, int, int, int, int]  # (O, I, P, K, G), none of them 0
    bias_shape: torch.Size  # [O]
    index: KeptIndex | None  # a contiguous copy for the backend; None: the index itself is
    # (the entry holds only weak references to the index: this must not keep it alive)


def _remember(sw: SparsePathWeight, index: KeptIndex, contiguous: KeptIndex, x: torch.Tensor,
              shape: SparseShape) -> None:
    """Keep what an eager call on `sw` just checked (`check_inputs` passed for x's dtype
    and device), when `index` is sw's own buffers, in order, and nothing is empty."""
    tensors = tuple(sw._buffers.values())
    if (len(tensors) != len(index) or not all(map(operator.is_, tensors, index))
            or not (shape.outputs and shape.inputs and shape.paths and shape.nnz
                    and shape.groups)):
        return
    device = x.device
    checked.remember_call(checked.key_of(index, device, shape.nnz), index, _Remembered(
        x.dtype, device, device.type if device.type in autocast.AUTOCAST_DEVICES else None,
        (shape.outputs, shape.inputs, shape.paths, shape.nnz, shape.groups),
        torch.Size([shape.outputs]), None if contiguous is index else contiguous))


def _remembered_call(x, act, sw: SparsePathWeight, bias: torch.Tensor | None,
                     impl: Backend | None, backend: str | None,
                     ones: bool = False) -> torch.Tensor | None:
    """`run_resolved`'s y [B, O] for an eager call on `sw` after one that `_remember` saw
    pass its checks: plain tensors, the same unedited index, no autocast, mode or transform,
    and B > 0; None for anything else, and for inputs the checks would refuse (the full path
    then checks them and raises its errors).

    A backend with its own eager node (`Backend.eager`: the `cpp` backend's C++ node, whose
    kernels' binding checks x, act and values against the index: ranks, dtypes, devices,
    sizes) takes them unchecked here but for the bias (its node adds it with broadcasting)
    and B; any RuntimeError of that call sends it to the full path. Other backends get the
    checks in Python, against the remembered call's dtype, device and sizes. `ones` (x lacks
    the constant-1 last input): only an eager node that supplies it (`supplies_ones`) takes
    the call; None otherwise, and the caller pads x."""
    if torch.compiler.is_compiling():  # Dynamo traces the full path (and its checks)
        return None
    values = sw._parameters.get("values")
    # its index buffers, in KeptIndex order (`_remember` saw them so); the length is checked
    tensors = tuple.__new__(KeptIndex, sw._buffers.values())
    if not (type(x) is torch.Tensor and type(act) is torch.Tensor
            and type(values) in calls._PLAIN and (bias is None or type(bias) in calls._PLAIN)
            and len(tensors) == _INDEX_TENSORS
            # calls.eager_route's modes and calls.transformed, inline
            and not (torch._C._len_torch_dispatch_stack()
                     or torch._C._is_torch_function_mode_enabled()
                     or torch._C._are_functorch_transforms_active()
                     or forward_ad._current_level >= 0)):
        return None
    kept = checked.recall_call(checked.key_of(tensors, values.device, values.numel()), tensors)
    if type(kept) is not _Remembered or (kept.autocast is not None
                                         and torch.is_autocast_enabled(kept.autocast)):
        return None
    dtype, device = kept.dtype, kept.device
    if impl is None:
        # what resolving may assume; its own errors come after the checks', from the full path
        if not (x.dtype is dtype and x.device == device and x.dim() == 2 and act.dim() == 2):
            return None
        try:
            impl = resolve(backend, device, dtype, auto_call(x, act, sw, backend, ones))
        except (ValueError, RuntimeError):
            return None
    rest = (tensors if kept.index is None else kept.index,)
    eager = impl.eager
    if ones and not getattr(eager, "supplies_ones", False):
        return None
    if eager is not None:
        if not (x.numel() > 0 and (bias is None or (bias.dtype is values.dtype
                                                     and bias.shape == kept.bias_shape))):
            return None
        save = act.requires_grad and torch.is_grad_enabled()
        try:
            if ones:
                return eager(x, act, values, bias, save, *rest, ones=True)
            return eager(x, act, values, bias, save, *rest)
        except RuntimeError:
            return None
    outputs, inputs, paths, nnz, groups = kept.sizes
    if not (x.dtype is dtype and act.dtype is dtype and values.dtype is dtype
            and x.dim() == 2 and act.dim() == 2 and values.dim() == 1
            and x.shape[1] == inputs and act.shape[1] == paths and values.shape[0] == nnz
            and act.shape[0] == x.shape[0] > 0
            and x.device == device and act.device == device and values.device == device
            and (bias is None or (bias.dtype is dtype and bias.shape == kept.bias_shape
                                  and bias.device == device))):
        return None
    shape = SparseShape(x.shape[0], inputs, paths, outputs, nnz, groups)
    if not calls.records_gradient((x, act, values, bias)):
        return calls.direct_forward(impl, shape, (x, act, values), rest, bias)
    return calls.record(_EagerSparse, impl, shape, (x, act, values), rest, bias,
                        act.requires_grad)


def _graph_backward(dy, x, act, values, index: KeptIndex, saved, needs, backend: str):
    """The backward op for a backward that builds a graph (the op takes the index as a
    list)."""
    return sparse_estimator_backward_op(dy, x, act, values, list(index), saved, needs, backend)


class _EagerSparse(calls.EagerFunction):
    """The sparse op's eager node (calls.EagerFunction); a backward that builds a graph
    (create_graph) calls the backward op, whose own autograd formula gives gradients of
    gradients."""

    names = _NAMES
    graph_backward = _graph_backward


def _check(x, act, values, packed) -> SparseShape:
    return check_inputs(x, act, values, packed[0], weight_name="values")


def _pack(rest: tuple) -> tuple[KeptIndex]:
    return (KeptIndex(*rest),)


def _contraction(impl: Backend) -> transforms.Contraction:
    """The sparse op on `impl` for transforms.py: the index travels as its ten tensors."""
    return transforms.Contraction(impl, _check, _NAMES, fold_outputs=False, pack=_pack)


def auto_call(x: torch.Tensor, act: torch.Tensor, sw: SparsePathWeight,
              backend: str | None, ones: bool = False) -> dispatch.Call | None:
    """What "auto" is told of a sparse call: its mode and dense shape (B, I, P, O; as a plain
    tuple in `dispatch.Call`'s order), or None where it cannot use them (a named backend,
    torch.compile, a machine kind without a sparse table), as the dense op's `auto_call`.
    `ones`: x lacks the constant-1 last input (`run_resolved`), so I is one more."""
    if ((backend is not None and backend != AUTO) or torch.compiler.is_compiling()
            or not dispatch.has_table(x.device.type, SPARSE_ESTIMATOR.op)):
        return None
    batch, inputs = x.shape
    return (dispatch.call_mode(x, act, sw.values), batch,  # type: ignore[return-value]
            inputs + ones, act.shape[1], sw.shape[0])


def requested_name(backend: str | None) -> str:
    """The sparse backend `backend` (else $GLAI_BACKEND, else "auto") asks for. A
    $GLAI_BACKEND naming a backend only the dense op has is an error that says so."""
    if backend is None:
        chosen = environment_backend()
        if chosen and chosen != AUTO and chosen not in SPARSE_ESTIMATOR.names():
            known = ", ".join([AUTO, *sorted(SPARSE_ESTIMATOR.names())])
            raise ValueError(f"${ENV_VAR}={chosen!r} names no sparse estimator backend; "
                             f"sparse backends: {known} (pass backend= to override)")
    return SPARSE_ESTIMATOR.requested_name(backend)


def resolve(backend: str | None, device: torch.device, dtype: torch.dtype,
            call: dispatch.Call | None = None) -> Backend:
    """The sparse backend that runs for these tensors: `backend`, else $GLAI_BACKEND, else
    auto (`Registry.resolve`: the machine's sparse dispatch table for `call` when given and
    one exists, else the priorities), after `requested_name`'s check.

    Meta tensors never reach a backend (the ops' fakes give their shapes), so on the meta
    device the name is only validated, as the dense op does: the named backend, unchecked,
    or for "auto" `META_AUTO`, which stands for it (the fakes then save nothing).
    """
    meta = device.type == "meta"
    if not meta:
        # the registry's answer to these arguments, while nothing it read has changed
        # (Registry.resolved; docs/notes/pipeline.md, "The ordinary GLAI step, fourth pass:
        # what the head's forward asks every step (issue 41, stop 50)")
        known = SPARSE_ESTIMATOR.resolved(backend, device, dtype, call)
        if known is not None:
            return known
    # a name given is checked by Registry.resolve as requested_name would (the same error):
    # three calls fewer on every forward (docs/notes/pipeline.md, "The ordinary GLAI step,
    # second pass (issue 41, stop 46)")
    name = requested_name(backend) if backend is None or meta else backend
    if meta:
        return META_AUTO if name == AUTO else SPARSE_ESTIMATOR.get(name)
    # `backend` as given, so the answer is kept under what the next call will ask
    return SPARSE_ESTIMATOR.resolve(backend, device, dtype, call)


def _never_on_meta(*_args, **_kwargs):
    raise RuntimeError("sparse estimator: 'auto' on meta tensors names no backend; only the "
                       "ops' fakes run there")


META_AUTO = Backend(name=AUTO, forward=_never_on_meta, backward=_never_on_meta,
                    devices=("meta",), description="'auto' on meta tensors (shapes only)")
"""What `resolve` gives for "auto" on the meta device: a name for the ops, never run."""


# ---- autocast ------------------------------------------------------------------------------
# As the dense op's (glai_kernels/autocast.py): the values are cast with the other floating
# inputs, the index list is left alone, and no matmul inside a backend (the `torch` backend's
# CSR products) is autocast again.
autocast.register("sparse_estimator", sparse_estimator_op, "sparse_estimator_backward",
                  sparse_estimator_backward_op)
