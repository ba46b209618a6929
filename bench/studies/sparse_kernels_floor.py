"""The sparse `cpp` kernels of a GLAI training step per kept entry, at the pruned paper heads
(docs/notes/sparse.md, "The sparse kernels against their floor (issue 41, stop 47)", has the
floors and the results).

    glai-bench sparse-kernels-floor [--heads B1 B2 A2 C2] [--repeats 7]
                                        [--ghz 4.2]

Per head, the head `bench.studies.sparse_train_step` trains (the paper's batch, float32, one
thread), the three ops a training step calls, on this thread's CPU clock:
  forward       glai_ext::sparse_forward for y alone (save=False, as in training)
  dvalues       glai_ext::sparse_backward for dvalues alone (the ordinary loop's backward)
  dvalues+Adam  glai_ext::sparse_dvalues_adam (the fused step's backward and update)
each alone (the same op called repeatedly: the branch predictor learns its index) and in a
step (forward, then dvalues, alternating, as training calls them). The minimum over the
repeats of the mean of a block of calls, in µs, ns per kept entry and cycles per kept entry at
`--ghz` (an assumption printed with the numbers: the kernels' clock is not read here).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from bench.cli_types import positive_float, positive_int
from glai_kernels import extension
from glai_kernels.glai import match, paper_training, prune
from glai_kernels.glai.mlp import make_mlp
from glai_kernels.paper_heads import PAPER_HEADS

ENTRIES_PER_BLOCK = 20_000_000  # kept entries a timed block walks (≈ 10-40 ms)


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
            spent = {"forward": 0.0, backward: 0.0}
            for _ in range(calls):
                for name in spent:
                    start = time.thread_time()
                    ops[name]()
                    spent[name] += time.thread_time() - start
            keep("forward in step", spent["forward"])
            keep(f"{backward} in step", spent[backward])
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.sparse_kernels_floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=["B1", "B2", "A2", "C2"],
                        choices=list(PAPER_HEADS))
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--ghz", type=positive_float, default=4.2,
                        help="the clock the cycles assume (default 4.2)")
    args = parser.parse_args(argv)
    extension.load()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(f"torch {torch.__version__}, one thread, CPU clock, min over {args.repeats} "
              f"repeats; cycles at an assumed {args.ghz} GHz")
        for name in args.heads:
            ops, nnz, batch = head_ops(name)
            timed = time_ops(ops, max(5, ENTRIES_PER_BLOCK // nnz), args.repeats)
            cells = ", ".join(f"{key} {1e6 * s:.1f} µs ({1e9 * s / nnz:.3f} ns, "
                              f"{1e9 * s / nnz * args.ghz:.2f} cycles)"
                              for key, s in sorted(timed.items()))
            print(f"{name} (B = {batch}, K = {nnz}): {cells}", flush=True)
    finally:
        torch.set_num_threads(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
