"""The sparse op's contract, stated once: the dense op's (glai_kernels/contract.py) with the
weight given as values [K] plus a KeptIndex (layout.py) instead of [O, I, P].

    x [B, I]   act [B, P]   values [K]   index (O, I, P from its ptr arrays)   bias [O]
    y [B, O]

The public `estimator`, the custom ops and their fakes all call `check_inputs`. It checks
ranks, dtypes, devices and every size the index implies, and the index's contents in full
(layout.check_contents: bounds, order, every derived tensor), once per index: `checked_sizes`
remembers an index that passed by its tensors' identities and versions (checked.py), so a
repeated call with the same unedited tensors pays a dict lookup, and a tensor edited in place
since is checked again. A SparsePathWeight validates its index where it is built or loaded and
records it there, so neither `estimator` on it nor a custom op call with its index (under
autocast, a transform, or direct) checks it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from glai_kernels.contract import SUPPORTED_DTYPES
from glai_kernels.sparse import checked
from glai_kernels.sparse.layout import INDEX_DTYPE, KeptIndex, check_contents
from glai_kernels.sparse.registry import SparseShape

WHO = "sparse estimator"
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # fake and functional tensors are subclasses


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-d {t.dtype} tensor of shape {list(t.shape)} on {t.device}"
    return type(t).__name__


def _require(name: str, t: object, rank: int, dims: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{WHO}: {name} must be a tensor {dims}, got {_describe(t)}")
    if t.dim() != rank:
        raise ValueError(f"{WHO}: {name} must be {rank}-d {dims}, got {_describe(t)}")
    return t


def as_index(index: Sequence[torch.Tensor]) -> KeptIndex:
    """A KeptIndex from its ten tensors (a custom op passes them as a list)."""
    if isinstance(index, KeptIndex):
        return index
    if len(index) != len(KeptIndex._fields):
        raise ValueError(f"{WHO}: the index must hold {len(KeptIndex._fields)} tensors "
                         f"({', '.join(KeptIndex._fields)}), got {len(index)}")
    return KeptIndex(*index)


def check_index(index: KeptIndex, device: torch.device, nnz: int) -> tuple[int, int, int, int]:
    """(O, I, P, G) of an index whose tensors are int32, 1-d, on `device`, of lengths that
    agree with each other and with values [K = nnz]."""
    for name, t in index._asdict().items():
        _require(f"index.{name}", t, 1, "(int32)")
        if t.dtype != INDEX_DTYPE:
            raise TypeError(f"{WHO}: index.{name} must be int32, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{WHO}: index.{name} must be on the same device as x ({device}), "
                             f"got {t.device}")
    groups = index.group_outputs.numel()
    lengths = {"inputs": nnz, "input_entries": nnz, "entry_groups": nnz,
               "group_ptr": groups + 1, "group_paths": groups, "path_groups": groups}
    for name, expected in lengths.items():
        got = getattr(index, name).numel()
        if got != expected:
            raise ValueError(f"{WHO}: index.{name} must have {expected} entries (K = {nnz} from "
                             f"values, G = {groups} from index.group_outputs), got {got}")
    for name in ("output_ptr", "input_ptr", "path_ptr"):
        if getattr(index, name).numel() < 1:
            raise ValueError(f"{WHO}: index.{name} must have at least one entry")
    return (*index.shape, groups)


def checked_sizes(index: KeptIndex, device: torch.device, nnz: int,
                  who: str = WHO) -> tuple[int, int, int, int]:
    """`check_index(index, device, nnz)` ((O, I, P, G), or its error) and, where the index's
    values can be read, `layout.check_contents(index, who)`, remembered (checked.py): an
    index checked before, unedited since, costs one dict lookup.

    Under torch.compile's tracing (fake tensors) and on meta tensors only the sizes are
    checked: nothing there reads an index. The compiled code runs the custom ops with the
    real tensors, whose call checks them here (a SparsePathWeight's index: remembered)."""
    if torch.compiler.is_compiling():
        return check_index(index, device, nnz)
    key = checked.key_of(index, device, nnz)
    sizes = checked.recall(key, index)
    if sizes is None:
        sizes = check_index(index, device, nnz)
        if _has_data(index):
            check_contents(index, who)
            checked.remember(key, index, sizes)
    return sizes


def _has_data(index: KeptIndex) -> bool:
    """Whether the index's values can be read: plain tensors off the meta device, outside
    torch.compile's tracing (fake tensors stand in for them there, and in the fakes)."""
    return (not torch.compiler.is_compiling()
            and all(type(t) in _PLAIN and t.device.type != "meta" for t in index))


def check_inputs(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                 index: Sequence[torch.Tensor], bias: torch.Tensor | None = None,
                 weight_name: str = "sw",
                 index_check: Callable[[KeptIndex, torch.device, int],
                                       tuple[int, int, int, int]] | None = None) -> SparseShape:
    """Check ranks, sizes, dtypes and devices; return the call's SparseShape.

    `index_check` replaces `checked_sizes` (same arguments, same result and errors): a
    SparsePathWeight's `checked_index_sizes`, for its own index.

    Raises ValueError (shapes, devices) or TypeError (dtypes, non-tensors), naming the
    argument; `weight_name` is what a message calls the kept-path weight.
    """
    _require("x", x, 2, "[B, I]")
    _require("act", act, 2, "[B, P]")
    _require(f"{weight_name}.values", values, 1, "[K]")
    if bias is not None:
        _require("bias", bias, 1, "[O]")
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{WHO}: x must have a floating dtype ({names}), got {x.dtype}")
    named = [("act", act), (f"{weight_name}.values", values)]
    named += [("bias", bias)] if bias is not None else []
    for name, t in named:
        if t.dtype != x.dtype:
            raise TypeError(
                f"{WHO}: {name} must have the same dtype as x ({x.dtype}), got {t.dtype}")
    for name, t in named:
        if t.device != x.device:
            raise ValueError(
                f"{WHO}: {name} must be on the same device as x ({x.device}), got {t.device}")
    # not `index_check or check_index`: torch.compile (2.11) cannot branch on a bound
    # method's truth value
    check = checked_sizes if index_check is None else index_check
    kept = as_index(index)
    outputs, inputs, paths, groups = check(kept, x.device, values.numel())
    batch = x.shape[0]
    if act.shape[0] != batch:
        raise ValueError(f"{WHO}: act must have B = {batch} rows like x (act [B, P]), "
                         f"got act of shape {list(act.shape)}")
    shape = [outputs, inputs, paths]
    if inputs != x.shape[1]:
        raise ValueError(f"{WHO}: {weight_name} [O, I, P] must have I = {x.shape[1]} "
                         f"(x.shape[1]), got {weight_name} of shape {shape}")
    if paths != act.shape[1]:
        raise ValueError(f"{WHO}: {weight_name} [O, I, P] must have P = {act.shape[1]} "
                         f"(act.shape[1]), got {weight_name} of shape {shape}")
    if bias is not None and bias.shape[0] != outputs:
        raise ValueError(f"{WHO}: bias must have shape [O] = [{outputs}] ({weight_name}.shape[0]),"
                         f" got {list(bias.shape)}")
    return SparseShape(batch, inputs, paths, outputs, values.numel(), groups)
