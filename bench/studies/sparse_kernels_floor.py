"""The sparse `cpp` kernels of a GLAI training step per kept entry, at the pruned paper heads
(docs/notes/sparse.md, "The sparse kernels against their floor (issue 41, stop 47)", has the
floors and the results).

    glai-bench sparse-kernels-floor [--heads B1 B2 A2 C2] [--repeats 7]
                                        [--ghz GHZ] [--step]

Per head, the head `bench.studies.sparse_train_step` trains (the paper's batch, float32, one
thread), the three ops a training step calls, on this thread's CPU clock:
  forward       glai_ext::sparse_forward for y alone (save=False, as in training)
  dvalues       glai_ext::sparse_backward for dvalues alone (the ordinary loop's backward)
  dvalues+Adam  glai_ext::sparse_dvalues_adam (the fused step's backward and update)
each alone (the same op called repeatedly: the branch predictor learns its index) and in a
step (forward, then dvalues, alternating, as training calls them). The minimum over the
repeats of the mean of a block of calls, in µs, ns per kept entry and cycles per kept entry at
the core's clock, measured by a chain of dependent adds of a register (`bench.harness.native_peak.
clock_ghz`; `--ghz` sets it instead, as the printed line says).

`--step` adds, per head, what the engineered protocol's ratio (issue 41) would be with the two
sparse kernels of the fused step at their floors: the fused GLAI step and the engineered MLP
step (`HandFusedMLPStep`, the faster engineered MLP step on the CPU) timed interleaved with the
kernels in step; the fused step less its kernels is the rest (the selector's GEMM, the loss,
the bias, Python), and the rest plus K entries at the floors' cycles is the model, labelled as
one. The floors hold for one vector of batch on AVX-512 (where they were derived); elsewhere
the model is not printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.cli_types import positive_float, positive_int
from bench.studies.sparse_train_step import head_steps
from glai_kernels import extension
from glai_kernels.glai import match, paper_training, prune
from glai_kernels.glai.mlp import make_mlp
from glai_kernels.paper_heads import PAPER_HEADS

ENTRIES_PER_BLOCK = 20_000_000  # kept entries a timed block walks (≈ 10-40 ms)

# A kept entry's floor in cycles with the batch in one vector (B ≤ 16 float32 lanes, AVX-512),
# from the instructions and bytes an entry needs at the rates measured on the AMD Zen 5
# (docs/notes/sparse.md, "The sparse kernels against their floor (issue 41, stop 47)"): the
# forward 1.0 (its four FMA chains' latency) to 1.5 (an index, a weight and an x^T row loaded,
# two loads a cycle); dvalues + Adam 1.6 (dvalues' 18 FP operations on four pipes, and values,
# m and v read and written).
FORWARD_FLOOR_CYCLES = (1.0, 1.5)
DVALUES_ADAM_FLOOR_CYCLES = 1.6
FLOOR_LANES = 16


def head_ops(name: str) -> tuple[dict[str, Callable[[], object]], int, int]:
    """({"forward": op, "dvalues": op, "dvalues+Adam": op}, K, B) for paper head `name`'s
    pruned sparse head (`bench.studies.sparse_train_step`'s, seeded the same way)."""
    spec, settings = PAPER_HEADS[name], paper_training(PAPER_HEADS[name])
    torch.manual_seed(0)
    _, head, budget = match(make_mlp((spec.n0, spec.n1, spec.n2)), spec.rho)
    head = prune(head, torch.randn(256, spec.n0), keep=budget.keep, layout="sparse").head
    batch = settings.batch_size
    x = torch.randn(batch, spec.n0)
    with torch.no_grad():
        act = head.selector(x).float().contiguous()
    x_aug = torch.constant_pad_nd(x, (0, 1), 1.0).contiguous()  # as GLAIHead.forward
    sw = head.sparse_weight
    index = list(sw.index)
    values = sw.values.detach().clone()
    dy = torch.randn(batch, index[4].numel() - 1) * 0.01  # [B, O]
    exp_avg, exp_avg_sq, empty = torch.zeros_like(values), torch.zeros_like(values), torch.empty(0)
    ops = torch.ops.glai_ext
    return {
        "forward": lambda: ops.sparse_forward(x_aug, act, values, index, False),
        "dvalues": lambda: ops.sparse_backward(dy, x_aug, act, values, index, empty,
                                               [False, False, True]),
        # lr 1e-7 keeps the values where they are over thousands of calls
        "dvalues+Adam": lambda: ops.sparse_dvalues_adam(dy, x_aug, act, values, index, exp_avg,
                                                        exp_avg_sq, 1e-7, 0.9, 0.999, 0.0,
                                                        1e-8, 1.0, False),
    }, values.numel(), batch


def time_ops(ops: dict[str, Callable[[], object]], calls: int, repeats: int
             ) -> dict[str, float]:
    """{"<op> alone": s, "<op> in step": s} for forward and the two backwards: the minimum over
    `repeats` rounds of the mean seconds of `calls` calls, on this thread's CPU clock."""
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds / calls)

    for op in ops.values():
        op()  # the extension built and loaded, the buffers touched
    for _ in range(repeats):
        for name, op in ops.items():
            start = time.thread_time()
            for _ in range(calls):
                op()
            keep(f"{name} alone", time.thread_time() - start)
        for backward in ("dvalues", "dvalues+Adam"):
            forward_s, backward_s = in_step(ops["forward"], ops[backward], calls)
            keep("forward in step", forward_s)
            keep(f"{backward} in step", backward_s)
    return best


def in_step(forward: Callable[[], object], backward: Callable[[], object], calls: int
            ) -> tuple[float, float]:
    """The seconds `calls` calls of `forward` and of `backward` took, alternating as a training
    step calls them (the branch predictor then cannot learn one kernel's group lengths)."""
    spent = [0.0, 0.0]
    for _ in range(calls):
        for k, op in enumerate((forward, backward)):
            start = time.thread_time()
            op()
            spent[k] += time.thread_time() - start
    return spent[0], spent[1]


@dataclass(frozen=True)
class StepModel:
    """The fused GLAI step against the engineered MLP step, in seconds, and the model of the
    fused step with its kernels at their floors (`at_floor`: the low and high floor)."""

    fused: float
    mlp: float
    kernels: float  # forward + dvalues+Adam, in step
    at_floor: tuple[float, float]

    @property
    def rest(self) -> float:
        return self.fused - self.kernels

    @property
    def ratio(self) -> float:
        return self.fused / self.mlp

    @property
    def ratio_at_floor(self) -> tuple[float, float]:
        return (self.at_floor[0] / self.mlp, self.at_floor[1] / self.mlp)


def step_model(fused: float, mlp: float, forward: float, dvalues_adam: float, nnz: int,
               ghz: float) -> StepModel:
    """The model: the fused step less its two kernels (measured in step), plus `nnz` entries
    at the floors' cycles at `ghz`."""
    if not 0 < forward + dvalues_adam < fused:
        raise ValueError(f"the kernels ({forward + dvalues_adam:.3g} s) must be a part of the "
                         f"fused step ({fused:.3g} s)")
    per_entry = [(f + DVALUES_ADAM_FLOOR_CYCLES) / (ghz * 1e9) for f in FORWARD_FLOOR_CYCLES]
    rest = fused - forward - dvalues_adam
    return StepModel(fused, mlp, forward + dvalues_adam,
                     (rest + nnz * per_entry[0], rest + nnz * per_entry[1]))


def time_steps(name: str, ops: dict[str, Callable[[], object]], calls: int, repeats: int
               ) -> dict[str, float]:
    """{"GLAI fused": s, "MLP engineered": s, "forward in step": s, "dvalues+Adam in step": s}:
    the two steps and the fused step's two kernels, interleaved, each the minimum over
    `repeats` rounds of the mean of `calls` calls, on this thread's CPU clock."""
    steps, _ = head_steps(name, compiled=False)
    timed = {"GLAI fused": steps["GLAI fused"], "MLP engineered": steps["MLP hand-fused"]}
    best: dict[str, float] = {}
    for fn in (*timed.values(), *ops.values()):
        fn()
    for _ in range(repeats):
        for key, fn in timed.items():
            start = time.thread_time()
            for _ in range(calls):
                fn()
            best[key] = min(best.get(key, float("inf")), (time.thread_time() - start) / calls)
        spent = in_step(ops["forward"], ops["dvalues+Adam"], calls)
        for key, seconds in zip(("forward in step", "dvalues+Adam in step"), spent, strict=True):
            best[key] = min(best.get(key, float("inf")), seconds / calls)
    return best


def report_step(name: str, batch: int, nnz: int, timed: dict[str, float], ghz: float,
                isa: str) -> str:
    """One head's line of `--step` (`isa`: the kernels' instruction set, as
    glai_ext::cpu_isa names it)."""
    us = {k: 1e6 * v for k, v in timed.items()}
    head = (f"{name} step (B = {batch}, K = {nnz}): fused GLAI {us['GLAI fused']:.0f} µs, of it "
            f"the sparse forward {us['forward in step']:.0f} and dvalues+Adam "
            f"{us['dvalues+Adam in step']:.0f} (in step); engineered MLP "
            f"{us['MLP engineered']:.0f} µs")
    if batch > FLOOR_LANES or isa != "avx512":
        return head + (f"; ratio {timed['GLAI fused'] / timed['MLP engineered']:.2f} measured; "
                       f"no floor model (the floors are for B ≤ {FLOOR_LANES} on AVX-512)")
    m = step_model(timed["GLAI fused"], timed["MLP engineered"], timed["forward in step"],
                   timed["dvalues+Adam in step"], nnz, ghz)
    lo, hi = (1e6 * t for t in m.at_floor)
    return head + (f"; ratio {m.ratio:.2f} measured. Model (not measured): the rest "
                   f"{1e6 * m.rest:.0f} µs plus K at the floors (forward "
                   f"{FORWARD_FLOOR_CYCLES[0]:g}-{FORWARD_FLOOR_CYCLES[1]:g}, dvalues+Adam "
                   f"{DVALUES_ADAM_FLOOR_CYCLES:g} cycles an entry at {ghz:g} GHz) = "
                   f"{lo:.0f}-{hi:.0f} µs: ratio {m.ratio_at_floor[0]:.2f}-"
                   f"{m.ratio_at_floor[1]:.2f} with the kernels at their floors")


def clock_of(ghz: float | None) -> tuple[float, str]:
    """(GHz, how it was had): `ghz` when given, else this core's clock measured
    (`native_peak.clock_ghz`), else an assumed 4.2 GHz with the reason."""
    if ghz is not None:
        return ghz, f"{ghz:g} GHz (given)"
    from bench.harness import native_peak

    error = native_peak.load()
    if error is None:
        try:
            measured = native_peak.clock_ghz()
        except RuntimeError as e:  # not x86: the chain of adds is written for x86-64 alone
            error = str(e).splitlines()[0]
        else:
            return measured, f"{measured:.2f} GHz (measured: dependent integer adds on this thread)"
    return 4.2, f"an assumed 4.2 GHz (the clock was not measured: {error})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.sparse_kernels_floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=["B1", "B2", "A2", "C2"],
                        choices=list(PAPER_HEADS))
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--ghz", type=positive_float, default=None,
                        help="the clock the cycles assume (default: measured here)")
    parser.add_argument("--step", action="store_true",
                        help="also time the fused GLAI step and the engineered MLP step with "
                             "the kernels, and model the engineered ratio at their floors")
    args = parser.parse_args(argv)
    error = extension.load().error
    if error is not None:
        parser.error(f"the cpp extension is unavailable here, and it is what this times: {error}")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ghz, clock = clock_of(args.ghz)
        print(f"torch {torch.__version__}, one thread, CPU clock, min over {args.repeats} "
              f"repeats; cycles at {clock}")
        for name in args.heads:
            ops, nnz, batch = head_ops(name)
            timed = time_ops(ops, max(5, ENTRIES_PER_BLOCK // nnz), args.repeats)
            cells = ", ".join(f"{key} {1e6 * s:.1f} µs ({1e9 * s / nnz:.3f} ns, "
                              f"{1e9 * s / nnz * ghz:.2f} cycles)"
                              for key, s in sorted(timed.items()))
            print(f"{name} (B = {batch}, K = {nnz}): {cells}", flush=True)
            if args.step:
                steps = time_steps(name, ops, max(5, ENTRIES_PER_BLOCK // nnz // 4),
                                   args.repeats)
                print(report_step(name, batch, nnz, steps, ghz,
                                  torch.ops.glai_ext.cpu_isa("")), flush=True)
    finally:
        torch.set_num_threads(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
