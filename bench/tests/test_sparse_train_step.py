"""`glai-bench sparse-train-step --beside MIB`: every step followed by a pass over memory whose
own time is subtracted (docs/notes/sparse.md, "The step on the Intel Xeon again: a noisy host,
and the cache state both steps run in (issue 41, stop 56)")."""

from __future__ import annotations

import re

import pytest

from bench.studies import sparse_train_step as study

# the steps `_cells` reads, without building a head
STEP_NAMES = ("MLP", "GLAI", "GLAI, extension GEMM", "GLAI fused", "GLAI fused, torch Adam",
              "GLAI fused, Python", "MLP hand-fused", "MLP hand-fused, torch GEMM",
              "MLP hand-fused, Python")


def test_beside_runs_each_step_then_one_pass_over_the_memory():
    calls: list[str] = []
    steps = study.beside({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                         study.Sweep(0.5))
    assert set(steps) == {"a", "b", study.SWEEP}
    sweep = steps[study.SWEEP]
    assert sweep.buffer.numel() * 4 == 2**19  # 0.5 MiB of float32
    steps["a"]()
    assert calls == ["a"] and bool((sweep.buffer == 1).all())
    steps["b"]()
    steps[study.SWEEP]()  # the pass alone runs no step
    assert calls == ["a", "b"] and bool((sweep.buffer == 3).all())
    with pytest.raises(ValueError, match="--beside"):
        study.Sweep(0)


def test_without_sweep_subtracts_the_pass_of_the_same_round_threads_and_clock():
    rounds = {("MLP", 1, "cpu"): (3.0, 4.0), ("MLP", 2, "cpu"): (2.0, 2.0),
              ("MLP", 1, "wall"): (5.0, 6.0), (study.SWEEP, 1, "cpu"): (1.0, 2.0),
              (study.SWEEP, 2, "cpu"): (0.5, 0.25), (study.SWEEP, 1, "wall"): (2.0, 2.0)}
    assert study.without_sweep(rounds) == {("MLP", 1, "cpu"): (2.0, 2.0),
                                           ("MLP", 2, "cpu"): (1.5, 1.75),
                                           ("MLP", 1, "wall"): (3.0, 4.0)}


# each step's seconds in three rounds, the pass's time included where --beside adds it
ROUNDS = {"MLP": (3e-3, 5e-3, 4e-3), "GLAI": (4e-3, 7e-3, 9e-3), "GLAI fused": (3e-3, 3e-3, 3e-3),
          "MLP hand-fused": (2e-3, 2e-3, 3e-3)}
PASS = (1e-3, 1e-3, 2e-3)


def _fake_study(monkeypatch, rounds):
    seen: dict[str, object] = {}

    def fake_head_steps(name, backend, batch, compiled):
        return {m: (lambda: None) for m in STEP_NAMES}, "fake"

    def fake_step_rounds(steps, threads, repeats, clock):
        seen["steps"] = set(steps)
        return {(m, n): rounds.get(m, (9e-3,) * 3) for m in steps for n in threads}

    monkeypatch.setattr(study, "head_steps", fake_head_steps)
    monkeypatch.setattr(study, "step_rounds", fake_step_rounds)
    return seen


def test_main_reports_the_fastest_rounds_and_the_ratios_round_by_round(monkeypatch, capsys):
    """Paper: min 4 / min 3 = 1.33; per round 4/3, 7/5, 9/4 = 1.33, 1.40, 2.25. Engineered:
    fused / hand-fused (the fastest engineered step) 3/2 = 1.50; per round 1.50, 1.50, 1.00."""
    _fake_study(monkeypatch, ROUNDS)
    assert study.main(["--heads", "A2", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"cpu: MLP 3\.000 ms, GLAI 4\.000 ms \(1\.33x", out)
    assert "paper ratio 1.33x (per round 1.40x [1.33, 2.25])" in out
    assert "engineered ratio (fused / hand-fused) 1.50x (per round 1.50x [1.00, 1.50])" in out


def test_main_reports_the_steps_less_the_pass(monkeypatch, capsys):
    """With --beside each round's pass is taken from the same round's steps: MLP (2, 4, 2),
    GLAI (3, 6, 7), paper 3 / 2 = 1.50, per round 1.50, 1.50, 3.50."""
    with_pass = {m: tuple(t + p for t, p in zip(times, PASS, strict=True))
                 for m, times in {"MLP": (2e-3, 4e-3, 2e-3), "GLAI": (3e-3, 6e-3, 7e-3)}.items()}
    seen = _fake_study(monkeypatch, {**ROUNDS, **with_pass, study.SWEEP: PASS})
    assert study.main(["--heads", "A2", "--beside", "0.25", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert seen["steps"] == {*STEP_NAMES, study.SWEEP}
    assert "each step beside a 0.25 MiB pass over memory" in out
    assert re.search(r"cpu: MLP 2\.000 ms, GLAI 3\.000 ms \(1\.50x", out)
    assert "paper ratio 1.50x (per round 1.50x [1.50, 3.50])" in out
    assert study.SWEEP not in out.split("\n", 1)[1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--pieces", "--beside", "1"], "argument --beside: times the steps, not --pieces"),
    (["--beside", "1e15"], "argument --beside must be a number of MiB in (0, 1024], got 1e+15"),
    (["--beside", "1025"], "argument --beside must be a number of MiB in (0, 1024], got 1025"),
])
def test_beside_refuses_before_building_a_head(monkeypatch, capsys, argv, message):
    def no_head(*args, **kwargs):
        raise AssertionError("a head was built")

    monkeypatch.setattr(study, "head_steps", no_head)
    monkeypatch.setattr(study, "ordinary_pieces", no_head)
    with pytest.raises(SystemExit) as e:
        study.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_pass_the_allocator_refuses_is_named(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nframe #0: ...")

    monkeypatch.setattr(study.torch, "zeros", refuse)
    with pytest.raises(ValueError, match=r"^--beside 512 MiB: cannot allocate it "
                                         r"\(DefaultCPUAllocator: can't allocate memory\)$"):
        study.Sweep(512)


def test_a_pass_that_swamps_the_steps_gives_no_ratios(monkeypatch, capsys):
    """A step less its pass ≤ 0 in a round (the pass's spread larger than the step): the head
    is named and no ratio is printed, where a negative or infinite one would be."""
    swamped = {**ROUNDS, "MLP": PASS, study.SWEEP: PASS}  # MLP less the pass: 0 every round
    _fake_study(monkeypatch, swamped)
    assert study.main(["--heads", "A2", "--beside", "1", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert "A2 (fake): a step's time less the 1 MiB pass came out ≤ 0" in out
    assert "paper ratio" not in out and "engineered ratio" not in out
