"""The gate without a committed baseline (`bench.gate.paired`): this checkout against a base
commit, measured interleaved. First its rule on made-up runs (deterministic), then the base
checkout and the command line, then real timings with planted slowdowns (minutes: only with
GLAI_GATE_REAL=1, the `cpp` plant and one unchanged pass; GLAI_GATE_ALL=1 adds the `torch` and
`compile` plants and a second unchanged pass; CI runs the real comparison as `nox -s gate`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bench.gate import cli, paired
from bench.gate.store import ROOT, accept
from bench.tests.helpers import fake_run

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores


def runs(seed: int, n: int, noise: float = 0.03, **slow) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [fake_run(rng, noise, slow=slow or None) for _ in range(n)]


def test_unchanged_code_passes():
    for seed in range(10):
        verdict, _ = paired.judge(runs(seed, 3), runs(100 + seed, 3))
        assert verdict.ok, paired.paired_report(verdict, _, "base")


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_a_planted_slowdown_fails_on_that_backend(backend):
    verdict, baseline = paired.judge(runs(1, 3), runs(2, 3, **{backend: 1.2}))
    assert not verdict.ok
    assert set(verdict.failed["backend"]) == {backend}
    groups = verdict.failed[verdict.failed["level"] == "group"]
    assert set(groups["pass"]) == {"forward", "both"}
    text = paired.paired_report(verdict, baseline, "HEAD~1 (abc)")
    assert text.startswith("regression gate: this checkout against HEAD~1 (abc)")
    assert f"| group | {backend} |" in text and "accept" not in text


def test_thresholds_are_k_times_the_pooled_spread_with_floors():
    base, cand = runs(3, 3, noise=0.05), runs(4, 3, noise=0.05)
    baseline, current = paired.paired_baseline(
        [paired.ratios(r) for r in base], [paired.ratios(r) for r in cand], k=3.0,
        case_floor=0.1, group_floor=0.05)
    key = dict(backend="torch", head="A1", metric="speedup_best", **{"pass": "forward"})
    logs = []
    for side in (base, cand):
        values = [next(row["speedup_best"] for row in r["rows"]
                       if all(row[k] == v for k, v in key.items() if k != "metric"))
                  for r in side]
        logs.append(np.log(values))
    pooled = np.sqrt(sum(((x - x.mean()) ** 2).sum() for x in logs) / 4)
    entry = next(e for e in baseline["entries"]
                 if all(e[k] == v for k, v in key.items()))
    assert entry["spread"] == pytest.approx(pooled)
    assert entry["threshold"] == pytest.approx(max(0.1, 3 * pooled))
    assert entry["median"] == pytest.approx(np.exp(logs[0].mean()))
    value = current.set_index(["backend", "head", "pass", "metric"]).loc[
        ("torch", "A1", "forward", "speedup_best"), "value"]
    assert value == pytest.approx(np.exp(logs[1].mean()))
    for g in baseline["groups"]:
        assert g["threshold"] == pytest.approx(max(0.05, 3 * g["spread"]))
        assert g["cases"] == 4


def test_noisy_runs_widen_the_thresholds():
    quiet, _ = paired.paired_baseline([paired.ratios(r) for r in runs(5, 3, 0.01)],
                                      [paired.ratios(r) for r in runs(6, 3, 0.01)])
    noisy, _ = paired.paired_baseline([paired.ratios(r) for r in runs(5, 3, 0.2)],
                                      [paired.ratios(r) for r in runs(6, 3, 0.2)])
    assert all(e["threshold"] == pytest.approx(paired.CASE_FLOOR) for e in quiet["entries"])
    assert max(e["threshold"] for e in noisy["entries"]) > 0.3


def test_a_backend_the_candidate_lost_is_named_not_judged():
    cand = runs(14, 2)
    for run in cand:
        for row in run["rows"]:
            if row["backend"] == "cpp":
                row["correct"] = False
    verdict, baseline = paired.judge(runs(15, 2), cand)
    assert "cpp" not in set(verdict.table["backend"])
    assert len(verdict.missing) == 16 and all(m.startswith("cpp") for m in verdict.missing)
    assert "16 baseline measurements absent" in paired.paired_report(verdict, baseline, "b")


def test_one_run_per_side_has_no_spread():
    with pytest.raises(ValueError, match="pairs"):
        paired.judge(runs(7, 1), runs(8, 1))
    with pytest.raises(ValueError, match="different machines"):
        paired.judge(runs(7, 2), [fake_run(np.random.default_rng(9), 0.0, machine="cuda-X")] * 2)


def test_versus_interleaves_plants_the_candidate_only_and_confirms(monkeypatch):
    calls = []
    queue = {"base": runs(10, 4), "candidate": runs(11, 4, torch=1.3)}

    def fake_measure(tree, *, preset, device, plant=None, timing=None):
        side = "candidate" if tree == ROOT else "base"
        calls.append((side, plant))
        return queue[side].pop(0)

    monkeypatch.setattr(paired, "measure_in", fake_measure)
    passed, text, cand = paired.versus("HEAD", pairs=2, confirm=1, jobs=1, plant="torch=1.3",
                                       log=lambda _: None)
    assert not passed and "| group | torch |" in text
    assert calls == [("base", None), ("candidate", "torch=1.3")] * 3  # 2 pairs + 1 confirming
    assert len(cand) == 3
    # side by side: the same runs, each pair's order left to the two processes
    calls.clear()
    queue.update(base=runs(12, 2), candidate=runs(13, 2))
    passed, text, cand = paired.versus("HEAD", pairs=2, confirm=0, log=lambda _: None)
    assert passed and sorted(calls) == [("base", None)] * 2 + [("candidate", None)] * 2
    with pytest.raises(ValueError, match="jobs"):
        paired.versus("HEAD", jobs=3)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_baseline_failure_earns_the_confirming_pair(monkeypatch, tmp_path, persistent, capsys):
    """`check --baseline`: the oracle's share below the committed baseline in both sides' first
    two runs (the shared machine's slow minute: the paired check sees nothing) fails the
    baseline check, so a third pair is measured; judged on each ratio's best over the
    candidate's runs, a third run at full speed passes, a third as slow fails."""
    accept(runs(20, 5), baseline_dir=tmp_path)
    slow = {"einsum": 1.2}
    third = slow if persistent else {}
    queue = {"base": runs(21, 2, **slow) + runs(22, 1, **third),
             "candidate": runs(23, 2, **slow) + runs(24, 1, **third)}
    calls = []

    def fake_measure(tree, *, preset, device, plant=None, timing=None):
        side = "candidate" if tree == ROOT else "base"
        calls.append(side)
        return queue[side].pop(0)

    monkeypatch.setattr(paired, "measure_in", fake_measure)
    code = cli.main(["check", "--base", "HEAD", "--baseline", "--baseline-dir", str(tmp_path),
                     "--jobs", "1"])
    out = capsys.readouterr().out
    assert calls == ["base", "candidate"] * 3
    assert "re-measuring to confirm (1 of 1)" in out
    assert out.count("regression gate against reports/baseline/") == 2  # before and after
    assert code == (1 if persistent else 0)
    last = out[out.rindex("regression gate against"):]
    assert ("| group | einsum |" in last) == persistent


def test_base_revision_and_checkout():
    head = paired.git("rev-parse", "HEAD")
    base = paired.base_revision()
    assert base != head and len(base) == 40
    with paired.checkout("HEAD") as tree:
        assert (tree / "bench" / "gate").is_dir()
        assert paired.git("rev-parse", "HEAD", cwd=tree) == head
    assert not tree.exists()
    assert str(tree) not in paired.git("worktree", "list")
    # no such branch: the previous commit
    assert paired.base_revision(main="nonesuch") == paired.git("rev-parse", "HEAD~1")
    with pytest.raises(ValueError, match="nonesuch"):
        paired.checkout("nonesuch").__enter__()


def test_bad_usage_exits_2():
    def gate(*args):
        return subprocess.run([sys.executable, "-m", "bench.gate", "check", *args], cwd=ROOT,
                              capture_output=True, text=True)

    assert gate("--pairs", "1").returncode == 2
    done = gate("--base", "no-such-rev", "--confirm", "0")
    assert done.returncode == 2 and "no-such-rev" in done.stderr


# ---------------------------------------------------------------- real timings

# each real-timing check measures 4 to 6 fresh-process runs of the quick preset's cases, about
# two minutes each on two quiet cores: more than CI's budget holds beside `nox -s gate`, which
# runs the same comparison for real on every submission (this checkout against its base).
# GLAI_GATE_REAL=1 runs the unchanged pass and the `cpp` plant; GLAI_GATE_ALL=1 all of them.
ALL = os.environ.get("GLAI_GATE_ALL") == "1"
REAL = ALL or os.environ.get("GLAI_GATE_REAL") == "1"
full_only = pytest.mark.skipif(not ALL, reason="set GLAI_GATE_ALL=1 (minutes of timing)")
real_only = pytest.mark.skipif(not REAL, reason="set GLAI_GATE_REAL=1 (minutes of timing)")


def _real(plant: str | None) -> tuple[bool, str]:
    # a plant must fail on the first two pairs (no confirming pair: it costs a minute of CI);
    # unchanged code gets the confirming pair `check` gives it
    passed, text, _ = paired.versus("HEAD", pairs=2, confirm=0 if plant else 1, plant=plant,
                                    log=print)
    print(text)
    return passed, text


@real_only
def test_real_timings_an_unchanged_commit_passes():
    """HEAD against itself (2 to 3 pairs of the quick preset's cases), twice where
    GLAI_GATE_ALL=1."""
    for _ in range(2 if ALL else 1):
        passed, text = _real(None)
        assert passed, text


@real_only
@pytest.mark.parametrize("backend", [
    "cpp", pytest.param("torch", marks=full_only), pytest.param("compile", marks=full_only)])
def test_real_timings_a_planted_slowdown_is_caught(backend):
    """The backend slowed 1.2x (its kernels; `bench.gate.planted`) against HEAD unchanged."""
    passed, text = _real(f"{backend}=1.2")
    assert not passed, text
    assert f"| {backend} |" in text, text
