"""Where the engineered protocol's two steps spend their time, side by side (issue 41;
docs/notes/sparse.md, "Where the engineered steps' time goes, both sides (issue 41, stop 57)").

    glai-bench step-anatomy [--heads A2 B1] [--rounds 15]

Per paper head, the fused GLAI step (`FusedSparseStep`) and the hand-fused MLP step
(`HandFusedMLPStep`), built as `glai-bench sparse-train-step` builds them, each on its native
path: one extension call for the forward and one for the update. Each step is split into
parts, all timed interleaved in rounds (`sparse_train_step.step_rounds`, this thread's CPU
clock, one thread):

  forward   the step's forward call alone (`glai_ext::sparse_step_forward` /
            `glai_ext::mlp_step_forward`), replayed with the arguments the step passed it
  loss      the step's loss, (y - target)² mean, and its gradient to y by autograd, on a leaf
  update    the step's update call alone (`glai_ext::sparse_step_update` /
            `glai_ext::mlp_step_update`), replayed likewise
  sequence  the three one after the other, as the step runs them (the loss on the forward's y;
            the update, as alone, on the operands recorded, its gradient included)
  step      the whole step

and, round by round, two differences: `python` = step - sequence (the step's own Python: its
checks, lookups and argument lists) and `interference` = sequence - (forward + loss + update)
(what the parts cost beside one another more than each repeated alone: caches, branch
predictors). Each is printed as the median over rounds [min, max], both sides and GLAI - MLP.
The replayed update steps the copy's parameters again with the recorded gradient: the time of
an update, not a trained model.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from bench.cli_types import positive_int
from bench.studies.sparse_train_step import head_steps, step_rounds
from glai_kernels import extension
from glai_kernels.paper_heads import PAPER_HEADS

# each side: (its step in `head_steps`, its forward op, its update op)
SIDES = {"GLAI": ("GLAI fused", "sparse_step_forward", "sparse_step_update"),
         "MLP": ("MLP hand-fused", "mlp_step_forward", "mlp_step_update")}
PARTS = ("forward", "loss", "update", "sequence", "step")
DERIVED = ("python", "interference")


@contextlib.contextmanager
def recorded_calls(names: tuple[str, ...]) -> Iterator[dict[str, tuple]]:
    """Inside, each named `torch.ops.glai_ext` op records its last call's arguments in the
    dict yielded (name -> args) and runs as before; the ops are put back on leaving, on an
    error too."""
    namespace = torch.ops.glai_ext
    originals = {name: getattr(namespace, name) for name in names}
    seen: dict[str, tuple] = {}

    def recorder(name: str, op: Callable) -> Callable:
        def call(*args):
            seen[name] = args
            return op(*args)
        return call

    try:
        for name, op in originals.items():
            setattr(namespace, name, recorder(name, op))
        yield seen
    finally:
        for name, op in originals.items():
            setattr(namespace, name, op)


def side_parts(step: Callable[[], None], forward_op: str, update_op: str
               ) -> dict[str, Callable[[], None]]:
    """{part: fn} for one side (module docstring): its step run once to record its two calls.
    RuntimeError naming the op when the step did not make that call (not on its native
    path)."""
    with recorded_calls((forward_op, update_op)) as seen:
        step()
    missing = [name for name in (forward_op, update_op) if name not in seen]
    if missing:
        raise RuntimeError(f"the step made no glai_ext::{missing[0]} call: it is not on its "
                           f"native path here")
    forward, update = (getattr(torch.ops.glai_ext, n) for n in (forward_op, update_op))
    forward_args, update_args = seen[forward_op], seen[update_op]
    y = forward(*forward_args)[0].detach()
    target = torch.randn_like(y)

    def loss_of(out: torch.Tensor) -> None:
        out.requires_grad_()
        torch.autograd.grad((out - target).square().mean(), [out])

    def sequence() -> None:
        loss_of(forward(*forward_args)[0])
        update(*update_args)

    return {"forward": lambda: forward(*forward_args), "loss": lambda: loss_of(y.detach()),
            "update": lambda: update(*update_args), "sequence": sequence, "step": step}


def derived(rounds: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """`rounds` ({part: seconds per call, round by round}) with `python` and `interference`
    added, each round's from that round's parts."""
    out = dict(rounds)
    out["python"] = tuple(s - q for s, q in zip(rounds["step"], rounds["sequence"], strict=True))
    out["interference"] = tuple(
        q - f - loss - u for q, f, loss, u in zip(rounds["sequence"], rounds["forward"],
                                                   rounds["loss"], rounds["update"], strict=True))
    return out


def _cell(times: tuple[float, ...]) -> str:
    us = [1e6 * t for t in times]
    return f"{statistics.median(us):7.1f} [{min(us):.1f}, {max(us):.1f}]"


def report(name: str, description: str, sides: dict[str, dict[str, tuple[float, ...]]]
           ) -> str:
    """One head's table: a row per part, GLAI, MLP and GLAI - MLP (round by round)."""
    glai, mlp = sides["GLAI"], sides["MLP"]
    lines = [f"{name} ({description}): µs per step, median over {len(glai['step'])} rounds "
             f"[min, max]",
             f"  {'part':13s} {'GLAI fused':>26s} {'MLP hand-fused':>26s} {'GLAI - MLP':>26s}"]
    for part in (*PARTS, *DERIVED):
        difference = tuple(g - m for g, m in zip(glai[part], mlp[part], strict=True))
        lines.append(f"  {part:13s} {_cell(glai[part]):>26s} {_cell(mlp[part]):>26s} "
                     f"{_cell(difference):>26s}")
    ratio = [g / m for g, m in zip(glai["step"], mlp["step"], strict=True)]
    lines.append(f"  step ratio GLAI / MLP, round by round: {statistics.median(ratio):.2f} "
                 f"[{min(ratio):.2f}, {max(ratio):.2f}]")
    return "\n".join(lines)


def anatomy(name: str, rounds: int) -> str:
    """Head `name`'s table (`report`), its two sides' parts interleaved in `rounds` rounds."""
    steps, description = head_steps(name, compiled=False)
    fns: dict[str, Callable[[], None]] = {}
    for side, (step, forward_op, update_op) in SIDES.items():
        for part, fn in side_parts(steps[step], forward_op, update_op).items():
            fns[f"{side} {part}"] = fn
    timed = step_rounds(fns, [1], rounds, time.thread_time)
    sides = {side: derived({part: timed[(f"{side} {part}", 1)] for part in PARTS})
             for side in SIDES}
    return report(name, description, sides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.step_anatomy",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=list(PAPER_HEADS), choices=list(PAPER_HEADS))
    parser.add_argument("--rounds", type=positive_int, default=15)
    args = parser.parse_args(argv)
    error = extension.load().error
    if error is not None:
        parser.error(f"the cpp extension is unavailable here, and both steps' native paths "
                     f"need it: {error}")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(f"torch {torch.__version__}, one thread, CPU clock (bench/studies/step_anatomy.py"
              f"'s docstring defines the parts)")
        for name in args.heads:
            print(anatomy(name, args.rounds), flush=True)
    finally:
        torch.set_num_threads(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
