"""Time the `cpp` sparse backend against the dense `cpp` on the masked weight, kernel by
kernel, with each kernel's share of its bytes floor (docs/notes/sparse.md, "Sparse kept-path
estimator", the `cpp` subsection, has the prediction and the result).

    glai-bench sparse-cpp-timing [--repeats 9] [--batches 16] [--mu 0.01] [--shapes B1 B2]
                                 [--threads N] [--cpu-time]
    (or `python -m bench.studies.sparse_cpp_timing ...`)

Per shape and batch (float32, weights random, the mask uniformly random at μ), all in one
run, timed by the suite's CPU timer (`bench.harness.timing.time_interleaved`: the repeats are
its rounds, interleaved across the candidates, so a slow spell of the shared machine hits
all of them alike):
  dense cpp fwd     glai_kernels.estimator(x, act, weight * mask, backend="cpp"), no grad
  sparse cpp fwd    glai_kernels.sparse.estimator(x, act, sw, backend="cpp"), no grad
  sparse torch fwd  the same with backend="torch"
  op forward / forward+Zg / dvalues / dx / dact   the raw glai_ext ops, one kernel each
Each sample is one block of calls lasting about 20 ms; the report gives the minimum over the
repeats (the least disturbed) and the spread (median / minimum).

Bytes floor of a kernel: the bytes it must read or write at least once (values, index
arrays, x^T, act^T, dy^T, Zg, results), timed as a plain `sum` over a float32 buffer of that
many bytes in the same run (so cache residency is alike); share = floor time / kernel time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import glai_kernels
import glai_kernels.sparse as sparse
from bench.cli_types import fraction, positive_int
from bench.harness.timing import time_interleaved, warm
from glai_kernels import extension
from glai_kernels.sparse.backends import cpp as sparse_cpp

SHAPES = {  # name: (I, P, O), the paper heads' estimator shapes
    "A1": (385, 128, 37),
    "B1": (1281, 320, 128),
    "B2": (769, 384, 128),
}
# seconds of calls per sample (one timing block)
SAMPLE_S = 0.02
CPU = torch.device("cpu")


def _reader(nbytes: int) -> Callable[[], object]:
    buf = torch.ones(max(1, nbytes // 4))
    return lambda: buf.sum()


def cases(shape: tuple[int, int, int], batch: int, mu: float, seed: int = 0):
    """(candidates {name: fn}, floors {kernel name: bytes}) for one shape and batch."""
    inputs, paths, outputs = shape
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(outputs, inputs, paths, generator=gen)
    mask = torch.rand(outputs, inputs, paths, generator=gen) < mu
    masked = weight * mask
    sw = sparse.from_dense(weight, mask)
    x = torch.randn(batch, inputs, generator=gen)
    act = (torch.rand(batch, paths, generator=gen) < 0.5).float()
    dy = torch.randn(batch, outputs, generator=gen)
    values, index = sw.values.detach(), list(sw.index)
    _, zg = torch.ops.glai_ext.sparse_forward(x, act, values, index, True)
    empty = x.new_empty(0)
    op_f, op_b = torch.ops.glai_ext.sparse_forward, torch.ops.glai_ext.sparse_backward

    def no_grad(fn):
        def run():
            with torch.no_grad():
                return fn()
        return run

    candidates = {
        "dense cpp fwd": no_grad(lambda: glai_kernels.estimator(x, act, masked, backend="cpp")),
        "sparse cpp fwd": no_grad(lambda: sparse.estimator(x, act, sw, backend="cpp")),
        "sparse torch fwd": no_grad(lambda: sparse.estimator(x, act, sw, backend="torch")),
        "op forward": lambda: op_f(x, act, values, index, False),
        "op forward+Zg": lambda: op_f(x, act, values, index, True),
        "op dvalues": lambda: op_b(dy, x, act, values, index, empty, [False, False, True]),
        "op dx": lambda: op_b(dy, x, act, values, index, empty, [True, False, False]),
        "op dact": lambda: op_b(dy, x, act, values, index, zg, [False, True, False]),
    }
    k, g = sw.nnz, sw.index.groups
    ld = sparse_cpp.padded_batch(batch)
    xt, actt, dyt = 4 * ld * inputs, 4 * ld * paths, 4 * ld * outputs
    zg_bytes, y_bytes = 4 * ld * g, 4 * batch * outputs
    floors = {  # compulsory bytes per kernel
        "op forward": 8 * k + 8 * g + 4 * outputs + xt + actt + y_bytes,
        "op forward+Zg": 8 * k + 8 * g + 4 * outputs + xt + actt + y_bytes + zg_bytes,
        "op dvalues": 8 * k + 12 * g + xt + actt + dyt,  # inputs, dv; ptr, o, s per group
        "op dx": 12 * k + 8 * g + 4 * inputs + actt + dyt + 4 * batch * inputs,
        "op dact": 8 * g + 4 * paths + zg_bytes + dyt + 4 * batch * paths,
    }
    return candidates, floors, (k, g)


def run(shapes: list[str], batches: list[int], mu: float, repeats: int,
        clock: Callable[[], float] = time.perf_counter) -> None:
    """Print the table: per shape and batch, each candidate's time and each kernel's share of
    its bytes floor, on `clock` (time.perf_counter or time.thread_time)."""
    what = "thread CPU time" if clock is time.thread_time else "wall clock"
    print(f"threads {torch.get_num_threads()}, isa {torch.ops.glai_ext.cpu_isa()}, "
          f"μ = {mu:g}, float32, {repeats} interleaved repeats, {what}; min (median/min)")
    for name in shapes:
        for batch in batches:
            candidates, floors, (k, g) = cases(SHAPES[name], batch, mu)
            timed = {**candidates,
                     **{f"read {kernel}": _reader(nbytes) for kernel, nbytes in floors.items()}}
            # warm-up (first touches, caches); its median call time sizes the blocks
            warm_s = {label: warm(fn, CPU)[1] for label, fn in timed.items()}
            timings = time_interleaved(timed, warm_s, SAMPLE_S * repeats, repeats, clock=clock)
            best = {label: t.min_s for label, t in timings.items()}
            spread = {label: t.median_s / t.min_s for label, t in timings.items()}
            print(f"\n{name} (I, P, O = {SHAPES[name]}), B = {batch}: K = {k}, G = {g}")
            for label in candidates:
                extra = ""
                if label in floors:
                    floor = best[f"read {label}"]
                    extra = (f"  floor {floors[label] / 1e6:.2f} MB read in {floor * 1e3:.3f} ms"
                             f" ({spread[f'read {label}']:.2f}) -> {floor / best[label]:.0%}")
                print(f"  {label:18s} {best[label] * 1e3:8.3f} ms ({spread[label]:.2f}){extra}")
            ratio = best["dense cpp fwd"] / best["sparse cpp fwd"]
            print(f"  dense cpp fwd / sparse cpp fwd = {ratio:.1f}x;  sparse torch fwd / "
                  f"sparse cpp fwd = {best['sparse torch fwd'] / best['sparse cpp fwd']:.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench sparse-cpp-timing",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=9)
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[16])
    parser.add_argument("--mu", type=fraction, default=0.01)
    parser.add_argument("--shapes", nargs="+", default=["B1", "B2"], choices=list(SHAPES))
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time on this thread's CPU clock (time.thread_time) instead of the "
                             "wall clock: one thread only; leaves out the time the process "
                             "waits for a core on a shared machine")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.cpu_time and torch.get_num_threads() != 1:
        parser.error("argument --cpu-time: counts this thread only: use it with --threads 1")
    error = extension.cpu_availability("cpu")
    if error is not None:
        raise SystemExit(f"the cpp sparse backend is unavailable: {error}")
    run(args.shapes, args.batches, args.mu, args.repeats,
        time.thread_time if args.cpu_time else time.perf_counter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
