"""One GLAI training step on the sparse `cpp` backend against the original MLP's training step,
per paper head at its matched μ (issue 13's target: GLAI step ≤ 1.0× the MLP step;
docs/notes/sparse.md, "Sparse kept-path estimator", "cpp performance pass" and "Training step ≤ MLP
(issue 13 target), second pass", have predictions and results).

    glai-bench sparse-train-step [--heads A1 ... C2] [--threads 1 [2]] [--repeats 7]
    (or `python -m bench.studies.sparse_train_step ...`)

Per head, at the paper's batch size (16; 32 for C2), float32, one random batch:
  MLP step   the original MLP (n0 -> n1 -> n2, no dropout): forward, a squared-error loss,
             backward, SGD step (fused where torch has it, the paper's LR and weight decay),
             zero_grad.
  GLAI step  the GLAIHead of the reduced MLP pruned (path norms over 256 random reference
             rows) to the matched K in the sparse layout: its forward (the frozen selector =
             the reduced MLP's first layer + ReLU gates, then the sparse estimator), the same
             loss, backward (gradients to the kept values and the bias only: x is data and the
             selector is frozen), Adam step over K values (fused where torch has it), zero_grad;
             the selector's frozen layer on torch's GEMM, as the MLP's layers run
             (`training.on_torch_gemm`: the paper protocol's step).
  GLAI, extension GEMM   the same step with the selector on the extension's GEMM (GLAIHead's
             default; engineering the MLP's ordinary step does not get), on the head itself.
  GLAI fused the same step by `glai_kernels.glai.fused_step.FusedSparseStep` (without
             autograd over the estimator or torch.optim's wrapper, the values' Adam update
             inside the dvalues kernel; what `fit` and the pipeline run), on a copy of the
             same head.
  GLAI fused, torch Adam   the same with `kernel_adam=False` (torch's `_fused_adam_`: the
             ordinary step's arithmetic bit for bit), on another copy.
  MLP hand-fused   the MLP step engineered as GLAI's fused step is (glai/mlp_step.py's
             `HandFusedMLPStep`: no autograd over the MLP or torch.optim's wrapper, torch's
             `_fused_sgd_`), on a copy of the MLP.
  MLP compiled     `torch.compile` of the MLP's forward and loss, backward through the
             compiled graph, the fused SGD step (`compiled_mlp_step`), on another copy
             (`--no-compile` leaves it out).
  GLAI fused, Python / MLP hand-fused, Python   the two engineered steps with `native=False`:
             their Python paths, the forward and the update as the op calls they are made of
             (torch's GEMMs on the MLP's side), where the default runs each as one extension
             call (csrc/cpu/engineered_steps.cpp), on copies.
  MLP hand-fused, torch GEMM   the native MLP step with `gemm="torch"`: torch's MKL GEMMs where
             the default runs its products on GLAI's selector's register tile (kernels.inc's
             `product`, csrc/cpu/engineered_steps.cpp), on a copy.
The ratios the issue 41 targets read: the paper protocol's (ordinary GLAI / ordinary MLP) and
the engineered protocol's (GLAI fused / the fastest engineered MLP step: the native hand-fused
step on its own GEMM or torch's, its Python path, or the compiled one).

`--pieces` times instead where the ordinary GLAI step's time goes (`ordinary_pieces`), the
pieces interleaved as the steps are, on the CPU clock: the step; the head's forward with and
without autograd and its selector alone; forward + loss + backward; the loss and its backward
alone (on a leaf y); torch.optim's Adam step and torch's `_fused_adam_` kernel alone. Derived:
the backward through the estimator's autograd node, the optimizer's Python wrapper, the
recording of the autograd graph, and what is left of the step (the pieces' interaction).

`--beside MIB` times every step followed by an in-place pass over MIB MiB of float32 (an
add of 1), with the pass alone timed in the same interleaving and subtracted from each step:
the steps with their caches taken between steps, as other work in a training loop takes them,
where the default repeats each step back to back (docs/notes/sparse.md, "The step on the Intel
Xeon again: a noisy host, and the cache state both steps run in (issue 41, stop 56)").

Timed by the suite's CPU timer (`bench.harness.timing.time_interleaved`): each sample is one
block of steps lasting about 20 ms, the repeats are its rounds with the steps interleaved, and
the minimum over the repeats is reported, on this thread's CPU clock (`time.thread_time`,
with more than one thread it leaves out the other threads' work: read the wall clock then)
and on the wall clock (one interleaved timing per clock, the CPU clock's first). With several
thread counts (`--threads 1 2`) the counts take turns inside each repeat too, and a last line
per head compares each step at its own best thread count (wall clock): what a user who picks
the thread count per model gets. The two protocols' ratios are also given round by round,
median [min, max]: one round's blocks of the two steps run next to each other, so their ratio
leaves out what moves the host between rounds (its clock, other work), where the ratio of two
minima can pair a quiet round of one step with a noisy one of the other (docs/notes/sparse.md,
"The step on the Intel Xeon again: a noisy host, and the cache state both steps run in (issue
41, stop 56)").
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from bench.cli_types import non_negative_float, positive_int
from bench.harness.timing import time_interleaved, warm
from glai_kernels.glai import make_optimizer, match, paper_training, prune
from glai_kernels.glai.fused_step import FusedSparseStep
from glai_kernels.glai.mlp import make_mlp
from glai_kernels.glai.mlp_step import HandFusedMLPStep, compiled_mlp_step
from glai_kernels.glai.training import on_torch_gemm
from glai_kernels.paper_heads import PAPER_HEADS

# seconds of steps per sample (one timing block)
SAMPLE_S = 0.02
CPU = torch.device("cpu")
SWEEP = "sweep"  # `--beside`'s pass over memory, timed alone
# `--beside`'s largest pass: past every cache level of the CPUs measured (the Intel Xeon's VM
# reports 300 MiB of L3), and far from a machine's memory, which a pass per step would thrash
MAX_BESIDE_MIB = 1024.0


def _stepper(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
             target: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        loss = (model(x) - target).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _fused_stepper(head: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   target: torch.Tensor, kernel_adam: bool = True,
                   native: bool = True) -> Callable[[], None]:
    stepper = FusedSparseStep(head, optimizer, kernel_adam=kernel_adam, native=native)
    return lambda: stepper.step(lambda model: (model(x) - target).square().mean())


def _squared_error(target: torch.Tensor) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    return lambda model, x: (model(x) - target).square().mean()


def head_steps(name: str, backend: str = "cpp", batch: int | None = None,
               compiled: bool = True) -> tuple[dict[str, Callable[[], None]], str]:
    """({"MLP": step, "GLAI": step, "GLAI, extension GEMM": step, "GLAI fused": step,
    "GLAI fused, torch Adam": step, "GLAI fused, Python": step, "MLP hand-fused": step,
    "MLP hand-fused, torch GEMM": step, "MLP hand-fused, Python": step[, "MLP compiled":
    step]}, a description) for paper head `name`."""
    spec, settings = PAPER_HEADS[name], paper_training(PAPER_HEADS[name])
    torch.manual_seed(0)
    original = make_mlp((spec.n0, spec.n1, spec.n2))
    _, head, budget = match(original, spec.rho)
    head = prune(head, torch.randn(256, spec.n0), keep=budget.keep, layout="sparse").head
    head.backend = backend
    batch = batch or settings.batch_size
    x, target = torch.randn(batch, spec.n0), torch.randn(batch, spec.n2)
    fused, fused_torch, fused_python = (copy.deepcopy(head) for _ in range(3))
    paper = on_torch_gemm(head)  # the paper protocol's: the selector on torch's GEMM

    def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
        return make_optimizer("adam", [p for p in model.parameters() if p.requires_grad],
                              lr=settings.lr, weight_decay=settings.glai_weight_decay)
    def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
        return make_optimizer("sgd", model.parameters(), lr=settings.lr,
                              weight_decay=settings.mlp_weight_decay)
    hand, twin, hand_py, hand_mkl = (copy.deepcopy(original) for _ in range(4))
    hand_step, loss = HandFusedMLPStep(hand, sgd(hand)), _squared_error(target)
    python_step = HandFusedMLPStep(hand_py, sgd(hand_py), native=False)
    mkl_step = HandFusedMLPStep(hand_mkl, sgd(hand_mkl), gemm="torch")
    steps = {
        "MLP": _stepper(original, sgd(original), x, target),
        "GLAI": _stepper(paper, adam(paper), x, target),
        "GLAI, extension GEMM": _stepper(head, adam(head), x, target),
        "GLAI fused": _fused_stepper(fused, adam(fused), x, target),
        "GLAI fused, torch Adam": _fused_stepper(fused_torch, adam(fused_torch), x, target,
                                                 kernel_adam=False),
        "GLAI fused, Python": _fused_stepper(fused_python, adam(fused_python), x, target,
                                             native=False),
        "MLP hand-fused": lambda: hand_step.step(lambda model: loss(model, x)),
        "MLP hand-fused, torch GEMM": lambda: mkl_step.step(lambda model: loss(model, x)),
        "MLP hand-fused, Python": lambda: python_step.step(lambda model: loss(model, x)),
    }
    if compiled:
        compiled_step = compiled_mlp_step(twin, loss, sgd(twin))
        steps["MLP compiled"] = lambda: compiled_step(x)
    return steps, f"B = {batch}, K = {head.path_count()}, μ = {budget.mu:.2%}"


def ordinary_pieces(name: str, backend: str = "cpp", batch: int | None = None
                    ) -> dict[str, Callable[[], None]]:
    """The pieces of paper head `name`'s ordinary GLAI step (module docstring, `--pieces`),
    each a callable."""
    spec, settings = PAPER_HEADS[name], paper_training(PAPER_HEADS[name])
    torch.manual_seed(0)
    _, head, budget = match(make_mlp((spec.n0, spec.n1, spec.n2)), spec.rho)
    head = prune(head, torch.randn(256, spec.n0), keep=budget.keep, layout="sparse").head
    head.backend = backend
    head.train()
    batch = batch or settings.batch_size
    x, target = torch.randn(batch, spec.n0), torch.randn(batch, spec.n2)
    params = [p for p in head.parameters() if p.requires_grad]
    adam = make_optimizer("adam", params, lr=settings.lr, weight_decay=settings.glai_weight_decay)
    step = _stepper(head, adam, x, target)
    step()  # the optimizer's state exists from here on
    (head(x) - target).square().mean().backward()
    grads = [p.grad.detach().clone() for p in params]
    adam.zero_grad(set_to_none=True)
    group, states = adam.param_groups[0], [adam.state[p] for p in params]
    leaf = torch.randn(batch, spec.n2)

    def forward_no_autograd() -> None:
        with torch.no_grad():
            head(x)

    def forward_loss_backward() -> None:
        for p in params:
            p.grad = None
        (head(x) - target).square().mean().backward()

    def loss_backward() -> None:
        (leaf.clone().requires_grad_() - target).square().mean().backward()

    def adam_step() -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        adam.step()

    def adam_kernel() -> None:
        beta1, beta2 = group["betas"]
        torch._fused_adam_(params, grads, [s["exp_avg"] for s in states],
                           [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
                           amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                           weight_decay=group["weight_decay"], eps=group["eps"],
                           maximize=False)
    return {"step": step, "forward": lambda: head(x), "forward, no autograd": forward_no_autograd,
            "selector": lambda: head.selector(x), "forward+loss+backward": forward_loss_backward,
            "loss+backward alone": loss_backward, "Adam step": adam_step,
            "Adam kernel alone": adam_kernel}


def _pieces_line(name: str, t: dict[str, float]) -> str:
    """The pieces and the derived shares of the ordinary step, in µs and % of the step."""
    derived = {
        "backward through the estimator's node": (t["forward+loss+backward"] - t["forward"]
                                                  - t["loss+backward alone"]),
        "Adam's Python wrapper": t["Adam step"] - t["Adam kernel alone"],
        "autograd recording in the forward": t["forward"] - t["forward, no autograd"],
        "rest (the pieces' interaction)": (t["step"] - t["forward+loss+backward"]
                                           - t["Adam step"]),
    }
    cells = [f"{k} {1e6 * v:.1f}" for k, v in t.items()]
    shares = [f"{k} {1e6 * v:.1f} ({100 * v / t['step']:.0f}%)" for k, v in derived.items()]
    return f"{name} pieces (µs, CPU clock): " + ", ".join(cells) + "; derived: " + ", ".join(
        shares)


def best_steps(steps: dict[str, Callable[[], None]], threads: list[int], repeats: int,
               clock: Callable[[], float]) -> dict[tuple[str, int], float]:
    """{(step name, thread count): the fastest round's seconds per step} (`step_rounds`)."""
    return {key: min(times) for key, times in step_rounds(steps, threads, repeats,
                                                          clock).items()}


def step_rounds(steps: dict[str, Callable[[], None]], threads: list[int], repeats: int,
                clock: Callable[[], float]) -> dict[tuple[str, int], tuple[float, ...]]:
    """{(step name, thread count): each round's seconds per step, in round order} on
    `clock`, every step at every thread count interleaved in each of `repeats` rounds (so one
    round's times of two steps are paired in time)."""
    label = {(name, n): f"{name} @{n}" for name in steps for n in threads}
    fns = {text: steps[name] for (name, _), text in label.items()}
    previous, per_call = torch.get_num_threads(), {}
    try:
        for (name, n), text in label.items():
            # warm-up: extension, optimizer state, the thread pools; its median sizes the blocks
            torch.set_num_threads(n)
            per_call[text] = warm(steps[name], CPU)[1]
    finally:
        torch.set_num_threads(previous)
    timings = time_interleaved(fns, per_call, SAMPLE_S * repeats, repeats, clock=clock,
                               threads={text: n for (_, n), text in label.items()})
    return {key: timings[text].rounds for key, text in label.items()}


class Sweep:
    """An in-place add of 1 over `mib` MiB of float32, one pass a call (`--beside`)."""

    def __init__(self, mib: float) -> None:
        if not 0 < mib <= MAX_BESIDE_MIB:
            raise ValueError(f"--beside must be a number of MiB in (0, {MAX_BESIDE_MIB:g}], "
                             f"got {mib:g}")
        try:
            self.buffer = torch.zeros(max(1, round(mib * 2**20 / 4)))
        except (RuntimeError, TypeError, OverflowError) as e:  # the allocator's refusal
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"--beside {mib:g} MiB: cannot allocate it ({reason})") from None

    def __call__(self) -> None:
        self.buffer.add_(1.0)


def beside(steps: dict[str, Callable[[], None]], sweep: Sweep
           ) -> dict[str, Callable[[], None]]:
    """`steps`, each followed by one `sweep` (one buffer shared by all), and the sweep alone
    under SWEEP (`--beside`; `without_sweep` subtracts it)."""

    def followed(step: Callable[[], None]) -> Callable[[], None]:
        def step_then_sweep() -> None:
            step()
            sweep()
        return step_then_sweep
    return {**{name: followed(step) for name, step in steps.items()}, SWEEP: sweep}


def without_sweep(rounds: dict[tuple, tuple[float, ...]]) -> dict[tuple, tuple[float, ...]]:
    """`rounds` keyed (step, *rest), each round's time less the SWEEP's time in the same
    round of the same rest (thread count, clock), and the SWEEP entries left out."""
    return {key: tuple(t - s for t, s in zip(times, rounds[(SWEEP, *key[1:])], strict=True))
            for key, times in rounds.items() if key[0] != SWEEP}


def _spread(numerator: tuple[float, ...], denominator: tuple[float, ...]) -> str:
    """The round-by-round ratio of two steps' times: median [min, max]."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return (f"per round {statistics.median(ratios):.2f}x [{min(ratios):.2f}, "
            f"{max(ratios):.2f}]")


def sparse_backend(name: str) -> str:
    """`--backend`: a registered backend of the sparse op."""
    from glai_kernels.sparse import SPARSE_ESTIMATOR

    try:
        SPARSE_ESTIMATOR.get(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench sparse-train-step",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=list(PAPER_HEADS),
                        choices=list(PAPER_HEADS))
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--backend", default="cpp", type=sparse_backend,
                        help="a registered backend of the sparse op (default: cpp)")
    parser.add_argument("--pieces", action="store_true",
                        help="time the pieces of the ordinary GLAI step instead")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile'd MLP step (it compiles per head)")
    parser.add_argument("--batch", type=positive_int,
                        help="rows per step (default: the paper's batch size; a family C "
                             "episode feeds way x (shot + query) rows: 50 at C1, 75 at C2)")
    parser.add_argument("--beside", type=non_negative_float, default=0.0, metavar="MIB",
                        help="follow every step with a pass over MIB MiB of memory (at most "
                             f"{MAX_BESIDE_MIB:g}), its own time subtracted: the steps with "
                             "their caches taken (default: 0, back to back)")
    args = parser.parse_args(argv)
    if args.beside and args.pieces:
        parser.error("argument --beside: times the steps, not --pieces")
    sweep = None
    if args.beside:
        try:  # allocated before any head is built: a size it cannot have fails at once
            sweep = Sweep(args.beside)
        except ValueError as e:
            parser.error(f"argument {e}")
    print(f"torch {torch.__version__}, {' and '.join(map(str, args.threads))} thread(s), "
          f"sparse backend {args.backend}, min over {args.repeats} interleaved repeats (the "
          f"protocols' ratios also repeat by repeat: median [min, max]); GLAI "
          f"(autograd) and GLAI fused step (Adam in the kernel, and torch's) / MLP step; the "
          f"paper protocol's ratio (ordinary / ordinary) and the engineered one's (GLAI fused "
          f"/ the fastest engineered MLP step)"
          + (f"; each step beside a {args.beside:g} MiB pass over memory, the pass's own time "
             f"subtracted" if args.beside else ""))
    clocks = {"cpu": time.thread_time, "wall": time.perf_counter}
    if args.pieces:
        for name in args.heads:
            timed = best_steps(ordinary_pieces(name, args.backend, args.batch), [1],
                               args.repeats, time.thread_time)
            print(_pieces_line(name, {piece: s for (piece, _), s in timed.items()}),
                  flush=True)
        return 0
    for name in args.heads:
        steps, what = head_steps(name, args.backend, args.batch, not args.no_compile)
        if sweep is not None:
            steps = beside(steps, sweep)
        rounds = {(model, n, c): times for c, clock in clocks.items()
                  for (model, n), times in step_rounds(steps, args.threads, args.repeats,
                                                       clock).items()}
        if sweep is not None:
            rounds = without_sweep(rounds)
            steps.pop(SWEEP)
        best = {key: min(times) for key, times in rounds.items()}
        if any(t <= 0 for times in rounds.values() for t in times):
            # a step less its pass came out ≤ 0 in some round: the pass's noise swamps it
            print(f"{name} ({what}): a step's time less the {args.beside:g} MiB pass came out "
                  f"≤ 0 in a round (the pass's own spread is larger than the step); no ratios: "
                  f"use a smaller --beside", flush=True)
            continue
        for n in args.threads:
            cells = "  ".join(_cells(c, {m: best[m, n, c] for m in steps},
                                     {m: rounds[m, n, c] for m in steps}) for c in clocks)
            print(f"{name} ({what}, {n} thread{'s' if n > 1 else ''})  {cells}", flush=True)
        if len(args.threads) > 1:
            wall = {m: min((best[m, n, "wall"], n) for n in args.threads) for m in steps}
            print(f"{name} each at its best thread count, wall: MLP {1e3 * wall['MLP'][0]:.3f} "
                  f"ms ({wall['MLP'][1]}), GLAI fused {1e3 * wall['GLAI fused'][0]:.3f} ms "
                  f"({wall['GLAI fused'][1]}): "
                  f"{wall['GLAI fused'][0] / wall['MLP'][0]:.2f}x", flush=True)
    return 0


def _cells(clock: str, best: dict[str, float],
           rounds: dict[str, tuple[float, ...]] | None = None) -> str:
    """One clock's cells: each step's fastest round and its ratio to the MLP step, then the
    two protocols' ratios, of the fastest rounds and, given `rounds`, round by round."""
    mlp, glai, fused = best["MLP"], best["GLAI"], best["GLAI fused"]
    glai_ext = best["GLAI, extension GEMM"]
    torch_adam, python = best["GLAI fused, torch Adam"], best["GLAI fused, Python"]
    engineered = {m: best[m] for m in ("MLP hand-fused", "MLP hand-fused, torch GEMM",
                                       "MLP hand-fused, Python", "MLP compiled") if m in best}
    winner = min(engineered, key=engineered.get)
    others = "".join(f", {m[4:]} {1e3 * s:.3f} ms" for m, s in engineered.items())
    return (f"{clock}: MLP {1e3 * mlp:.3f} ms, GLAI {1e3 * glai:.3f} ms ({glai / mlp:.2f}x; "
            f"its selector on the extension's GEMM {1e3 * glai_ext:.3f} ms, "
            f"{glai_ext / mlp:.2f}x), "
            f"fused {1e3 * fused:.3f} ms ({fused / mlp:.2f}x), fused with torch's Adam "
            f"{1e3 * torch_adam:.3f} ms ({torch_adam / mlp:.2f}x), fused's Python path "
            f"{1e3 * python:.3f} ms ({python / mlp:.2f}x); MLP engineered{others}: "
            f"paper ratio {glai / mlp:.2f}x"
            + (f" ({_spread(rounds['GLAI'], rounds['MLP'])})" if rounds else "")
            + f", engineered ratio (fused / {winner[4:]}) {fused / engineered[winner]:.2f}x"
            + (f" ({_spread(rounds['GLAI fused'], rounds[winner])})" if rounds else ""))


if __name__ == "__main__":
    raise SystemExit(main())
