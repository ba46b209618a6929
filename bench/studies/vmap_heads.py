"""vmap over stacked heads against a loop of them: `glai-bench vmap-heads` (or
`python -m bench.studies.vmap_heads`).

    glai-bench vmap-heads [--head A1] [--batch 16] [--heads 8] [--backend cpp] [--rounds 15]
                          [--min-time 3] [--repeats 3] [--seed 0] [--threads N]
                          [--clock wall|thread] [--passes forward|both|all] [--profile]
                          [--overhead]

Issue 43's last target: `torch.func.vmap` over N stacked GLAIEstimator heads (as
`torch.func.stack_module_state` builds them, `functional_call` under `vmap(in_dims=(0, 0,
None, None))`, x and act shared) no slower than N separate calls of the heads, in the same
run. Timed interleaved in one process (bench/harness/timing.py), float32, seeded inputs:

- forward (under no_grad): `loop` (N calls of the heads), `vmap` (the stacked call) and
  `folded` (one op call on the stacked weight and bias folded, [N*O, I, P] and [N*O], views
  of the same memory: the floor the batching rule can reach, the same kernel work on the
  same weight without torch.func);
- forward+backward (the weight's and bias's gradients of a sum loss): `loop` (N calls, one
  autograd.grad of their summed losses), `vmap` (autograd.grad through the vmapped forward),
  `vmap-grad` (vmap of torch.func.grad), `vmap-vjp` (vmap of torch.func.vjp, a cotangent per
  head) and `folded`;
- beside them, the op-level pair without the module (no functional_call): `op-loop` (N calls
  of `estimator(x, act, w_n, b_n)` on the heads' own tensors) against `op-vmap` (vmap of
  `estimator` over the stacked weight and bias, in_dims=(None, None, 0, 0)), and in
  forward+backward `op-vmap-grad` (vmap of torch.func.grad of it): what the op's batching
  rule costs when torch.func's functional_call is not in the call;
- on `cpp`, in forward+backward, `floor-grad`: `vmap-grad` with the same idiom on a head whose
  forward under grad over vmap is the least any rule can do (`FloorHead`: one single-level
  Function at the grad level, one glai_ext call each way on the folded operands, none of the
  op's checks or Python): what torch.func's own part of the call costs against the loop.

`--overhead` (on `cpp`) then times the forward contenders once more with the kernel stood in
by zeros of its result's shape (`stand_in_kernel`): all their Python, none of the kernel's
work, warm (calls back to back) and cold (each call after an untimed read of as many bytes as
the stacked weight, as a real call's weight stream leaves the caches), with each one's excess
over `folded`: what torch.func adds around the one call set against what the loop's extra
calls add.

Where the weights sit moves these calls as much as the rule does (docs/notes/cpu-kernels.md,
"vmap over stacked heads, fifth pass: where the weights sit (issue 43, stop 49)"): the same
folded call on two copies of one weight differs by a few percent either way, and a call right
after another that read the same memory finds part of it still in the L3. So each repeat
builds a fresh ensemble (seed `--seed` + repeat: new heads, new stacked state, new
allocations), and every contender reads the memory a user's has: `loop` and `op-loop` the
heads' own N weights, `vmap`, `op-vmap` and `folded` the one stacked weight
`stack_module_state` made (`folded` a view of it, not a copy). torch's CPU allocator gives
4 KB pages unless `THP_MEM_ALLOC_ENABLE=1` is in the environment (its 2 MB pages for
allocations of 2 MB or more, every contender's alike); the header says which.

Each repeat prints every contender's median and interquartile range and its ratio to `loop`
(the op-level ones to `op-loop`; below 1: faster than the loop), then the ratios' median and
range over the repeats' ensembles. `--clock thread` reads this
thread's CPU time (with `--threads 1` the whole call's work, none of the time spent waiting for
a core on a shared machine). `--profile` then shows where the vmapped calls spend beyond
`folded`: cProfile's top Python functions and torch.profiler's aten operators (a copy of the
stacked weight would show as aten::copy_ or aten::clone of its size).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._C._functorch import (
    CGradInterpreterPtr,
    CVmapInterpreterPtr,
    _add_batch_dim,
    _unwrap_batched,
    _unwrap_for_grad,
    _wrap_for_grad,
    get_single_level_autograd_function_allowed,
    peek_interpreter_stack,
    pop_dynamic_layer_stack,
    push_dynamic_layer_stack,
    set_single_level_autograd_function_allowed,
)
from torch.autograd.function import _SingleLevelFunction
from torch.func import functional_call, grad, stack_module_state, vjp, vmap

from bench.cli_types import non_negative_int, positive_float, positive_int
from bench.harness.timing import time_interleaved, warm
from glai_kernels import GLAIEstimator, estimator, extension
from glai_kernels.paper_heads import PAPER_HEADS

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _below_vmap(tensors, level: int) -> tuple[list, list, int, int, list]:
    """Grad level `level` and the vmap below it popped (the caller pushes `saved` back,
    `_pushed`): (the tensors unwrapped at both, their batch dims at the vmap, its level, its
    batch size, saved)."""
    inner = [_unwrap_for_grad(t, level) for t in tensors]
    saved = [pop_dynamic_layer_stack()]
    top = peek_interpreter_stack()
    vlevel, n = top.level(), CVmapInterpreterPtr(top).batchSize()
    parts = [_unwrap_batched(t, vlevel) for t in inner]
    saved.append(pop_dynamic_layer_stack())
    return [p[0] for p in parts], [p[1] for p in parts], vlevel, n, saved


def _pushed(saved: list, level: int, vlevel: int, batched: list) -> list:
    """The two levels `_below_vmap` popped pushed back, `batched` ((tensor, batch dim) pairs)
    wrapped at the vmap's level (`vlevel`, pushed first) and then at grad level `level`."""
    push_dynamic_layer_stack(saved[1])
    out = [_add_batch_dim(t, d, vlevel) for t, d in batched]
    push_dynamic_layer_stack(saved[0])
    return [_wrap_for_grad(t, level) for t in out]


class _Floor(_SingleLevelFunction):
    """apply(level, x, act, weight, bias) -> y at grad level `level`, over a vmap of stacked
    heads (weight and bias batched at 0, x and act shared): the forward one
    glai_ext::estimator_eager on the folded weight and bias, the backward one
    glai_ext::backward on the folded dy and one sum for the bias. No checks: a measuring
    device, not a rule."""

    @staticmethod
    def forward(level, x, act, weight, bias):
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(True)
        (x, act, w, b), _, vlevel, n, saved = _below_vmap((x, act, weight, bias), level)
        outputs = w.shape[1]
        y = torch.ops.glai_ext.estimator_eager(x, act, w.reshape(n * outputs, *w.shape[2:]),
                                               b.reshape(n * outputs), False, "cpp")
        (y,) = _pushed(saved, level, vlevel, [(y.view(x.shape[0], n, outputs), 1)])
        torch._C._set_grad_enabled(grad_mode)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.level = inputs[0]
        ctx.save_for_backward(*inputs[1:4])

    @staticmethod
    def backward(ctx, g):
        x, act, weight = ctx.saved_tensors
        (dy, x, act, w), dims, vlevel, n, saved = _below_vmap((g, x, act, weight), ctx.level)
        outputs = w.shape[1]
        dy = dy.movedim(dims[0], 1).reshape(x.shape[0], n * outputs)
        dw = torch.ops.glai_ext.backward(dy, x, act, w.reshape(n * outputs, *w.shape[2:]),
                                         dy.new_empty(0), False, False, True)[2]
        db = dy.sum(0)
        dw, db = _pushed(saved, ctx.level, vlevel, [(dw.view(w.shape), 0),
                                                    (db.view(n, outputs), 0)])
        return None, None, None, dw, db


class FloorHead(GLAIEstimator):
    """A GLAIEstimator whose forward under torch.func.grad over vmap (stacked heads, x and
    act shared) is `_Floor`: the floor of any batching rule there (`floor-grad`)."""

    def forward(self, x: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        top = peek_interpreter_stack()
        lift = CGradInterpreterPtr(top).lift
        allowed = get_single_level_autograd_function_allowed()
        set_single_level_autograd_function_allowed(True)
        try:
            return _Floor.apply(top.level(), lift(x), lift(act), self.weight, self.bias)
        finally:
            set_single_level_autograd_function_allowed(allowed)


@dataclass
class Ensemble:
    """N heads of one shape, stacked: `heads` (the modules), `params`/`buffers` (their stacked
    state: weight [N, O, I, P], bias [N, O], leaves needing gradients), `base` (a meta copy for
    functional_call), x [B, I] and act [B, P] (shared), `weight`/`bias` ([N*O, I, P] and
    [N*O]: the stacked state folded, leaves of their own on the same memory, so that `folded`
    reads the weight where `vmap` reads it), and on `cpp` `floor`, a meta FloorHead for
    functional_call (`floor-grad`)."""

    heads: list[GLAIEstimator]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    base: GLAIEstimator
    x: torch.Tensor
    act: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    backend: str
    floor: FloorHead | None = None

    def call(self, params, buffers, x, act) -> torch.Tensor:
        """One head's y [B, O] from its state (vmapped over the stacked state)."""
        return functional_call(self.base, (params, buffers), (x, act))

    def op(self, x, act, weight, bias) -> torch.Tensor:
        """One head's y [B, O] by the op itself (the op-level pair)."""
        return estimator(x, act, weight, bias, backend=self.backend)

    def stacked(self) -> torch.Tensor:
        """y [N, B, O] of every head, one vmapped call."""
        return vmap(self.call, in_dims=(0, 0, None, None))(self.params, self.buffers,
                                                           self.x, self.act)


def ensemble(head: str, batch: int, count: int, backend: str, seed: int = 0) -> Ensemble:
    """`count` float32 heads of paper head `head` on `backend`, seeded, and inputs at `batch`
    (act 0/1, as the selector gives it)."""
    s = PAPER_HEADS[head].shape(batch)
    torch.manual_seed(seed)
    heads = [GLAIEstimator(s.inputs, s.paths, s.outputs, backend=backend)
             for _ in range(count)]
    params, buffers = stack_module_state(heads)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, s.inputs, generator=gen)
    act = (torch.rand(batch, s.paths, generator=gen) < 0.5).float()
    # views, not copies: a copy's pages would time differently from the stacked weight's
    weight = params["weight"].detach().view(count * s.outputs, s.inputs, s.paths)
    bias = params["bias"].detach().view(count * s.outputs)
    floor = (FloorHead(s.inputs, s.paths, s.outputs, backend=backend).to("meta")
             if backend == "cpp" else None)
    return Ensemble(heads, params, buffers, copy.deepcopy(heads[0]).to("meta"), x, act,
                    weight.requires_grad_(True), bias.requires_grad_(True),
                    backend, floor)


def forward_calls(e: Ensemble) -> dict[str, Callable[[], object]]:
    """The forward contenders (module docstring), each under no_grad."""

    def loop():
        with torch.no_grad():
            return [h(e.x, e.act) for h in e.heads]

    def stacked():
        with torch.no_grad():
            return e.stacked()

    def folded():
        with torch.no_grad():
            return estimator(e.x, e.act, e.weight, e.bias, backend=e.backend)

    op_stacked = vmap(e.op, in_dims=(None, None, 0, 0))

    def op_loop():
        with torch.no_grad():
            return [e.op(e.x, e.act, h.weight, h.bias) for h in e.heads]

    def op_vmap():
        with torch.no_grad():
            return op_stacked(e.x, e.act, e.params["weight"], e.params["bias"])

    return {"loop": loop, "vmap": stacked, "folded": folded, "op-loop": op_loop,
            "op-vmap": op_vmap}


def training_calls(e: Ensemble) -> dict[str, Callable[[], object]]:
    """The forward+backward contenders (module docstring): the weight's and bias's gradients
    of a sum loss, returned (never accumulated into .grad)."""
    loop_params = [p for h in e.heads for p in (h.weight, h.bias)]
    stacked_params = (e.params["weight"], e.params["bias"])
    # one cotangent per head (batched), so the backward is every head's, as in the others
    ones = torch.ones(len(e.heads))

    def loop():
        loss = sum(h(e.x, e.act).sum() for h in e.heads)
        return torch.autograd.grad(loss, loop_params)

    def stacked():
        return torch.autograd.grad(e.stacked().sum(), stacked_params)

    def head_loss(params, buffers, x, act):
        return e.call(params, buffers, x, act).sum()

    per_head_grad = vmap(grad(head_loss), in_dims=(0, 0, None, None))

    def head_vjp(params, buffers, x, act, one):
        _, pull = vjp(lambda p: head_loss(p, buffers, x, act), params)
        return pull(one)[0]

    per_head_vjp = vmap(head_vjp, in_dims=(0, 0, None, None, 0))

    def folded():
        y = estimator(e.x, e.act, e.weight, e.bias, backend=e.backend)
        return torch.autograd.grad(y.sum(), (e.weight, e.bias))

    def op_loop():
        loss = sum(e.op(e.x, e.act, h.weight, h.bias).sum() for h in e.heads)
        return torch.autograd.grad(loss, loop_params)

    op_stacked = vmap(e.op, in_dims=(None, None, 0, 0))

    def op_vmap():
        y = op_stacked(e.x, e.act, *stacked_params)
        return torch.autograd.grad(y.sum(), stacked_params)

    op_grad = vmap(grad(lambda x, act, w, b: e.op(x, act, w, b).sum(), argnums=(2, 3)),
                   in_dims=(None, None, 0, 0))

    fns = {"loop": loop, "vmap": stacked,
           "vmap-grad": lambda: per_head_grad(e.params, e.buffers, e.x, e.act),
           "vmap-vjp": lambda: per_head_vjp(e.params, e.buffers, e.x, e.act, ones),
           "folded": folded, "op-loop": op_loop, "op-vmap": op_vmap,
           "op-vmap-grad": lambda: op_grad(e.x, e.act, *stacked_params)}
    if e.floor is not None:
        def floor_loss(params, buffers, x, act):
            return functional_call(e.floor, (params, buffers), (x, act)).sum()

        floor_grad = vmap(grad(floor_loss), in_dims=(0, 0, None, None))
        fns["floor-grad"] = lambda: floor_grad(e.params, e.buffers, e.x, e.act)
    return fns


def same_bits(e: Ensemble) -> dict[str, bool]:
    """Whether the vmapped forward and weight gradient equal the loop's, bit for bit."""
    loop_y = torch.stack(forward_calls(e)["loop"]())
    with torch.no_grad():
        vmap_y = e.stacked()
    train = training_calls(e)
    loop_dw = torch.stack(train["loop"]()[0::2])
    same = {"forward": torch.equal(loop_y, vmap_y),
            "dweight (autograd)": torch.equal(loop_dw, train["vmap"]()[0]),
            "dweight (grad)": torch.equal(loop_dw, train["vmap-grad"]()["weight"]),
            "op-level forward": torch.equal(loop_y, forward_calls(e)["op-vmap"]()),
            "op-level dweight (grad)": torch.equal(loop_dw, train["op-vmap-grad"]()[0])}
    if "floor-grad" in train:
        same["floor dweight (grad)"] = torch.equal(loop_dw, train["floor-grad"]()["weight"])
    return same


@contextlib.contextmanager
def stand_in_kernel():
    """The `cpp` forward kernel (extension.run_forward) replaced by zeros of its result's shape
    while the block runs: every contender then runs all its Python (torch.func's, the module's,
    the op's) and no kernel work."""
    real = extension.run_forward

    def zeros(x, act, weight, save):
        return x.new_zeros(x.shape[0], weight.shape[0]), x.new_empty(0)

    extension.run_forward = zeros
    try:
        yield
    finally:
        extension.run_forward = real


@contextlib.contextmanager
def op_clock(clock: Callable[[], float], spent: list):
    """While the block runs, every call of the op `estimator` (the heads' through
    glai_kernels.module, the op-level contenders' and `folded`'s through this module) adds
    its own time to spent[0] while spent[1] is true: the op's part of a contender, the rest
    being the module's and torch.func's. With spent[1] false the calls are not clocked (a
    thread clock read is a system call, ≈ 1 µs, which would weigh on the loop's eight)."""
    import glai_kernels.module as module_of_heads

    real = module_of_heads.estimator

    def clocked(*args, **kwargs):
        if not spent[1]:
            return real(*args, **kwargs)
        start = clock()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += clock() - start

    module_of_heads.estimator = clocked
    globals()["estimator"] = clocked
    try:
        yield
    finally:
        module_of_heads.estimator = real
        globals()["estimator"] = real


def overhead(e: Ensemble, rounds: int, calls: int,
             clock: Callable[[], float]) -> dict[str, tuple[float, float, float, float]]:
    """{forward contender: (warm µs, the op's part of it, cold µs, the op's part of it)} a
    call with the kernel stood in (`cpp` only): warm, `calls` calls back to back; cold, each
    call after an untimed read of as many bytes as the stacked weight, which leaves the caches
    as a real call's weight stream leaves them for the next. Medians over `rounds`
    interleaved rounds."""
    if e.backend != "cpp":
        raise ValueError(f"the kernel stand-in replaces the cpp kernel; backend {e.backend!r} "
                         "would still run its own")
    fns = forward_calls(e)
    flush = torch.ones(e.weight.numel())
    samples: dict[str, list[list[float]]] = {name: [[], [], [], []] for name in fns}
    spent = [0.0, False]

    def run(fn: Callable[[], object], flushed: bool, op_part: bool) -> float:
        """One contender's seconds a call (or its op's part), warm or each call cold."""
        spent[0], spent[1] = 0.0, op_part
        total = 0.0
        for _ in range(calls):
            if flushed:
                flush.sum()
            start = clock()
            fn()
            total += clock() - start
        spent[1] = False
        return (spent[0] if op_part else total) / calls

    with stand_in_kernel(), op_clock(clock, spent):
        expected = e.bias.detach().expand(e.x.shape[0], -1)  # y = 0 + bias
        if not torch.equal(fns["folded"](), expected):
            raise RuntimeError("the kernel stand-in did not replace the folded call's kernel")
        for fn in fns.values():
            fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                for k, (flushed, op_part) in enumerate(
                        ((False, False), (False, True), (True, False), (True, True))):
                    samples[name][k].append(run(fn, flushed, op_part))
    return {name: tuple(statistics.median(x) * 1e6 for x in lists)
            for name, lists in samples.items()}


def report_overhead(runs: list[dict[str, tuple[float, float, float, float]]],
                    flush_mib: float) -> None:
    """Each repeat's warm and cold µs a call with the op's part of each, and each contender's
    excess over `folded` (one op call, no module, no torch.func)."""
    print("\nforward's Python with the kernel stood in (zeros; `cpp`), µs a call (the op's "
          "part in brackets: `estimator`'s own calls, the rest the module's and torch.func's), "
          f"warm (calls back to back) / cold (each after a {flush_mib:.0f} MiB read, as a real "
          "call's weight stream leaves the caches)")
    for i, t in enumerate(runs, 1):
        cells = "  ".join(f"{name} {w:.1f} [{wo:.1f}] / {c:.1f} [{co:.1f}]"
                          for name, (w, wo, c, co) in t.items())
        folded = t["folded"]
        beyond = "  ".join(f"{name} {w - folded[0]:.1f} / {c - folded[2]:.1f}"
                           for name, (w, _, c, _) in t.items() if name != "folded")
        print(f"  repeat {i} (ensemble {i}): {cells}")
        print(f"    beyond folded: {beyond}")


def timed(fns: dict[str, Callable[[], object]], rounds: int, min_time_s: float,
          clock: Callable[[], float]) -> dict[str, tuple[float, float]]:
    """{name: (median µs, interquartile range µs)}, timed interleaved."""
    cpu = torch.device("cpu")
    per_call = {name: warm(fn, cpu, warm_s=0.2)[1] for name, fn in fns.items()}
    timings = time_interleaved(fns, per_call, min_time_s, rounds, clock=clock)
    return {name: (t.median_s * 1e6, t.iqr_s * 1e6) for name, t in timings.items()}


def baseline(name: str) -> str:
    """The contender `name` is compared with: `op-loop` for the op-level pair, else `loop`."""
    return "op-loop" if name.startswith("op-") else "loop"


def report(title: str, runs: list[dict[str, tuple[float, float]]]) -> None:
    """Each repeat's medians and ratios to the loop (op-level: to op-loop), then the ratios'
    median and range over repeats (each its own ensemble)."""
    print(f"\n{title}")
    for i, t in enumerate(runs, 1):
        cells = "  ".join(f"{name} {med:.0f} ±{iqr / 2:.0f} µs ({med / t[baseline(name)][0]:.3f}×)"
                          for name, (med, iqr) in t.items())
        print(f"  repeat {i} (ensemble {i}): {cells}")
    names = [n for n in runs[0] if n != baseline(n)]
    ratios = {n: sorted(t[n][0] / t[baseline(n)][0] for t in runs) for n in names}
    print("  ratio to loop, median [min, max] over repeats (ensembles): " + "  ".join(
        f"{n} {statistics.median(r):.3f} [{r[0]:.3f}, {r[-1]:.3f}]" for n, r in ratios.items()))


def profile(fn: Callable[[], object], calls: int, title: str) -> None:
    """cProfile's top Python functions (own time) and torch.profiler's aten operators over
    `calls` calls of `fn`."""
    print(f"\n--- profile: {title}, {calls} calls ---")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as p:
        for _ in range(calls):
            fn()
    print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total",
                                                          row_limit=25))


def allocation() -> str:
    """How torch's CPU allocator places tensors in this process (the header's words)."""
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") not in ("", "0")
    return ("THP_MEM_ALLOC_ENABLE: 2 MB pages for allocations of 2 MB or more" if thp
            else "torch's default allocation (4 KB pages)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench vmap-heads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--head", choices=sorted(PAPER_HEADS), default="A1")
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--heads", type=positive_int, default=8, help="N, the stacked heads")
    parser.add_argument("--backend", default="cpp")
    parser.add_argument("--rounds", type=positive_int, default=15)
    parser.add_argument("--min-time", type=positive_float, default=3.0,
                        help="timed seconds per contender and repeat (default: 3)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="repeats, each on a fresh ensemble (default: 3)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="the first repeat's ensemble seed; repeat r's is seed + r")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--passes", choices=("forward", "both", "all"), default="all",
                        help="forward, forward+backward (both), or all (default)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the vmapped calls and the folded call")
    parser.add_argument("--overhead", action="store_true",
                        help="also time the forward contenders with the kernel stood in "
                             "(`cpp` only): their Python alone, warm and after a cache flush")
    args = parser.parse_args(argv)
    if args.overhead and args.backend != "cpp":
        parser.error("--overhead stands in for the cpp kernel: it needs --backend cpp")
    if args.threads:
        torch.set_num_threads(args.threads)
    s = PAPER_HEADS[args.head].shape(args.batch)
    print(f"vmap over {args.heads} stacked {args.head} heads (B={s.batch}, I={s.inputs}, "
          f"P={s.paths}, O={s.outputs}) on {args.backend!r}, float32, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, clock {args.clock}, "
          f"{allocation()}; a fresh ensemble a repeat (seeds {args.seed}.."
          f"{args.seed + args.repeats - 1}): loop and op-loop read the heads' own weights, "
          "vmap, op-vmap and folded the stacked one")
    titles = {"forward": ("forward", forward_calls), "both": ("forward+backward", training_calls)}
    chosen = list(titles) if args.passes == "all" else [args.passes]
    runs: dict[str, list] = {key: [] for key in chosen}
    overheads: list[dict[str, tuple[float, float, float, float]]] = []
    e = None
    for r in range(args.repeats):
        del e  # the last ensemble's memory goes back before the next one's is taken
        e = ensemble(args.head, args.batch, args.heads, args.backend, seed=args.seed + r)
        print(f"ensemble {r + 1} (seed {args.seed + r}), bit for bit with the loop: " + ", ".join(
            f"{what} {'yes' if ok else 'NO'}" for what, ok in same_bits(e).items()))
        for key in chosen:
            runs[key].append(timed(titles[key][1](e), args.rounds, args.min_time,
                                   CLOCKS[args.clock]))
        if args.overhead:
            overheads.append(overhead(e, args.rounds, 20, CLOCKS[args.clock]))
    for key in chosen:
        report(titles[key][0], runs[key])
    if args.overhead:
        report_overhead(overheads, e.weight.numel() * 4 / 2**20)
    if args.profile:
        for key in chosen:
            title, fns = titles[key][0], titles[key][1](e)
            for name in [n for n in fns if "vmap" in n] + ["folded"]:
                profile(fns[name], 200, f"{title} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
