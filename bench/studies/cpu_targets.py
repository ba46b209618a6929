"""The C++ extension's CPU targets (issue 7), measured in one run; exits 1 if one misses.

    glai-bench cpu-targets [--rounds 7] [--threads N]   (also `python -m bench cpu-targets`)

Targets, each a ratio of times (or rates) taken in the same round, rounds interleaving the
contenders (A B C A B C ...) so that load from other processes hits them alike; the verdict
uses the median over rounds:

1. forward rate of `cpp` >= 0.9 x the fp32 `torch.mm` rate (2048², MKL) on compute-bound
   shapes: the paper's six heads at B = 256 and A1 at B = 1024;
2. forward+backward (dx, dact, dweight) on A1 (I=385, P=128, O=37) at B = 256:
   einsum time / cpp time >= 5;
3. the same: torch time / cpp time > 1.

Also reported, not judged: the GLAI training step (forward + dweight only, as when the
selector and the backbone are frozen) against einsum and torch, and the fraction of the
forward's rate to torch.mm's on every head.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import glai_kernels
from bench.cli_types import positive_int
from bench.harness.timing import best_call
from glai_kernels import extension
from glai_kernels.paper_heads import PAPER_HEADS
from reference import make_inputs

FORWARD_FRACTION = 0.9
EINSUM_SPEEDUP = 5.0
TORCH_SPEEDUP = 1.0
MM_SIZE = 2048
TARGET_HEAD, TARGET_BATCH = "A1", 256


def training_call(backend: str, x, act, weight, dy, grads: tuple[str, ...]):
    """Forward then backward through the public op, gradients for the named inputs only."""
    named = {"x": x, "act": act, "weight": weight}
    leaves = {n: t.detach().requires_grad_(n in grads) for n, t in named.items()}

    def run():
        y = glai_kernels.estimator(leaves["x"], leaves["act"], leaves["weight"], backend=backend)
        torch.autograd.grad(y, [leaves[n] for n in grads], dy)

    return run


def forward_call(backend: str, x, act, weight):
    def run():
        with torch.no_grad():
            glai_kernels.estimator(x, act, weight, backend=backend)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench cpu-targets",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    build = extension.load()
    if build.error is not None:
        print(f"cpp backend unavailable: {build.error}")
        return 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cpp ISA {torch.ops.glai_ext.cpu_isa()}, rounds {args.rounds}")

    a = torch.randn(MM_SIZE, MM_SIZE)
    b = torch.randn(MM_SIZE, MM_SIZE)
    mm_flops = 2 * MM_SIZE**3

    forward_cases = {f"{name} B=256": head.shape(256) for name, head in PAPER_HEADS.items()}
    forward_cases["A1 B=1024"] = PAPER_HEADS["A1"].shape(1024)
    forward_fns = {}
    for label, s in forward_cases.items():
        data = make_inputs(s.batch, s.inputs, s.paths, s.outputs, seed=1)
        forward_fns[label] = (forward_call("cpp", data.x, data.act, data.weight),
                              s.forward_flops())

    s = PAPER_HEADS[TARGET_HEAD].shape(TARGET_BATCH)
    data = make_inputs(s.batch, s.inputs, s.paths, s.outputs, seed=2)
    dy = torch.randn(s.batch, s.outputs, generator=torch.Generator().manual_seed(3))
    contenders = ("cpp", "torch", "einsum")
    full = {n: training_call(n, data.x, data.act, data.weight, dy, ("x", "act", "weight"))
            for n in contenders}
    glai = {n: training_call(n, data.x, data.act, data.weight, dy, ("weight",))
            for n in contenders}

    fractions: dict[str, list[float]] = {label: [] for label in forward_fns}
    ratios: dict[str, list[float]] = {k: [] for k in
                                      ("full einsum/cpp", "full torch/cpp",
                                       "glai einsum/cpp", "glai torch/cpp")}
    mm_rates, cpp_full_ms = [], []
    for _ in range(args.rounds):
        mm_rate = mm_flops / best_call(lambda: a @ b)
        mm_rates.append(mm_rate)
        for label, (fn, flops) in forward_fns.items():
            fractions[label].append(flops / best_call(fn) / mm_rate)
        times = {}
        for kind, calls in (("full", full), ("glai", glai)):
            for n in contenders:
                times[kind, n] = best_call(calls[n])
            ratios[f"{kind} einsum/cpp"].append(times[kind, "einsum"] / times[kind, "cpp"])
            ratios[f"{kind} torch/cpp"].append(times[kind, "torch"] / times[kind, "cpp"])
        cpp_full_ms.append(times["full", "cpp"] * 1e3)

    def spread(values: list[float]) -> str:
        return (f"median {statistics.median(values):6.2f}  "
                f"(min {min(values):.2f}, max {max(values):.2f})")

    print(f"\ntorch.mm fp32 {MM_SIZE}²: median {statistics.median(mm_rates) / 1e9:.0f} GFLOP/s "
          f"(min {min(mm_rates) / 1e9:.0f}, max {max(mm_rates) / 1e9:.0f})")
    print(f"cpp fwd+bwd on {TARGET_HEAD} B={TARGET_BATCH}: median "
          f"{statistics.median(cpp_full_ms):.1f} ms")
    misses = []
    print(f"\n1. forward rate / torch.mm rate (target >= {FORWARD_FRACTION}):")
    for label, values in fractions.items():
        ok = statistics.median(values) >= FORWARD_FRACTION
        misses += [] if ok else [f"forward {label}"]
        print(f"   {label:10s} {spread(values)}  {'ok' if ok else 'MISS'}")
    judged = {"full einsum/cpp": EINSUM_SPEEDUP, "full torch/cpp": TORCH_SPEEDUP}
    print(f"\n2-3. {TARGET_HEAD} B={TARGET_BATCH}, time ratios (others' time / cpp's):")
    for key, values in ratios.items():
        target = judged.get(key)
        verdict = ""
        if target is not None:
            ok = statistics.median(values) > target if target == TORCH_SPEEDUP else (
                statistics.median(values) >= target)
            misses += [] if ok else [key]
            verdict = f"target {'>' if target == TORCH_SPEEDUP else '>='} {target:g}: " + (
                "ok" if ok else "MISS")
        what = "fwd+bwd (dx, dact, dweight)" if key.startswith("full") else \
            "GLAI step (fwd + dweight)"
        print(f"   {what:27s} {key[5:]:10s} {spread(values)}  {verdict}")
    print("\nall targets met" if not misses else f"\nMISSED: {', '.join(misses)}")
    return 0 if not misses else 1


if __name__ == "__main__":
    raise SystemExit(main())
