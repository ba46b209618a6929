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
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from glai_kernels.sparse.layout import KeptIndex

Sizes = tuple[int, int, int, int]  # (O, I, P, G)
CAPACITY = 256
_MEMORY: dict[tuple, tuple[Sizes, tuple[weakref.ref, ...]]] = {}


def key_of(index: KeptIndex, device: torch.device, nnz: int) -> tuple | None:
    """The memory's key for `index` checked for values [K = nnz] on `device`; None where a
    tensor has no version counter (an inference tensor) or no readable storage (fake,
    functional or batched tensors)."""
    # plain tensors only: a fake tensor's data pointer is deprecated (it warns) and means nothing
    if any(type(t) is not torch.Tensor for t in index):
        return None
    try:
        return (device, nnz, *[(id(t), t._version, t.data_ptr(), t.shape) for t in index])
    except (AttributeError, RuntimeError):
        return None


def recall(key: tuple | None, index: KeptIndex) -> Sizes | None:
    """The sizes remembered under `key` for these very tensors, else None."""
    entry = _MEMORY.get(key) if key is not None else None
    if entry is None:
        return None
    sizes, refs = entry
    for ref, t in zip(refs, index, strict=True):
        if ref() is not t:  # a dead entry whose callback has not run yet
            return None
    return sizes


def remember(key: tuple | None, index: KeptIndex, sizes: Sizes) -> None:
    """Record `index` (validated in full by the caller) under `key`; nothing for None."""
    if key is None:
        return
    forget = _forgetter(key)
    refs = tuple(weakref.ref(t, forget) for t in index)
    if len(_MEMORY) >= CAPACITY:  # the oldest first (a dict keeps insertion order)
        for stale in list(_MEMORY)[:len(_MEMORY) - CAPACITY + 1]:
            _MEMORY.pop(stale, None)
    _MEMORY[key] = (sizes, refs)


def _forgetter(key: tuple) -> Callable[[weakref.ref], None]:
    def forget(_ref: weakref.ref) -> None:
        _MEMORY.pop(key, None)

    return forget


def clear() -> None:
    """Forget every index (tests: the next call of each is checked again)."""
    _MEMORY.clear()
