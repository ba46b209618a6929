"""Path-norm pruning (the paper's Theorem 2 and Section 3.7).

Over a reference set Ω the contribution of path (o, i, s) is c(x) = x_aug[i] * act[s](x) and its
normalised L1 norm ‖c‖₁ = (1/|Ω|) Σ_x |x_aug[i]| |act[s](x)|, the same for every output o.
A path's score is |weight[o, i, s]| * ‖c‖₁. Theorem 2: removing a set E of paths changes the
model by at most the sum of their scores,

    Σ_o (1/|Ω|) Σ_x |φ_o(x) − φ̃_o(x)|  <=  Σ_{(o,i,s) in E} |weight[o,i,s]| ‖c_{i,s}‖₁.

Two ways to keep a budget of path weights:
  * unstructured: the top-`keep` scores, anywhere;
  * structured: whole path columns s (one selector unit, or unit tuple, with all its inputs
    and outputs), highest total score first: a smaller dense P, no mask, less work.
Columns left with no kept weight are dropped in both (exact: they contribute nothing).

The pruned head's layout (`layout=`): "sparse" holds only the kept values as its parameter
and runs the sparse op (glai_kernels.sparse), whose cost follows K; "dense" keeps an
[O, I, P'] weight with a mask (a dense kernel does all O·I·P' work); "auto" (the default)
takes sparse when the kept fraction K / (O·I·P') is at most the crossover for the head's
device (`layout_crossover`) and the requested backend exists for the sparse op, else dense.
The crossover is, in order: the machine kind's measured table (glai_kernels/dispatch/
crossover.py: `<machine kind>.layout_crossover.json`, written by the kept-fraction sweep's
training-step pass, or the nearest measured kind's); on a CUDA device without one, a
**roofline prediction** for the head's shape (the bytes a step moves per kept entry against
per dense weight at the GPU's datasheet bandwidth, and the dense step's launch floor: ≈ 71%
at A1 and ≈ 19% at B1 on an H100; a prediction, not a measurement, and `python -m
glai_kernels` says so); else `SPARSE_CROSSOVER` for the device type (the CPU's, measured);
else dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glai_kernels import dispatch
from glai_kernels.dispatch import crossover
from glai_kernels.dispatch.crossover import Crossover
from glai_kernels.glai.head import GLAIHead, has_sparse_backend, sparse_backend_name
from glai_kernels.sparse import SparsePathWeight

SPARSE_CROSSOVER: dict[str, float] = {"cpu": 0.75}
"""Per device type, the kept fraction K / (O·I·P') at or below which the sparse layout's
training step beats the dense one's: on CPU the sparse `cpp` step won at every kept fraction
measured up to 75% at the A1, A2, B1, C1 and C2 shapes (1.5-2.6x at 75%) and lost at 90% at B1
(docs/notes/sparse.md, "The crossover re-measured with the sparse `cpp` backend"). Used where
the machine kind has no measured table (`layout_crossover`); a device type not listed, without
a table or a prediction, always gets the dense layout under layout="auto"."""

LAYOUT_CHOICES = ("auto", "dense", "sparse")


@dataclass(frozen=True)
class PruneResult:
    """A pruned head and what was kept: `kept` of `candidates` path weights (fraction `mu`),
    `dropped_score` = the Theorem 2 bound on the L1 change over the reference set."""

    head: GLAIHead
    kept: int
    candidates: int
    mu: float
    dropped_score: float
    structured: bool
    layout: str = "dense"


@torch.no_grad()
def path_norms(head: GLAIHead, reference: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """‖c_{i,s}‖₁ [I, P] over the reference set (rows of `reference`, [N, n0]), in the
    head's dtype; the selector runs in eval mode (no dropout)."""
    if reference.dim() != 2 or reference.shape[1] != head.in_features or len(reference) == 0:
        raise ValueError(f"reference must be a non-empty [N, {head.in_features}] tensor, got "
                         f"{list(reference.shape)}")
    dtype, device = head.dtype, head.device
    was_training = head.selector.training
    head.selector.eval()
    try:
        norms = torch.zeros(head.in_features + 1, head.paths, dtype=dtype, device=device)
        for chunk in reference.split(batch_size):
            chunk = chunk.to(device=device, dtype=dtype)
            act = head.selector(chunk).abs()
            norms += F.pad(chunk, (0, 1), value=1.0).abs().t() @ act
    finally:
        head.selector.train(was_training)
    return norms / len(reference)


@torch.no_grad()
def path_scores(head: GLAIHead, reference: torch.Tensor) -> torch.Tensor:
    """|weight[o,i,s]| * ‖c_{i,s}‖₁ [O, I, P]; zero where no path exists (outside the mask)."""
    if head.layout == "sparse":
        scores = torch.zeros(head.weight_shape, dtype=head.dtype, device=head.device)
        scores[head.sparse_weight.entries()] = kept_scores(head, reference)
        return scores
    scores = head.weight.detach().abs().mul_(path_norms(head, reference))  # one new tensor
    if head.weight_mask is not None:
        scores.masked_fill_(~head.weight_mask, 0)
    return scores


@torch.no_grad()
def kept_scores(head: GLAIHead, reference: torch.Tensor) -> torch.Tensor:
    """The scores [K] of a sparse-layout head's kept entries, in its values' order."""
    _, i, s = head.sparse_weight.entries()
    return head.sparse_weight.values.detach().abs() * path_norms(head, reference)[i, s]


def choose_layout(layout: str, kept: int, shape: tuple[int, int, int],
                  device: torch.device, backend: str | None) -> str:
    """"dense" or "sparse" for a pruned head of `kept` path weights in a [O, I, P'] weight."""
    if layout not in LAYOUT_CHOICES:
        raise ValueError(f"layout must be one of {', '.join(LAYOUT_CHOICES)}, got {layout!r}")
    if layout == "sparse":
        sparse_backend_name(backend)  # names the backend if the sparse op lacks it
        return "sparse"
    if layout == "dense":
        return "dense"
    found = layout_crossover(device, shape)
    density = kept / max(1, shape[0] * shape[1] * shape[2])
    if found is None or density > found.fraction or not has_sparse_backend(backend):
        return "dense"
    return "sparse"


def machine_kind_of(device: torch.device) -> str | None:
    """The dispatch tables' machine kind of `device` (glai_kernels/dispatch), None for a
    device type that has none (meta, ...)."""
    if device.type == "cpu":
        return dispatch.machine_kind("cpu")
    if device.type == "cuda":
        return dispatch.machine_kind("cuda", cuda_index=device.index)
    return None


def layout_crossover(device: torch.device, shape: tuple[int, int, int]) -> Crossover | None:
    """The kept fraction at or below which `prune(layout="auto")` takes the sparse layout for
    a head of `shape` (O, I, P') on `device`, with its source ("measured" or "prediction"; module
    docstring), or None (always dense). Float32's bytes in the prediction."""
    kind = machine_kind_of(device)
    found = None if kind is None else crossover.for_kind(kind, shape, dispatch.table_dir())
    if found is not None:
        return found
    constant = SPARSE_CROSSOVER.get(device.type)
    if constant is None:
        return None
    return Crossover(constant, "measured", f"SPARSE_CROSSOVER[{device.type!r}] in "
                                           "glai_kernels/glai/prune.py")


def _build(head: GLAIHead, o: torch.Tensor, i: torch.Tensor, s: torch.Tensor,
           values: torch.Tensor, layout: str) -> GLAIHead:
    """A head of the kept entries (o, i, s) [K] (s in `head`'s columns) and their values,
    keeping only the columns that still have a weight."""
    columns = torch.unique(s)  # sorted
    s = torch.searchsorted(columns, s)
    shape = (head.out_features, head.in_features + 1, columns.numel())
    chosen = choose_layout(layout, o.numel(), shape, head.device, head.backend)
    bias = None if head.bias is None else head.bias.detach()
    selector = head.selector.select(columns)
    if chosen == "sparse":
        weight = SparsePathWeight.from_entries(o, i, s, values, shape)
        pruned = GLAIHead(selector, weight, bias, backend=head.backend)
    else:
        mask = torch.zeros(shape, dtype=torch.bool, device=values.device)
        mask[o, i, s] = True
        weight = values.new_zeros(shape).index_put_((o, i, s), values)
        mask = None if bool(mask.all()) else mask
        pruned = GLAIHead(selector, weight, bias, mask, backend=head.backend)
    return pruned.train(head.training)


def to_layout(head: GLAIHead, layout: str) -> GLAIHead:
    """`head` in the "dense" or "sparse" layout (the same function; a new head, or `head`
    itself when it is in that layout already). Columns with no path weight are dropped."""
    if layout not in ("dense", "sparse"):
        raise ValueError(f"layout must be 'dense' or 'sparse', got {layout!r}")
    if head.layout == layout:
        return head
    if head.layout == "sparse":
        o, i, s = head.sparse_weight.entries()
        return _build(head, o, i, s, head.sparse_weight.values.detach(), layout)
    mask = head.weight_mask if head.weight_mask is not None else torch.ones(
        head.weight_shape, dtype=torch.bool, device=head.device)
    o, i, s = mask.nonzero().unbind(1)
    return _build(head, o, i, s, head.weight.detach()[o, i, s], layout)


def _keep_count(candidates: int, keep: int | None, mu: float | None) -> int:
    if (keep is None) == (mu is None):
        raise ValueError("give exactly one of keep (a count) or mu (a fraction)")
    if mu is not None:
        if not mu > 0:
            raise ValueError(f"mu must be positive, got {mu}")
        keep = int(mu * candidates)  # floor: never over the budget
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive int, got {keep!r}")
    return min(keep, candidates)  # Remark 5: a budget above the paths available keeps them all


def _top(flat: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the `count` largest entries of a 1-D tensor, ties arbitrary.

    A full topk over tens of millions of scores is slow on a CPU; when few are kept, a
    threshold from a random sample first cuts the candidates (exact: if the cut keeps fewer
    than `count`, the full topk runs instead).
    """
    total = flat.numel()
    if total > 4_000_000 and count < total // 16:
        gen = torch.Generator(device=flat.device).manual_seed(0)
        sample = flat[torch.randint(0, total, (1_000_000,), generator=gen, device=flat.device)]
        rank = sample.numel() - min(sample.numel(), 2 * int(count / total * sample.numel()) + 64)
        threshold = sample.kthvalue(max(rank, 1)).values
        candidates = (flat >= threshold).nonzero().flatten()
        if candidates.numel() >= count:
            values, picked = flat[candidates].topk(count, sorted=False)
            return values, candidates[picked]
    return flat.topk(count, sorted=False)


def _subhead(head: GLAIHead, columns: torch.Tensor, mask: torch.Tensor | None) -> GLAIHead:
    columns = columns.to(head.weight.device)
    weight = head.weight.detach()
    if columns.numel() != head.paths:  # index_select along the last dim is slow: skip if all
        weight = weight.index_select(2, columns)
        mask = None if mask is None else mask.index_select(2, columns)
    if mask is not None and bool(mask.all()):
        mask = None
    bias = None if head.bias is None else head.bias.detach()
    pruned = GLAIHead(head.selector.select(columns), weight, bias, mask, backend=head.backend)
    return pruned.train(head.training)


@torch.no_grad()
def prune(
    head: GLAIHead,
    reference: torch.Tensor,
    *,
    keep: int | None = None,
    mu: float | None = None,
    structured: bool = False,
    layout: str = "auto",
) -> PruneResult:
    """Keep the best `keep` path weights (or the fraction `mu` of those that exist, rounded
    down) by score over `reference` [N, n0]; the head passed in is not modified.

    Unstructured: exactly min(keep, existing) weights survive (ties broken arbitrarily).
    Structured: whole columns, best total score first, each taken if it still fits the
    budget, so at most `keep` survive. A budget >= the existing paths keeps every path
    (the paper's Remark 5). `layout` ("auto", "dense" or "sparse") is the pruned head's
    (module docstring); at most one dense [O, I, P] score tensor exists at a time, none
    when `head` is in the sparse layout.
    """
    # Argument checks first, each error naming its argument (issue 16).
    if head.device.type == "meta":
        raise ValueError("prune: head is on the meta device, which holds no values: which "
                         "paths survive depends on its weights; prune on a real device, then "
                         ".to('meta')")
    if isinstance(reference, torch.Tensor) and reference.is_meta:
        raise ValueError("prune: reference is on the meta device, which holds no values: "
                         "every path's score is read from it")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"prune: keep must be a positive int, got {keep!r}")
    if mu is not None:
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu < float("inf"):
            raise ValueError(f"prune: mu must be a finite fraction > 0, got {mu!r}")
        if int(mu * head.path_count()) < 1:
            raise ValueError(f"prune: mu={mu!r} keeps no path of the {head.path_count()} "
                             "(mu * paths < 1)")
    if (isinstance(reference, torch.Tensor) and reference.dim() == 2
            and not bool(torch.isfinite(reference).all())):
        rows = (~torch.isfinite(reference)).any(1).nonzero().flatten().tolist()
        raise ValueError(f"prune: reference has NaN or infinite values in rows {rows[:10]}"
                         f"{' ...' if len(rows) > 10 else ''}: every path's score would "
                         "depend on them")
    if layout not in LAYOUT_CHOICES:
        raise ValueError(f"layout must be one of {', '.join(LAYOUT_CHOICES)}, got {layout!r}")
    if head.layout == "sparse":
        return _prune_sparse(head, reference, keep, mu, structured, layout)
    scores = path_scores(head, reference)
    support = head.weight_mask
    candidates = head.path_count()
    count = _keep_count(candidates, keep, mu)
    if structured:
        per_column = scores.sum((0, 1), dtype=torch.float64)
        sizes = (support.sum((0, 1)) if support is not None
                 else torch.full_like(per_column, scores.shape[0] * scores.shape[1])).tolist()
        chosen, room = [], count
        for column in per_column.argsort(descending=True, stable=True).tolist():
            if sizes[column] <= room:
                chosen.append(column)
                room -= int(sizes[column])
        if not chosen:
            raise ValueError(f"keep={count} is smaller than one whole path column "
                             f"({int(min(sizes))} weights); use the unstructured variant")
        del scores
        columns = torch.tensor(sorted(chosen), dtype=torch.long)
        pruned = _subhead(head, columns, support)
        if layout != "dense":
            pruned = _relayout(pruned, layout)
        dropped = per_column.clone()
        dropped[columns.to(per_column.device)] = 0
        dropped_score = float(dropped.sum())
    else:
        # `scores` is ours: work in place (tens of millions of entries for the B heads)
        flat = scores.view(-1)
        structural = 0
        if support is not None:  # never pick a structural zero, even one with score 0
            flat.masked_fill_(~support.view(-1), -1.0)
            structural = support.numel() - candidates
        _, indices = _top(flat, count)
        flat[indices] = 0  # what is left (plus the -1 marks) is the dropped scores
        # a float64 sum would first copy every score; torch's pairwise float32 sum is ample
        dropped_score = float(flat.sum()) + structural
        del scores, flat  # the one dense score tensor goes before the pruned head is built
        _, inputs, paths = head.weight_shape
        indices = indices.sort().values
        o, rest = indices // (inputs * paths), indices % (inputs * paths)
        i, s = rest // paths, rest % paths
        pruned = _build(head, o, i, s, head.weight.detach().view(-1)[indices], layout)
    return PruneResult(pruned, pruned.path_count(), candidates, pruned.path_count() / candidates,
                       dropped_score, structured, pruned.layout)


def _relayout(head: GLAIHead, layout: str) -> GLAIHead:
    """`head` in the layout that `layout` ("auto" or "sparse") chooses for it."""
    chosen = choose_layout(layout, head.path_count(), head.weight_shape, head.device,
                           head.backend)
    return to_layout(head, chosen)


def _prune_sparse(head: GLAIHead, reference: torch.Tensor, keep: int | None,
                  mu: float | None, structured: bool, layout: str) -> PruneResult:
    """`prune` of a sparse-layout head: scores [K] over its kept entries only."""
    scores = kept_scores(head, reference)
    candidates = head.path_count()
    count = _keep_count(candidates, keep, mu)
    o, i, s = head.sparse_weight.entries()
    if structured:
        per_column = torch.zeros(head.paths, dtype=torch.float64, device=scores.device)
        per_column.index_add_(0, s, scores.double())
        sizes = torch.bincount(s, minlength=head.paths).tolist()
        chosen, room = [], count
        for column in per_column.argsort(descending=True, stable=True).tolist():
            if 0 < sizes[column] <= room:
                chosen.append(column)
                room -= sizes[column]
        if not chosen:
            raise ValueError(f"keep={count} is smaller than one whole path column "
                             f"({min(n for n in sizes if n)} weights); use the unstructured "
                             f"variant")
        taken = torch.zeros(head.paths, dtype=torch.bool, device=s.device)
        taken[torch.tensor(chosen, device=s.device)] = True
        kept = taken[s]
    else:
        kept = torch.zeros(candidates, dtype=torch.bool, device=scores.device)
        kept[_top(scores, count)[1]] = True
    dropped_score = float(scores[~kept].sum(dtype=torch.float64))
    values = head.sparse_weight.values.detach()[kept]
    pruned = _build(head, o[kept], i[kept], s[kept], values, layout)
    return PruneResult(pruned, pruned.path_count(), candidates, pruned.path_count() / candidates,
                       dropped_score, structured, pruned.layout)
