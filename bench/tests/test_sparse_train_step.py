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


def test_without_sweep_subtracts_the_pass_of_the_same_threads_and_clock():
    best = {("MLP", 1, "cpu"): 3.0, ("MLP", 2, "cpu"): 2.0, ("MLP", 1, "wall"): 5.0,
            (study.SWEEP, 1, "cpu"): 1.0, (study.SWEEP, 2, "cpu"): 0.5,
            (study.SWEEP, 1, "wall"): 2.0}
    assert study.without_sweep(best) == {("MLP", 1, "cpu"): 2.0, ("MLP", 2, "cpu"): 1.5,
                                         ("MLP", 1, "wall"): 3.0}


def test_main_reports_the_steps_less_the_pass(monkeypatch, capsys):
    """The ratios printed are those of the steps' own times: (4 - 1) / (3 - 1) = 1.50 for the
    paper protocol, where the times with the pass would give 1.33."""
    seen: dict[str, object] = {}

    def fake_head_steps(name, backend, batch, compiled):
        return {m: (lambda: None) for m in STEP_NAMES}, "fake"

    def fake_best_steps(steps, threads, repeats, clock):
        seen["steps"] = set(steps)
        with_pass = {"MLP": 3e-3, "GLAI": 4e-3, study.SWEEP: 1e-3}
        return {(m, n): with_pass.get(m, 2e-3) for m in steps for n in threads}

    monkeypatch.setattr(study, "head_steps", fake_head_steps)
    monkeypatch.setattr(study, "best_steps", fake_best_steps)
    assert study.main(["--heads", "A2", "--beside", "0.25", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert seen["steps"] == {*STEP_NAMES, study.SWEEP}
    assert "each step beside a 0.25 MiB pass over memory" in out
    assert re.search(r"cpu: MLP 2\.000 ms, GLAI 3\.000 ms \(1\.50x", out)
    assert "paper ratio 1.50x" in out and study.SWEEP not in out.split("\n", 1)[1]


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
