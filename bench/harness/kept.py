"""The kept-fraction sweep's measurements (issue 13): at one paper head's estimator shape
(I = n0 + 1, P = ρ·n1, O = n2), batch B and kept fraction μ, in one interleaved timing round
per pass:

    sparse:<name>  every available sparse backend (glai_kernels.sparse.SPARSE_ESTIMATOR)
                   on the K kept values
    cpp, cuda, torch  the dense op on the masked [O, I, P] weight (those of the run's dense
                   backends)
    mlp            the original MLP (n0, n1, n2) the GLAI head replaces

Passes: `forward` (no grad; the estimator alone, or the MLP's forward) and `step` (a whole
training step: the GLAIHead's forward, i.e. the selector (the reduced MLP's first layer and
its ReLU gates) and the estimator with its bias, the loss <y, dy>, backward to the path
weights and bias, then Adam (weight decay 0.1) over the K values (sparse) or over the masked
[O, I, P] weight with its gradient mask (dense); the MLP's is forward, the same loss,
backward and SGD (weight decay 1e-3). Optimizers are `glai_kernels.glai.make_optimizer`'s,
fused where torch has them. A sparse row times the step `glai_kernels.glai.fit` runs, the
`FusedSparseStep` (its first call, the one judged, is the bit-identical autograd step).

Inputs, from the run's seed: a random reduced MLP (n0, P, n2) gives the selector; x [B, n0]
and the upstream gradient dy [B, O] are Gaussian; the path weights are Gaussian; the mask is
uniformly random with exactly K = round(μ·O·I·P) kept entries (the first K of one random
permutation per head, so the masks of one head are nested); the estimator's bias starts at 0.
At the head's matched μ the inputs are instead the head GLAI trains (`pruned_inputs`): a
random original MLP, `match` and the unstructured prune's path scores over 256 Gaussian
reference rows, the top K of them kept over all P paths, as
`bench.studies.sparse_train_step`'s heads.
Pruning keeps paths whose weight and input statistics are large, so its entries cluster in
fewer (o, s) groups than a random mask's (B1: ≈ 52 entries a group against ≈ 13), and the
kernels' cost per entry follows the group size (docs/notes/sparse.md, "The kept-fraction sweep at
the pruned heads").

Verdicts go through `reference.verdict.judge` against the float64 dense oracle on the
masked weight (`bench.harness.oracle.Oracle`): y, and in the step the path weights' gradient (the
dense one masked; the sparse one at the K kept entries) before the optimizer moves them. The
MLP's y is judged against its float64 forward, scaled by the same network on absolute
values. Costs: a forward row carries its FLOPs and bytes floor (`SparseShape` for the
sparse op, `Shape` for the dense one, the two GEMMs for the MLP); a step row carries none
(its selector and optimizer are not the kernel's).
"""

from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.harness import memory
from bench.harness.budget import why_not
from bench.harness.calls import first_calls, skip, warm_call_s
from bench.harness.oracle import Oracle
from bench.harness.passes import PASSES, Tensors, dtype_of, split_available
from bench.harness.sweeps import matched_keep
from bench.harness.timing import time_calls
from glai_kernels import sparse
from glai_kernels.contract import Shape
from glai_kernels.glai import (
    GLAIHead,
    PathSelector,
    all_paths,
    make_mlp,
    make_optimizer,
    match,
    paper_training,
    path_scores,
)
from glai_kernels.glai.fused_step import fused_step_for
from glai_kernels.op import estimator
from glai_kernels.paper_heads import PAPER_HEADS
from glai_kernels.sparse import SPARSE_ESTIMATOR, SparsePathWeight, SparseShape
from reference.verdict import judge

# the dense backends the sparse op is compared with, on the masked weight
DENSE: tuple[str, ...] = ("cpp", "cuda", "torch")
MLP = "mlp"
SPARSE_PREFIX = "sparse:"
GLAI_WEIGHT_DECAY = 0.1  # docs/ARCHITECTURE.md §3: the estimator's Adam
Outputs = dict[str, torch.Tensor]


def sparse_label(name: str) -> str:
    """The results table's backend name of a sparse backend ("sparse:torch")."""
    return SPARSE_PREFIX + name


def sparse_backends(device: torch.device, dtype: torch.dtype,
                    requested: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(available sparse backends, {unavailable one: reason}), registration order;
    `requested` (names without the prefix) keeps only those."""
    names = [impl.name for impl in SPARSE_ESTIMATOR.backends()
             if requested is None or impl.name in requested]
    return split_available(
        names, lambda name: SPARSE_ESTIMATOR.get(name).unsupported_reason(device.type, dtype),
        sparse_label)


@dataclass
class HeadInputs:
    """What every μ of one (head, batch) shares."""

    key: tuple[str, int, str]
    selector: PathSelector
    x: torch.Tensor  # [B, n0]
    x_aug: torch.Tensor  # [B, I], the constant-1 input last
    act: torch.Tensor  # [B, P], the selector's 0/1 gates
    dy: torch.Tensor  # [B, O]
    weight: torch.Tensor  # [O, I, P], unmasked
    order: torch.Tensor | None  # a random permutation of the O·I·P flat positions
    mlp: torch.nn.Sequential  # the original (n0, n1, n2)
    mlp_oracle: tuple[torch.Tensor, torch.Tensor]  # its float64 y and error scale
    dweight: tuple[torch.Tensor, torch.Tensor] | None = None  # oracle dweight, scale
    pruned: torch.Tensor | None = None  # bool [O, I, P]: the prune's mask (pruned_inputs)


def _mlp_oracle(mlp: torch.nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, scale) in float64: y the MLP's forward, scale the same network over |x| and
    |weights| with the gates of y's ReLUs (the sum of absolute terms)."""
    first, last = mlp[0], mlp[-1]
    x64 = x.detach().double()
    w1, b1 = first.weight.detach().double(), first.bias.detach().double()
    w2, b2 = last.weight.detach().double(), last.bias.detach().double()
    pre = x64 @ w1.T + b1
    gate = (pre > 0).double()
    y = (pre * gate) @ w2.T + b2
    scale = ((x64.abs() @ w1.abs().T + b1.abs()) * gate) @ w2.abs().T + b2.abs()
    return y, scale


def head_inputs(head: str, shape: Shape, dtype: torch.dtype, device: torch.device,
                seed: int) -> HeadInputs:
    """The seeded inputs of one (head, batch) (the module docstring says what they are)."""
    spec = PAPER_HEADS[head]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the MLPs' default initialisation
    reduced = make_mlp((spec.n0, shape.paths, spec.n2))
    units, start = all_paths((shape.paths,))
    selector = PathSelector([reduced[0].weight], [reduced[0].bias], (0.0,), units, start)
    selector = selector.to(device=device, dtype=dtype)
    mlp = make_mlp((spec.n0, spec.n1, spec.n2)).to(device=device, dtype=dtype)
    x = torch.randn(shape.batch, spec.n0, generator=gen).to(device=device, dtype=dtype)
    with torch.no_grad():
        act = selector(x)
    weight = torch.randn(shape.outputs, shape.inputs, shape.paths, generator=gen)
    dy = torch.randn(shape.batch, shape.outputs, generator=gen)
    order = torch.randperm(weight.numel(), generator=gen)
    return HeadInputs((head, shape.batch, str(dtype)), selector, x,
                      F.pad(x, (0, 1), value=1.0), act, dy.to(device=device, dtype=dtype),
                      weight.to(device=device, dtype=dtype), order.to(device), mlp,
                      _mlp_oracle(mlp, x))


def pruned_inputs(head: str, shape: Shape, dtype: torch.dtype, device: torch.device,
                  seed: int) -> HeadInputs:
    """The inputs at `head`'s matched μ: the GLAI head that `match` makes of a seeded original
    MLP, its [O, I, P] estimator weight and the unstructured prune's mask of the matched K
    over it (the module docstring; P stays all the reduced MLP's paths, where `prune` would
    also drop a path left with no kept weight)."""
    spec = PAPER_HEADS[head]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the MLPs' default initialisation
    mlp = make_mlp((spec.n0, spec.n1, spec.n2))
    _, glai, budget = match(mlp, spec.rho)
    keep = matched_keep(spec)
    if budget.keep != keep or glai.weight_shape != (shape.outputs, shape.inputs, shape.paths):
        raise ValueError(f"{head}: match gives K = {budget.keep} over {glai.weight_shape}, the "
                         f"sweep expects {keep} over {(shape.outputs, shape.inputs, shape.paths)}")
    scores = path_scores(glai, torch.randn(256, spec.n0, generator=gen)).view(-1)
    pruned = torch.zeros(scores.numel(), dtype=torch.bool)
    pruned[scores.topk(keep).indices] = True
    del scores
    selector = glai.selector.eval().to(device=device, dtype=dtype)
    x = torch.randn(shape.batch, spec.n0, generator=gen).to(device=device, dtype=dtype)
    with torch.no_grad():
        act = selector(x)
    weight = glai.weight.detach().to(device=device, dtype=dtype)
    dy = torch.randn(shape.batch, shape.outputs, generator=gen)
    mlp = mlp.to(device=device, dtype=dtype)
    return HeadInputs((head, shape.batch, str(dtype), "pruned"), selector, x,
                      F.pad(x, (0, 1), value=1.0), act, dy.to(device=device, dtype=dtype),
                      weight, None, mlp, _mlp_oracle(mlp, x),
                      pruned=pruned.view(weight.shape).to(device))


def kept_mask(inputs: HeadInputs, nnz: int) -> torch.Tensor:
    """bool [O, I, P] with exactly `nnz` True entries: the prune's mask for pruned inputs,
    else the first nnz of the permutation."""
    if inputs.pruned is not None:
        if int(inputs.pruned.sum()) != nnz:
            raise ValueError(f"the pruned mask keeps {int(inputs.pruned.sum())}, not {nnz}")
        return inputs.pruned
    mask = torch.zeros(inputs.weight.numel(), dtype=torch.bool, device=inputs.weight.device)
    mask[inputs.order[:nnz]] = True
    return mask.view(inputs.weight.shape)


def kept_count(shape: Shape, mu: float) -> int:
    """K = round(μ·O·I·P), at least 1."""
    return max(1, round(mu * shape.outputs * shape.inputs * shape.paths))


def _forward_call(label: str, inputs: HeadInputs, sw: SparsePathWeight,
                  masked: torch.Tensor) -> Callable[[], Outputs]:
    if label == MLP:
        def call() -> Outputs:
            with torch.no_grad():
                return {"y": inputs.mlp(inputs.x)}
    elif label.startswith(SPARSE_PREFIX):
        name = label.removeprefix(SPARSE_PREFIX)

        def call() -> Outputs:
            with torch.no_grad():
                return {"y": sparse.estimator(inputs.x_aug, inputs.act, sw, backend=name)}
    else:
        def call() -> Outputs:
            with torch.no_grad():
                return {"y": estimator(inputs.x_aug, inputs.act, masked, backend=label)}
    return call


def _step_calls(label: str, head_name: str, inputs: HeadInputs, sw: SparsePathWeight,
                masked: torch.Tensor, mask: torch.Tensor
                ) -> tuple[Callable[[], Outputs], Callable[[], Outputs]]:
    """(checked, timed): one training step each, on one model and optimizer. The loss is
    <y, dy>, so the gradient reaching y is dy exactly. `checked` runs autograd and
    torch.optim and returns y and the path weights' gradient (before the step); `timed` is the
    step `glai_kernels.glai.fit` runs: for a sparse head with Adam, `FusedSparseStep`
    (bit-identical to `checked`, correctness/test_fused_step.py), else `checked` itself."""
    training = paper_training(PAPER_HEADS[head_name])
    if label == MLP:
        # a copy per case: its steps must not move the MLP its oracle and forward rows use
        model = copy.deepcopy(inputs.mlp)
        optimizer = make_optimizer("sgd", model.parameters(), lr=training.lr,
                                   weight_decay=training.mlp_weight_decay)
        grad_of = None
    else:
        bias = torch.zeros(masked.shape[0], dtype=masked.dtype, device=masked.device)
        if label.startswith(SPARSE_PREFIX):
            weight = SparsePathWeight(sw.values.detach(), sw.index)
            model = GLAIHead(inputs.selector, weight, bias,
                             backend=label.removeprefix(SPARSE_PREFIX))
            param = model.sparse_weight.values
        else:
            model = GLAIHead(inputs.selector, masked, bias, mask=mask, backend=label)
            param = model.weight
        optimizer = make_optimizer("adam", model.parameters(), lr=training.lr,
                                   weight_decay=GLAI_WEIGHT_DECAY)
        grad_of = param

    def loss_of(m: torch.nn.Module) -> torch.Tensor:
        return (m(inputs.x) * inputs.dy).sum()

    def checked() -> Outputs:
        y = model(inputs.x)
        (y * inputs.dy).sum().backward()
        out = {"y": y.detach()}
        if grad_of is not None:
            out["dweight"] = grad_of.grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out

    fused = fused_step_for(model, optimizer) if grad_of is not None else None
    if fused is None:
        return checked, checked
    return checked, lambda: {"loss": fused.step(loss_of)}


def _error_ratio(label: str, outputs: Outputs, inputs: HeadInputs, oracle: Oracle,
                 entries: tuple[torch.Tensor, ...], mask: torch.Tensor,
                 dtype: torch.dtype) -> float:
    """Worst error over tolerance of a call's outputs, by `reference.verdict.judge`."""
    if label == MLP:
        return judge(outputs["y"], *inputs.mlp_oracle, dtype).ratio
    worst = judge(outputs["y"], *oracle.forward["y"], dtype).ratio
    if "dweight" in outputs:
        expected, scale = _weight_gradient(inputs, oracle)
        # the float64 oracle lives on the CPU, the layout's entries and mask on the run's
        # device (a GPU run indexed across the two and failed every step row, stop 48)
        if label.startswith(SPARSE_PREFIX):  # the K kept entries, in the layout's order
            where = tuple(e.to(expected.device) for e in entries)
            expected, scale = expected[where], scale[where]
        else:  # the gradient mask zeroes the pruned entries
            keep = mask.to(expected.device)
            expected, scale = expected * keep, scale * keep
        worst = max(worst, judge(outputs["dweight"], expected, scale, dtype).ratio)
    return worst


def _weight_gradient(inputs: HeadInputs, oracle: Oracle) -> tuple[torch.Tensor, torch.Tensor]:
    # dweight = sum_b dy x act does not depend on the weight: once per head and batch
    if inputs.dweight is None:
        inputs.dweight = oracle.weight_gradient
    return inputs.dweight


def _costs(label: str, shape: Shape, sshape: SparseShape, itemsize: int,
           pass_: str) -> dict[str, float]:
    if pass_ != "forward":
        return {}
    if label.startswith(SPARSE_PREFIX):
        return {"flops": sshape.flops("forward"), "bytes": sshape.min_bytes(itemsize, "forward")}
    spec = PASSES["forward"]
    return {"flops": spec.flops(shape), "bytes": spec.min_bytes(shape, itemsize)}


def _mlp_costs(head: str, batch: int, itemsize: int) -> dict[str, float]:
    h = PAPER_HEADS[head]
    params = h.n0 * h.n1 + h.n1 + h.n1 * h.n2 + h.n2
    return {"flops": 2 * batch * (h.n0 * h.n1 + h.n1 * h.n2),
            "bytes": itemsize * (params + batch * (h.n0 + h.n2))}


def labels(ctx, dtype: torch.dtype) -> list[str]:
    """The labels a kept-fraction case is measured with in the run of `ctx` (the runner's
    Context): the available sparse backends, the run's dense ones the sweep compares, the
    MLP. An unavailable sparse backend has no rows: the run's meta names it with its reason,
    as it does an unavailable dense one."""
    names, _ = sparse_backends(ctx.device, dtype, ctx.sparse_backends)
    return [*map(sparse_label, names), *(b for b in DENSE if b in ctx.backends), MLP]


def measure(ctx, head: str, shape: Shape, dtype_name: str, mu: float,
            passes: list[str]) -> dict[tuple[str, str], dict]:
    """{(pass, backend label): measurement} for one head, batch and μ (`ctx` is the
    runner's Context; the (head, batch) inputs are kept in ctx.kept_inputs across μ)."""
    dtype, device, preset = dtype_of(dtype_name), ctx.device, ctx.preset
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nnz = kept_count(shape, mu)
    at_match = nnz == matched_keep(PAPER_HEADS[head])
    key = (head, shape.batch, str(dtype), *(("pruned",) if at_match else ()))
    inputs = ctx.kept_inputs
    if inputs is None or inputs.key != key:
        ctx.kept_inputs = None  # free the previous head's tensors first
        make = pruned_inputs if at_match else head_inputs
        inputs = ctx.kept_inputs = make(head, shape, dtype, device, ctx.seed)
    mask = kept_mask(inputs, nnz)
    masked = inputs.weight * mask
    sw = sparse.from_dense(masked, mask)
    entries = sw.entries()
    sshape = SparseShape(shape.batch, shape.inputs, shape.paths, shape.outputs, sw.nnz,
                         sw.index.groups)
    oracle = Oracle(Tensors(inputs.x_aug, inputs.act, masked, inputs.dy))
    out: dict[tuple[str, str], dict] = {}
    for p in passes:
        ready: dict[str, Callable[[], object]] = {}
        warm_s: dict[str, float] = {}
        for label in labels(ctx, dtype):
            costs = (_mlp_costs(head, shape.batch, itemsize) if label == MLP and p == "forward"
                     else _costs(label, shape, sshape, itemsize, p))
            m = out[(p, label)] = {"nnz": sw.nnz, **costs}
            if costs and ctx.ceilings.floor_s(costs["flops"], costs["bytes"],
                                              dtype_name) > preset.max_call_s:
                m.update(skip(f"roofline floor over the {preset.name} preset's limit of "
                              f"{preset.max_call_s} s"))
                continue
            # a step's first calls take seconds at the large heads: checked before each label
            late = why_not(ctx, ctx.measurement_bound_s())
            if late is not None:
                m.update(skip(late))
                continue
            started = time.perf_counter()
            try:
                if p == "forward":
                    check = fn = _forward_call(label, inputs, sw, masked)
                else:
                    check, fn = _step_calls(label, head, inputs, sw, masked, mask)
                calls = first_calls(check, fn, device, preset, m)
                if calls is None:
                    continue
                first, second = calls
                m["error_ratio"] = _error_ratio(label, first, inputs, oracle, entries, mask,
                                                dtype)
                m["correct"] = m["error_ratio"] <= 1.0
                del first
                warm = warm_call_s(fn, device, second)
                m["peak_mem_bytes"] = memory.peak_bytes(fn, device)
                ready[label], warm_s[label] = fn, warm
            except Exception as e:  # a backend failing one case must not end the run
                m.update(status="error", note=f"{type(e).__name__}: {e}".splitlines()[0])
                ctx.log(f"{label} {p} {head} B={shape.batch} mu={mu:.4g} failed:\n"
                        f"{traceback.format_exc()}")
            finally:
                m["measure_s"] = time.perf_counter() - started
        for label, timing in time_calls(ready, warm_s, device, preset.min_time_s,
                                          preset.rounds).items():
            m = out[(p, label)]
            m.update(status="ok" if m["correct"] else "wrong", **timing.fields())
            m["measure_s"] += timing.total_s
            if not m["correct"]:
                m["note"] = f"differs from the float64 oracle ({m['error_ratio']:.3g}x tolerance)"
    return out

