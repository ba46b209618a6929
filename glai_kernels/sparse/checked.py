"""The kept-path indices already validated in full, remembered by identity and version.

`layout.check_contents` costs a few passes over K (≈ 0.32 ms at A1); a custom op call or a
gradient of one would pay it on every call. So each index that passed, with the values'
device and K it was checked for, is remembered under a key of its ten tensors' identities,
version counters, data pointers and shapes: the same unchanged tensors give the same key (a
dict lookup, no pass over them: ≈ 3.7 µs at A1); a tensor edited in place (`t[0] = 7`,
`t.copy_(...)`: its version counter moves), given new storage or resized gives another key,
and is checked again.

What the key cannot see, as autograd's own version check cannot: writes that bypass the
version counter (through `t.data`, a NumPy or DLPack view of the storage). Inference tensors
keep no version counter, so an index of them is never remembered (checked on every call).

An entry holds weak references to its tensors: it never keeps an index alive, it is dropped
when one of them is freed (so an id reused by a new tensor cannot match it), and a hit is
confirmed against them. At most `CAPACITY` entries are kept, the oldest dropped first.

The eager calls on a SparsePathWeight use the same memory (sparse/op.py, "eager calls on a
SparsePathWeight checked before"): what the last one found for an index is kept on that
index's entry (`remember_call` / `recall_call`), so it is forgotten with the entry, under the
same key, when a tensor of the index is edited, replaced or freed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from glai_kernels.sparse.layout import KeptIndex

Sizes = tuple[int, int, int, int]  # (O, I, P, G)
CAPACITY = 256


class _Entry:
    """One remembered index: its sizes, weak references to its ten tensors, and what the
    last eager call with it recorded (sparse/op.py; None until one did)."""

    __slots__ = ("call", "refs", "sizes")

    def __init__(self, sizes: Sizes, refs: tuple[weakref.ref, ...]) -> None:
        self.sizes = sizes
        self.refs = refs
        self.call: object | None = None


_MEMORY: dict[tuple, _Entry] = {}


def key_of(index: Sequence[torch.Tensor], device: torch.device, nnz: int) -> tuple | None:
    """The memory's key for `index` (its ten tensors, in KeptIndex order) checked for values
    [K = nnz] on `device`; None where a tensor has no version counter (an inference tensor)
    or no readable storage (fake, functional or batched tensors)."""
    # plain tensors only (the filter, in the one pass: an eager call computes this key on
    # every call): a fake tensor's data pointer is deprecated (it warns) and means nothing
    try:
        state = [(id(t), t._version, t.data_ptr(), t.shape) for t in index
                 if type(t) is torch.Tensor]
    except (AttributeError, RuntimeError):
        return None
    return (device, nnz, *state) if len(state) == len(index) else None


def _entry(key: tuple | None, index: Sequence[torch.Tensor]) -> _Entry | None:
    """The live entry under `key` for these very tensors, else None."""
    entry = _MEMORY.get(key) if key is not None else None
    if entry is None:
        return None
    for ref, t in zip(entry.refs, index, strict=True):
        if ref() is not t:  # a dead entry whose callback has not run yet
            return None
    return entry


def recall(key: tuple | None, index: KeptIndex) -> Sizes | None:
    """The sizes remembered under `key` for these very tensors, else None."""
    entry = _entry(key, index)
    return None if entry is None else entry.sizes


def remember(key: tuple | None, index: KeptIndex, sizes: Sizes) -> None:
    """Record `index` (validated in full by the caller) under `key`; nothing for None."""
    if key is None:
        return
    forget = _forgetter(key)
    refs = tuple(weakref.ref(t, forget) for t in index)
    if len(_MEMORY) >= CAPACITY:  # the oldest first (a dict keeps insertion order)
        for stale in list(_MEMORY)[:len(_MEMORY) - CAPACITY + 1]:
            _MEMORY.pop(stale, None)
    _MEMORY[key] = _Entry(sizes, refs)


def remember_call(key: tuple | None, index: KeptIndex, call: object) -> None:
    """Keep `call`, what an eager call with `index` found (sparse/op.py), on the entry of
    `index` under `key`, replacing the last one; nothing where no entry is live (an index
    never remembered: inference tensors, or one dropped since)."""
    entry = _entry(key, index)
    if entry is not None:
        entry.call = call


def recall_call(key: tuple | None, index: Sequence[torch.Tensor]) -> object | None:
    """What `remember_call` kept for these very tensors under `key`, else None.

    On every eager call, so without `recall`'s look at the weak references: `index` is live
    and its ids are in `key`, and an entry goes when one of its tensors is freed (the
    callback runs as the tensor is deallocated, before its id can be reused), so an entry
    under this key holds these very tensors."""
    entry = _MEMORY.get(key)  # a None key finds nothing
    return None if entry is None else entry.call


def _forgetter(key: tuple) -> Callable[[weakref.ref], None]:
    def forget(_ref: weakref.ref) -> None:
        _MEMORY.pop(key, None)

    return forget


def clear() -> None:
    """Forget every index and eager call (tests: the next call of each is checked again)."""
    _MEMORY.clear()
