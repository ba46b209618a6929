"""The kept-path layout: which path weights exist, as index tensors a kernel can walk.

A pruned estimator keeps K of the O·I·P path weights. Kept entry k is the triple
(o_k, i_k, s_k) with value v[k]; the op computes (docs/ARCHITECTURE.md, the sparse op)

    y[b, o]    = sum_{k: o_k = o} v[k] · x[b, i_k] · act[b, s_k]          (+ bias[o])
    dv[k]      = sum_b dy[b, o_k] · x[b, i_k] · act[b, s_k]
    dx[b, i]   = sum_{k: i_k = i} v[k] · dy[b, o_k] · act[b, s_k]
    dact[b, s] = sum_{k: s_k = s} v[k] · dy[b, o_k] · x[b, i_k]

ORDER. Entries are sorted by (o, s, i), lexicographically, and are unique. Consecutive
entries with the same (o, s) form a GROUP; groups are numbered g = 0..G-1 in the same
(o, s) order, so act[b, s] factors out of each group:

    Zg[b, g]  = sum_{k in group g} v[k] · x[b, i_k]          (the group partial sum)
    y[b, o]   = sum_{g: o_g = o} act[b, s_g] · Zg[b, g]
    dact[b,s] = sum_{g: s_g = s} dy[b, o_g] · Zg[b, g]

Zg is what a forward keeps for the backward when act needs a gradient (the sparse analogue
of the dense op's Z): shape [B, G], in float32 for float16/bfloat16 inputs, else the
inputs' dtype.

INDEX TENSORS (`KeptIndex`, in this field order; all int32, contiguous, on the values'
device; K < 2^31 and G < 2^31 are checked when building). `check_contents` checks every
statement below (SparsePathWeight runs it where an index enters: construction, loading; the
custom ops on an index they have not seen, once: sparse/checked.py); `check_bounds` only
those that keep a kernel's reads and writes in bounds. "ptr" arrays
are CSR-style offsets: items of row r are [ptr[r], ptr[r+1]), ptr[0] = 0, ptr[-1] = the item count.

    inputs        [K]    i_k of entry k (entries in (o, s, i) order).
    group_ptr     [G+1]  entries of group g: k in [group_ptr[g], group_ptr[g+1]); every
                         group has at least one entry; within a group, i is increasing.
    group_outputs [G]    o of group g (non-decreasing in g).
    group_paths   [G]    s of group g (increasing within one output).
    output_ptr    [O+1]  groups of output o: g in [output_ptr[o], output_ptr[o+1]); an
                         output with no kept path has an empty range. A forward parallel
                         over o writes y[:, o] alone, no atomics.
    input_ptr     [I+1]  reverse order for dx: the entries with input i are
    input_entries [K]      input_entries[input_ptr[i] : input_ptr[i+1]], increasing k.
    entry_groups  [K]    the group of entry k (gives o_k = group_outputs[entry_groups[k]]
                         and s_k = group_paths[entry_groups[k]]; dv and dx need them).
    path_ptr      [P+1]  reverse order for dact: the groups with path s are
    path_groups   [G]      path_groups[path_ptr[s] : path_ptr[s+1]], increasing g.

The shape is implied: O = len(output_ptr) - 1, I = len(input_ptr) - 1,
P = len(path_ptr) - 1, K = len(inputs), G = len(group_outputs). With the reverse orders
every gradient is a deterministic gather (a fixed summation order, no atomics):
    dx[b, i]   = sum over k in input i's entries of v[k] · dy[b, o_k] · act[b, s_k]
    dact[b, s] = sum over g in path s's groups of dy[b, o_g] · Zg[b, g]
    dv[k]      = sum_b dy[b, o_k] · act[b, s_k] · x[b, i_k]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

INDEX_DTYPE = torch.int32
_LIMIT = 2**31 - 1


class KeptIndex(NamedTuple):
    """The index tensors of one kept-path weight; see the module docstring for each field."""

    inputs: torch.Tensor
    group_ptr: torch.Tensor
    group_outputs: torch.Tensor
    group_paths: torch.Tensor
    output_ptr: torch.Tensor
    input_ptr: torch.Tensor
    input_entries: torch.Tensor
    entry_groups: torch.Tensor
    path_ptr: torch.Tensor
    path_groups: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        """(O, I, P), from the lengths of the ptr arrays."""
        return (self.output_ptr.numel() - 1, self.input_ptr.numel() - 1,
                self.path_ptr.numel() - 1)

    @property
    def nnz(self) -> int:
        """K, the kept entries."""
        return self.inputs.numel()

    @property
    def groups(self) -> int:
        """G, the (o, s) groups."""
        return self.group_outputs.numel()

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(o [K], i [K], s [K]) as int64, in the layout's (o, s, i) order."""
        groups = self.entry_groups.long()
        return (self.group_outputs.long()[groups], self.inputs.long(),
                self.group_paths.long()[groups])


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def _check_sizes(shape: tuple[int, int, int], nnz: int) -> None:
    if any(d > _LIMIT for d in shape) or nnz > _LIMIT:
        raise ValueError(f"the kept-path layout indexes with int32: O, I, P and K must be below "
                         f"2^31, got shape {list(shape)} and K = {nnz}")


def build_from_sorted(outputs: torch.Tensor, inputs: torch.Tensor, paths: torch.Tensor,
                      shape: tuple[int, int, int]) -> KeptIndex:
    """The KeptIndex of entries already sorted by (o, s, i) and unique (int64 [K] each).

    Callers validate; `index_from_entries` and `build_index` are the checked entry points.
    """
    out_count, in_count, path_count = shape
    _check_sizes(shape, inputs.numel())
    device = inputs.device
    keys = outputs * path_count + paths
    group_keys, counts = torch.unique_consecutive(keys, return_counts=True)
    n_groups = group_keys.numel()
    group_outputs = group_keys // path_count if path_count else group_keys
    group_paths = group_keys - group_outputs * path_count
    entry_groups = torch.repeat_interleave(torch.arange(n_groups, device=device), counts)
    input_entries = torch.sort(inputs, stable=True).indices
    path_groups = torch.sort(group_paths, stable=True).indices

    def i32(t: torch.Tensor) -> torch.Tensor:
        return t.to(INDEX_DTYPE).contiguous()

    return KeptIndex(
        inputs=i32(inputs),
        group_ptr=i32(_ptr(counts)),
        group_outputs=i32(group_outputs),
        group_paths=i32(group_paths),
        output_ptr=i32(_ptr(torch.bincount(group_outputs, minlength=out_count))),
        input_ptr=i32(_ptr(torch.bincount(inputs, minlength=in_count))),
        input_entries=i32(input_entries),
        entry_groups=i32(entry_groups),
        path_ptr=i32(_ptr(torch.bincount(group_paths, minlength=path_count))),
        path_groups=i32(path_groups),
    )


# what each tensor's entries address: ("ptr", the item count it runs to) for an offset array,
# ("index", the count its entries index into) for the others; in terms of (O, I, P, K, G)
_BOUNDS: dict[str, tuple[str, str]] = {
    "inputs": ("index", "I"), "group_ptr": ("ptr", "K"), "group_outputs": ("index", "O"),
    "group_paths": ("index", "P"), "output_ptr": ("ptr", "G"), "input_ptr": ("ptr", "K"),
    "input_entries": ("index", "K"), "entry_groups": ("index", "G"), "path_ptr": ("ptr", "G"),
    "path_groups": ("index", "G"),
}


def _counts(index: KeptIndex) -> dict[str, int]:
    out_count, in_count, path_count = index.shape
    return {"O": out_count, "I": in_count, "P": path_count, "K": index.nnz, "G": index.groups}


def _extremes(index: KeptIndex) -> dict[str, list[int]]:
    """Per field: a ptr array's [first, last, smallest step] ([first, last] for one entry),
    another's [min, max] ([] when empty). All read back at once: one synchronisation."""
    parts: list[torch.Tensor] = []
    spans = {}
    for name, (kind, _) in _BOUNDS.items():
        t, start = getattr(index, name), len(parts)
        if kind == "ptr":  # never empty (contract.check_index)
            parts += [t[0], t[-1]] + ([torch.diff(t).amin()] if t.numel() > 1 else [])
        elif t.numel():
            parts += torch.aminmax(t)
        spans[name] = (start, len(parts))
    flat = torch.stack(parts).tolist()
    return {name: flat[start:end] for name, (start, end) in spans.items()}


def check_bounds(index: KeptIndex, who: str = "sparse estimator") -> None:
    """Raise ValueError naming the field unless every offset and index of `index` stays inside
    what it addresses: each ptr array runs from 0 to its item count without decreasing, each
    other entry lies in [0, its count). That keeps a kernel's every read and write in bounds;
    whether the index is the one its entries define is `check_contents`' question.

    One reduction per tensor and one synchronisation: ≈ 50 µs at A1 (K = 54k) on one CPU
    thread; `check_contents` runs it first. The tensors' sizes must already agree
    (contract.check_index).
    """
    counts = _counts(index)
    for name, found in _extremes(index).items():
        kind, count = _BOUNDS[name]
        n = counts[count]
        if kind == "ptr" and (found[0] != 0 or found[1] != n or min(found[2:], default=0) < 0):
            where = ("it decreases" if min(found[2:], default=0) < 0
                     else f"it runs from {found[0]} to {found[1]}")
            raise ValueError(f"{who}: index.{name} must run from 0 to {count} = {n} without "
                             f"decreasing (CSR offsets), but {where}")
        if kind == "index" and found and (found[0] < 0 or found[1] >= n):
            raise ValueError(f"{who}: index.{name} out of range: its entries must lie in "
                             f"[0, {count} = {n}), got min {found[0]}, max {found[1]}")


def _first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.numel() != expected.numel():
        return f"{got.numel()} entries, expected {expected.numel()}"
    k = int((got != expected).nonzero()[0, 0])
    return f"entry {k} is {int(got[k])}, expected {int(expected[k])}"


# why each derived field is what it is, for the error that names it
_DERIVED = {
    "output_ptr": "must count each output's groups (group_outputs)",
    "input_ptr": "must count each input's entries (inputs)",
    "input_entries": "must list each input's entries in increasing k (inputs)",
    "entry_groups": "must name each entry's group (group_ptr)",
    "path_ptr": "must count each path's groups (group_paths)",
    "path_groups": "must list each path's groups in increasing g (group_paths)",
}


def check_contents(index: KeptIndex, who: str = "sparse estimator") -> None:
    """Raise ValueError naming the first field that breaks an invariant of the module
    docstring: `check_bounds`, then the order (groups non-empty and sorted by (o, s), unique;
    within a group, inputs increasing), then every derived tensor (the ptr arrays of outputs,
    inputs and paths, the reverse orders, entry_groups) equal to the one `build_from_sorted`
    makes from the entries. An index that passes is exactly the one its entries define.

    Each statement is tested as it stands (`_consistent`), not by rebuilding the index: no
    sort, a few elementwise passes over K and G, one synchronisation after `check_bounds`'.
    Only an index that fails is rebuilt, to name the first field at fault (`_first_fault`).
    ≈ 0.32 ms at A1's pruned head (K = 54k, G = 1.4k) on one CPU thread, against 1.06 ms for
    the rebuild it replaced (docs/notes/sparse.md, "Issue 40's last gaps (stop 45)"). The
    tensors' sizes must already agree (contract.check_index).
    """
    check_bounds(index, who)
    if not _consistent(index):
        raise ValueError(f"{who}: {_first_fault(index)}")


def _consistent(index: KeptIndex) -> bool:
    """Whether an in-bounds index is the one its entries define: true exactly when
    `_first_fault` finds nothing, by tests whose conjunction is equivalent to its.

    - A reverse order (input_entries, path_groups) is the stable sort of its keys exactly
      when the pairs (key, position) strictly increase along it (no position can repeat,
      so it is also a permutation).
    - Given that sorted order, a ptr array (ptr from 0 to the count, non-decreasing, as
      check_bounds saw) counts each row's items exactly when every non-empty row's first
      and last item belong to that row: the rows tile the sorted items.
    - entry_groups is 0 at entry 0 and steps up by one exactly where a group opens.
    """
    out_count, in_count, path_count = index.shape
    nnz, groups = index.nnz, index.groups
    starts = torch.zeros(nnz + 1, dtype=torch.bool, device=index.inputs.device)
    starts[index.group_ptr[:-1].long()] = True  # entry k opens a group (K: an empty last one)
    by_input = index.inputs.index_select(0, index.input_entries)
    by_path = index.group_paths.index_select(0, index.path_groups)
    broken = [
        (torch.diff(index.group_ptr) < 1).any(),
        _not_increasing(index.group_outputs, index.group_paths, out_count, path_count),
        # a step down or repeat inside a group (`>` of bools: and not)
        ((torch.diff(index.inputs) <= 0) > starts[1:nnz]).any(),
        _rows_differ(index.output_ptr, index.group_outputs),
        _not_increasing(by_input, index.input_entries, in_count, nnz),
        _rows_differ(index.input_ptr, by_input),
        (index.entry_groups[:1] != 0).any(),
        (torch.diff(index.entry_groups) != starts[1:nnz]).any(),
        _not_increasing(by_path, index.path_groups, path_count, groups),
        _rows_differ(index.path_ptr, by_path),
    ]
    return not any(torch.stack(broken).tolist())


def _not_increasing(major: torch.Tensor, minor: torch.Tensor, major_count: int,
                    minor_count: int) -> torch.Tensor:
    """Whether the pairs (major[j], minor[j]), entries in [0, major_count) and [0,
    minor_count), fail to increase strictly, lexicographically, somewhere (a 0-d bool).
    One key per pair, major · minor_count + minor, in int32 where it fits."""
    if major_count * minor_count >= 2**31:
        major = major.long()
    key = torch.add(minor, major, alpha=minor_count)
    return (torch.diff(key) <= 0).any()


def _rows_differ(ptr: torch.Tensor, rows_of: torch.Tensor) -> torch.Tensor:
    """Whether some non-empty row r of `ptr` has an item whose row (`rows_of`, sorted) is
    not r at its first or its last slot (a 0-d bool). O(rows): two gathers of each row's
    ends."""
    count = rows_of.numel()
    if count == 0:  # check_bounds: every row is empty
        return torch.zeros((), dtype=torch.bool, device=ptr.device)
    first, end = ptr[:-1], ptr[1:]
    row = torch.arange(first.numel(), dtype=rows_of.dtype, device=ptr.device)
    at_first = rows_of.index_select(0, first.clamp(max=count - 1))
    at_last = rows_of.index_select(0, (end - 1).clamp(min=0))
    return (((at_first != row) | (at_last != row)) & (end > first)).any()


def _first_fault(index: KeptIndex) -> str:
    """The message naming the first invariant an in-bounds index breaks, in
    `check_contents`' order, and its first entry at fault: the order read off the tensors,
    then each derived tensor against the one `build_from_sorted` makes from the entries."""
    out_count, in_count, path_count = index.shape
    counts = torch.diff(index.group_ptr.long())
    if bool((counts < 1).any()):
        g = int((counts < 1).nonzero()[0, 0])
        return (f"index.group_ptr must be increasing (every group has at least one entry), "
                f"but group {g} is empty")
    outs, paths = index.group_outputs, index.group_paths
    keys = outs.long() * path_count + paths.long()
    if bool((keys[1:] <= keys[:-1]).any()):
        g = int((keys[1:] <= keys[:-1]).nonzero()[0, 0]) + 1
        return (f"index.group_outputs and group_paths must list each (o, s) once, in "
                f"increasing (o, s) order, but group {g} has (o, s) = ({int(outs[g])}, "
                f"{int(paths[g])}) after ({int(outs[g - 1])}, {int(paths[g - 1])})")
    inputs = index.inputs.long()
    starts = torch.zeros(index.nnz, dtype=torch.bool, device=inputs.device)
    starts[index.group_ptr.long()[:-1]] = True
    unsorted = (inputs[1:] <= inputs[:-1]) & ~starts[1:]
    if bool(unsorted.any()):
        k = int(unsorted.nonzero()[0, 0]) + 1
        return (f"index.inputs must increase within each group, but entry {k} (input "
                f"{int(inputs[k])}) follows input {int(inputs[k - 1])} in its group")
    expected = build_from_sorted(torch.repeat_interleave(outs.long(), counts), inputs,
                                 torch.repeat_interleave(paths.long(), counts),
                                 (out_count, in_count, path_count))
    for name, rule in _DERIVED.items():
        got, want = getattr(index, name), getattr(expected, name)
        if not torch.equal(got, want):
            return f"index.{name} {rule}, but {_first_difference(got, want)}"
    return "the index is inconsistent"  # unreachable: _consistent agrees with the above


def build_index(mask: torch.Tensor) -> KeptIndex:
    """The KeptIndex of the True entries of `mask` (bool [O, I, P])."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 3:
        got = (f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, torch.Tensor)
               else type(mask).__name__)
        raise ValueError(f"build_index: mask must be a bool tensor [O, I, P], got {got}")
    # nonzero of the (o, s, i) view lists the entries already in layout order
    o, s, i = mask.permute(0, 2, 1).nonzero().unbind(1)
    return build_from_sorted(o, i, s, tuple(mask.shape))


def index_from_entries(outputs: torch.Tensor, inputs: torch.Tensor, paths: torch.Tensor,
                       shape: tuple[int, int, int]) -> tuple[KeptIndex, torch.Tensor]:
    """(KeptIndex, order) for entries given in any order: `order` [K] (int64) is the
    permutation that puts them in layout order (values[order] are the layout's values).

    Raises ValueError naming the argument for an index outside `shape` or a repeated
    (o, i, s) entry.
    """
    if len(shape) != 3 or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"shape must be (O, I, P) of non-negative ints, got {shape!r}")
    entries = {"outputs": outputs, "inputs": inputs, "paths": paths}
    for (name, t), size in zip(entries.items(), shape, strict=True):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point() \
                or t.is_complex() or t.dtype == torch.bool:
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a 1-d integer tensor [K], got {got}")
        if t.numel() != outputs.numel():
            raise ValueError(f"{name} has {t.numel()} entries, outputs has {outputs.numel()}: "
                             f"outputs, inputs and paths must have the same length K")
        if t.device != outputs.device:
            raise ValueError(f"{name} must be on the same device as outputs ({outputs.device}), "
                             f"got {t.device}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= size):
            raise ValueError(f"{name} index out of range: entries must lie in [0, {size}) for "
                             f"shape {list(shape)}, got min {int(t.min())}, max {int(t.max())}")
    o, i, s = (t.long() for t in (outputs, inputs, paths))
    _check_sizes(shape, o.numel())
    # (o, s, i) order by three stable sorts, least significant key first: a flat key
    # (o·P + s)·I + i wraps past int64 once O·I·P >= 2^63, which each size alone allows
    order = torch.arange(o.numel(), device=o.device)
    for key in (i, s, o):
        order = order[torch.sort(key[order], stable=True).indices]
    o, i, s = o[order], i[order], s[order]
    repeated = (o[1:] == o[:-1]) & (s[1:] == s[:-1]) & (i[1:] == i[:-1])
    if bool(repeated.any()):
        k = int(repeated.nonzero()[0, 0])
        raise ValueError(f"duplicate entries: (o, i, s) = ({int(o[k])}, {int(i[k])}, {int(s[k])}) "
                         f"appears more than once")
    return build_from_sorted(o, i, s, shape), order
