"""`SparsePathWeight`: the kept path weights of an [O, I, P] estimator weight, as values [K]
(the one trainable Parameter) plus the layout's index tensors (buffers; see layout.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glai_kernels.contract import SUPPORTED_DTYPES
from glai_kernels.sparse import checked
from glai_kernels.sparse.contract import check_index, checked_sizes
from glai_kernels.sparse.layout import (
    INDEX_DTYPE,
    KeptIndex,
    build_index,
    check_contents,
    index_from_entries,
)


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {list(t.shape)} on {t.device}"
    return type(t).__name__


class SparsePathWeight(nn.Module):
    """A kept-path estimator weight: `values` [K] (an nn.Parameter) and the KeptIndex buffers.

    The index is validated where it enters (here and in `load_state_dict`): sizes, bounds,
    order and every derived tensor (layout.check_contents), so an index that would send a
    kernel out of bounds or give a wrong y is refused with an error naming its field.

    `shape == (O, I, P)`, `nnz == K`; `to_dense()` gives the [O, I, P] weight with zeros at
    the paths that do not exist. `.to(device)` / `.to(dtype)` move the values (and the
    indices, which stay int32); `state_dict()` holds both, and loading a state dict of
    another K resizes this module to it.

    Loading keeps `values` the same Parameter object, so an optimizer built before a load
    steps the loaded values: of the same K, copied into it; of another K, its data replaced
    (the index buffers become new tensors). The optimizer's state for it then belongs to the
    old entries: load the optimizer's own state dict saved with the checkpoint (the usual
    resume), or build a new optimizer. Otherwise torch.optim.Adam refuses to step moments of
    the old size (a RuntimeError at `step()`), and `FusedSparseStep` resets them.

    Meta tensors: `.to("meta")` and `empty(shape, device="meta")` give a meta
    SparsePathWeight (shapes only; the sparse op runs its fakes on it). `from_dense` on a
    meta mask is refused: K is read from the mask's values.

    Build one with `from_dense(weight, mask)` or `from_entries(outputs, inputs, paths,
    values, shape)`.
    """

    values: nn.Parameter

    def __init__(self, values: torch.Tensor, index: KeptIndex,
                 requires_grad: bool = True) -> None:
        super().__init__()
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            raise ValueError(f"values must be a 1-d tensor [K], got {_describe(values)}")
        if values.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"values must have a floating dtype, got {values.dtype}")
        if values.numel() != index.nnz:
            raise ValueError(f"values has {values.numel()} entries but the index has "
                             f"K = {index.nnz}: values and indices must have the same length")
        _check_index_tensors(index, values.device, "SparsePathWeight")
        self.values = nn.Parameter(values.detach().clone().contiguous(),
                                   requires_grad=requires_grad)
        for name, t in index._asdict().items():
            self.register_buffer(name, t)
        self._remember_checked(values.device)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, mask: torch.Tensor) -> SparsePathWeight:
        """The entries of `weight` [O, I, P] where `mask` (bool [O, I, P]) is True."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
            raise ValueError(f"from_dense: weight must be a 3-d tensor [O, I, P], got "
                             f"{_describe(weight)}")
        if weight.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"from_dense: weight must have a floating dtype, got {weight.dtype}")
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"from_dense: mask must be a bool tensor, got {_describe(mask)}")
        if mask.dtype != torch.bool:
            raise TypeError(f"from_dense: mask must have dtype torch.bool, got {mask.dtype}")
        if mask.shape != weight.shape:
            raise ValueError(f"from_dense: mask must have weight's shape {list(weight.shape)}, "
                             f"got {list(mask.shape)}")
        if mask.device != weight.device:
            raise ValueError(f"from_dense: mask must be on weight's device ({weight.device}), "
                             f"got {mask.device}")
        if mask.is_meta:
            raise ValueError("from_dense: mask is on the meta device, which holds no values: "
                             "the kept entries (and K) are read from them. Build on a real "
                             "device and move with .to('meta'), or use SparsePathWeight.empty("
                             "shape, device='meta')")
        index = build_index(mask)
        o, i, s = index.entries()
        return cls(weight.detach()[o, i, s], index)

    @classmethod
    def from_entries(cls, outputs: torch.Tensor, inputs: torch.Tensor, paths: torch.Tensor,
                     values: torch.Tensor, shape: tuple[int, int, int]) -> SparsePathWeight:
        """Entry k is weight[outputs[k], inputs[k], paths[k]] = values[k], in any order;
        `shape` is (O, I, P). Indices out of range, duplicate entries and lengths that
        differ raise ValueError naming the argument."""
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            raise ValueError(f"values must be a 1-d tensor [K], got {_describe(values)}")
        if isinstance(outputs, torch.Tensor) and values.numel() != outputs.numel():
            raise ValueError(f"values has {values.numel()} entries, the indices have "
                             f"{outputs.numel()}: values and indices must have the same length")
        if isinstance(outputs, torch.Tensor) and values.device != outputs.device:
            raise ValueError(f"values must be on the indices' device ({outputs.device}), "
                             f"got {values.device}")
        index, order = index_from_entries(outputs, inputs, paths, tuple(shape))
        return cls(values.detach()[order], index)

    @classmethod
    def empty(cls, shape: tuple[int, int, int], dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> SparsePathWeight:
        """No kept entry (K = 0); `load_state_dict` then resizes it to what it loads. K = 0
        needs no values to read, so `device` may be "meta" (built on the CPU, then moved)."""
        meta = torch.device(device).type == "meta" if device is not None else False
        built = torch.device("cpu") if meta else device
        empty = cls.from_dense(torch.zeros(shape, dtype=dtype, device=built),
                               torch.zeros(shape, dtype=torch.bool, device=built))
        return empty.to("meta") if meta else empty

    @property
    def index(self) -> KeptIndex:
        # straight from the buffer dict: ten nn.Module.__getattr__ calls cost ≈ 15 µs, a
        # visible share of a training step at the paper's B = 16 (docs/notes/sparse.md, "Training
        # step ≤ MLP", second pass)
        buffers = self._buffers
        return KeptIndex(*(buffers[name] for name in KeptIndex._fields))

    def checked_index_sizes(self, index: KeptIndex, device: torch.device, nnz: int
                            ) -> tuple[int, int, int, int]:
        """`contract.checked_sizes(index, device, nnz)`: (O, I, P, G) after
        `contract.check_index` and `layout.check_contents`, remembered (sparse/checked.py)
        while `index` holds the same tensor objects, unedited. Construction validates and
        remembers this module's index, so only a buffer replaced (`sw.inputs = t`), edited
        in place or loaded into since is checked again here."""
        return checked_sizes(index, device, nnz, "SparsePathWeight")

    def _remember_checked(self, device: torch.device) -> None:
        """Record this module's own index (validated by the caller) as checked for values on
        `device`, so that no call with it (`estimator`, the custom ops) validates it again."""
        index = self.index
        if not _on_meta(index):
            checked.remember(checked.key_of(index, device, self.values.numel()), index,
                             (*index.shape, index.groups))

    @property
    def shape(self) -> tuple[int, int, int]:
        """(O, I, P)."""
        return self.index.shape

    @property
    def nnz(self) -> int:
        """K, the kept path weights."""
        return self.values.numel()

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(o, i, s), each int64 [K], in the layout's order (that of `values`)."""
        return self.index.entries()

    def mask(self) -> torch.Tensor:
        """bool [O, I, P]: True where a path weight is kept."""
        out = torch.zeros(self.shape, dtype=torch.bool, device=self.device)
        out[self.entries()] = True
        return out

    def to_dense(self) -> torch.Tensor:
        """The [O, I, P] weight (zeros where no path is kept), differentiable in `values`."""
        flat = self.values.new_zeros(self.shape).view(-1)
        o, i, s = self.entries()
        _, in_count, path_count = self.shape
        flat_index = (o * in_count + i) * path_count + s
        return flat.index_put((flat_index,), self.values).view(self.shape)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args,
                              **kwargs) -> None:
        # The index this would load (each field from the state dict, else the current one) is
        # validated before anything is copied: a refused state dict leaves the module as it was.
        fields = {name: state_dict.get(prefix + name, getattr(self, name))
                  for name in ("values", *KeptIndex._fields)}
        if all(isinstance(t, torch.Tensor) for t in fields.values()):
            # converted as loading will convert them (copy_ into the int32 buffers); into a
            # meta module, checked where the loaded tensors hold values
            device = self.values.device
            if device.type == "meta" and not any(t.is_meta for t in fields.values()):
                device = fields["values"].device
            incoming = KeptIndex(*(fields[name].to(device, INDEX_DTYPE)
                                   for name in KeptIndex._fields))
            _check_index_tensors(incoming, device, "load_state_dict", fields["values"].numel())
        # A state dict of another K (or shape) resizes the tensors before loading: the index
        # buffers are new tensors, `values` stays the same Parameter object with new data, so
        # an optimizer built before the load still steps it (class docstring).
        for name in ("values", *KeptIndex._fields):
            incoming = state_dict.get(prefix + name)
            current = getattr(self, name)
            if isinstance(incoming, torch.Tensor) and incoming.shape != current.shape:
                fresh = current.new_empty(incoming.shape)
                if name == "values":
                    current.data = fresh
                    current.grad = None  # a gradient of the old K matches no entry now
                else:
                    setattr(self, name, fresh)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        out_count, in_count, path_count = self.shape
        total = out_count * in_count * path_count
        return (f"shape=({out_count}, {in_count}, {path_count}), nnz={self.nnz} "
                f"({100 * self.nnz / max(total, 1):.3g}%), dtype={self.dtype}")


def _check_index_tensors(index: KeptIndex, device: torch.device, who: str,
                         nnz: int | None = None) -> None:
    """Every field int32 on `device`, their sizes agreeing with values [K = nnz] (K = the
    index's own when None), and the contents valid (layout.check_contents); else ValueError
    naming the field."""
    for name, t in index._asdict().items():
        if not isinstance(t, torch.Tensor) or t.dtype != INDEX_DTYPE or t.device != device:
            raise ValueError(f"{who}: index tensor {name} must be int32 on {device}, got "
                             f"{_describe(t)}")
    check_index(index, device, index.nnz if nnz is None else nnz)
    if not _on_meta(index):  # meta tensors hold no contents: only their sizes are known
        check_contents(index, who)


def _on_meta(index: KeptIndex) -> bool:
    return any(t.is_meta for t in index)


def from_dense(weight: torch.Tensor, mask: torch.Tensor) -> SparsePathWeight:
    """`SparsePathWeight.from_dense`: the entries of weight [O, I, P] where mask is True."""
    return SparsePathWeight.from_dense(weight, mask)


def from_entries(outputs: torch.Tensor, inputs: torch.Tensor, paths: torch.Tensor,
                 values: torch.Tensor, shape: tuple[int, int, int]) -> SparsePathWeight:
    """`SparsePathWeight.from_entries`: weight[outputs[k], inputs[k], paths[k]] = values[k]."""
    return SparsePathWeight.from_entries(outputs, inputs, paths, values, shape)
