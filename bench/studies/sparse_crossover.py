"""Time a pruned GLAIHead's training step in the dense and the sparse layout across the kept
fraction μ, to place `glai_kernels.glai.prune.SPARSE_CROSSOVER` (docs/notes/sparse.md, "Sparse
kept-path estimator", has the result).

    glai-bench sparse-crossover [--heads A1 B1] [--mus 1 3 10 25 50] [--batch 16]
    (or `python -m bench.studies.sparse_crossover ...`)

A step is what training a pruned head costs: head forward (frozen selector + estimator),
backward (gradients to the path weights and the bias only; x and act need none), Adam step
and zero_grad. The dense layout runs the dense op's auto backend on the masked [O, I, P']
weight (with the gradient-mask hook), the sparse layout the sparse op's auto backend over
the K kept values. Both heads come from one `prune` of one random MLP of the paper head's
widths, so they compute the same function. Repeats are the interleaved rounds of
bench/harness/timing.py; the minimum over them is reported (the least disturbed run on a
shared machine).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.cli_types import percent, positive_int
from bench.harness.timing import MIN_BLOCK_S, time_interleaved, warm
from glai_kernels.glai import from_mlp, make_mlp, prune
from glai_kernels.paper_heads import PAPER_HEADS


def training_step(head, x: torch.Tensor) -> Callable[[], None]:
    """One training step of `head` on `x` (forward, backward, Adam, zero_grad), as a call."""
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)

    def step() -> None:
        head(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench sparse-crossover",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=["A1", "B1"], choices=list(PAPER_HEADS))
    parser.add_argument("--mus", type=percent, nargs="+", default=[1, 3, 10, 25, 50],
                        help="kept fractions in percent (default: 1 3 10 25 50)")
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B = {args.batch}")
    for name in args.heads:
        spec = PAPER_HEADS[name]
        torch.manual_seed(0)
        mlp = make_mlp((spec.n0, spec.paths, spec.n2))
        head = from_mlp(mlp)
        reference = torch.randn(256, spec.n0)
        x = torch.randn(args.batch, spec.n0)
        for mu in args.mus:
            heads = {layout: prune(head, reference, mu=mu / 100, layout=layout).head
                     for layout in ("dense", "sparse")}
            steps = {layout: training_step(h, x) for layout, h in heads.items()}
            # warm-up (builds, first allocations), then interleaved rounds (bench/harness/timing)
            per_call = {layout: warm(step, x.device)[1] for layout, step in steps.items()}
            timed = time_interleaved(steps, per_call, MIN_BLOCK_S * args.repeats, args.repeats)
            best = {layout: t.min_s for layout, t in timed.items()}
            ratio = best["dense"] / best["sparse"]
            print(f"{name} mu={mu:5.1f}% K={heads['sparse'].path_count():9d} "
                  f"dense({heads['dense'].backend_used}) {1e3 * best['dense']:8.2f} ms  "
                  f"sparse({heads['sparse'].backend_used}) {1e3 * best['sparse']:8.2f} ms  "
                  f"dense/sparse {ratio:5.2f}")

    return 0

if __name__ == "__main__":
    raise SystemExit(main())
