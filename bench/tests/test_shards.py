"""Runs split over processes or machines (bench/harness/shards.py): `--shard K/N`, torchrun's
RANK/WORLD_SIZE and SLURM's job-array variables each pick a deterministic, balanced part of
the cases (kernels) or units (pipeline); `glai-bench merge` joins the parts into what one
unsharded run of the same cases writes; the pipeline's report survives a unit cut off.

The end-to-end runs are tiny and launched together (module fixture `runs`): one unsharded
kernel run, its two shards (shard 1 under torchrun's variables, shard 2 under SLURM's, so
both launchers are read), one unsharded pipeline run and its two shards likewise."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from bench.harness import shards
from bench.harness.sweeps import PRESETS as KERNEL_PRESETS
from bench.pipeline import merge as pipeline_merge
from bench.pipeline import runner
from bench.pipeline.presets import PRESETS as PIPELINE_PRESETS
from glai_kernels.paper_heads import PAPER_HEADS

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID",
             "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT")
TORCHRUN_2 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}  # 0-based: shard 2 of 2
SLURM_1 = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "7",
           "SLURM_ARRAY_TASK_COUNT": "2"}  # the array's first task: shard 1 of 2
KERNELS = ["-m", "bench", "run", "--suite", "kernels", "--preset", "quick", "--heads", "A1,A2",
           "--batches", "16", "--dtypes", "float32", "--backends", "einsum", "--peers", "none",
           "--rounds", "1", "--min-time", "0.01", "--device", "cpu", "--threads", "1",
           "--no-plots", "--no-history", "--no-progress"]
PIPELINE = ["-m", "bench", "pipeline", "--preset", "quick", "--heads", "A1,A2", "--seeds", "1",
            "--device", "cpu", "--jobs", "1", "--no-progress"]
# what must agree between a merged and an unsharded kernel run (timings do not)
CASE = ["sweep", "head", "backend", "dtype", "pass", "batch", "inputs", "paths", "outputs"]


def _env(launcher: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    return {**env, "PYTHONPATH": str(ROOT), **launcher}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every end-to-end run of this module at once (they share two cores; none times
    anything that is asserted): {name: folder}."""
    tmp = tmp_path_factory.mktemp("shards")
    jobs = {
        "kernels": ([*KERNELS, "--out", str(tmp / "k-one")], {}),
        "kernels-1": ([*KERNELS, "--out", str(tmp / "k")], SLURM_1),
        "kernels-2": ([*KERNELS, "--out", str(tmp / "k")], TORCHRUN_2),
        "pipeline": ([*PIPELINE, "--out", str(tmp / "p-one")], {}),
        "pipeline-1": ([*PIPELINE, "--out", str(tmp / "p")], SLURM_1),
        "pipeline-2": ([*PIPELINE, "--out", str(tmp / "p")], TORCHRUN_2),
    }
    started = {name: subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(launcher),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
               for name, (args, launcher) in jobs.items()}
    for name, process in started.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}:\n{output}"
    return {"kernels": tmp / "k-one", "kernels-1": tmp / "k" / "shard-1-of-2",
            "kernels-2": tmp / "k" / "shard-2-of-2", "pipeline": tmp / "p-one",
            "pipeline-1": tmp / "p" / "shard-1-of-2", "pipeline-2": tmp / "p" / "shard-2-of-2",
            "tmp": tmp}


def _merge(*args: str) -> SimpleNamespace:
    """`glai-bench merge ARGS` in this process (a fresh one would spend seconds importing):
    its returncode, stdout and stderr."""
    from bench import __main__ as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["merge", *args])
    return SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


def test_kernel_shards_merge_to_the_unsharded_run(runs):
    one, first, second = (pd.read_csv(runs[k] / "results.csv")
                          for k in ("kernels", "kernels-1", "kernels-2"))
    # disjoint parts, each one non-empty, that together are the unsharded run's cases
    assert len(first) and len(second)
    assert not set(map(tuple, first[CASE].values)) & set(map(tuple, second[CASE].values))
    for k, launcher in (("kernels-1", "SLURM"), ("kernels-2", "torchrun")):
        meta = json.loads((runs[k] / "results.json").read_text())
        number = int(k[-1])
        assert meta["provenance"]["shard"] == {"number": number, "count": 2, "source": launcher}
        assert f"(shard {number}/2 from {launcher})" in meta["command"]
    out = runs["tmp"] / "k-merged"
    done = _merge(str(out), str(runs["kernels-1"]), str(runs["kernels-2"]), "--no-plots")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    merged = pd.read_csv(out / "results.csv")
    key = [*CASE, "status", "winner"]
    assert (merged[key].sort_values(CASE).reset_index(drop=True)
            .equals(one[key].sort_values(CASE).reset_index(drop=True)))
    meta = json.loads((out / "results.json").read_text())
    assert meta["shards"] == {"count": 2, "merged": [1, 2], "missing": []}
    assert "shard" not in meta["provenance"]
    assert [m["shard"]["number"] for m in meta["merged_from"]] == [1, 2]
    # a shard's dispatch table exists exactly when the unsharded run's does
    assert (out / "dispatch").exists() == (runs["kernels"] / "dispatch").exists()


def test_a_missing_kernel_shard_is_named(runs):
    done = _merge(str(runs["tmp"] / "k-half"), str(runs["kernels-1"]), "--no-plots")
    assert done.returncode == 0, done.stderr
    assert "shard(s) 2 of 2 missing" in done.stderr


def _units(records: list[dict]) -> list[tuple]:
    return sorted((r["head"], r["data"], r["seed"], r["model"], r["epochs"], r["bvs"])
                  for r in records)


def test_pipeline_shards_merge_to_the_unsharded_records(runs):
    one = json.loads((runs["pipeline"] / "results.json").read_text())
    parts = [json.loads((runs[k] / "results.json").read_text())
             for k in ("pipeline-1", "pipeline-2")]
    assert all(p["records"] for p in parts)
    assert {p["meta"]["shard"]["source"] for p in parts} == {"SLURM", "torchrun"}
    assert "**Part of a run**: shard 1 of 2" in (runs["pipeline-1"] / "README.md").read_text()
    out = runs["tmp"] / "p-merged"
    # detected as pipeline folders without --pipeline
    done = _merge(str(out), str(runs["pipeline-1"]), str(runs["pipeline-2"]))
    assert done.returncode == 0, done.stderr
    merged = json.loads((out / "results.json").read_text())
    # the same epochs and scores: training is deterministic per seed
    assert _units(merged["records"]) == _units(one["records"])
    assert [r["head"] for r in merged["records"]] == [r["head"] for r in one["records"]]
    for name in ("table3.md", "figure5.png", "wilcoxon.md"):
        assert (out / name).exists()
    assert "Part of a run" not in (out / "README.md").read_text()


def test_a_pipeline_unit_present_twice_is_kept_once_with_a_note(runs, tmp_path):
    again = shutil.copytree(runs["pipeline-1"], tmp_path / "again")  # a shard run twice
    done = _merge("--pipeline", str(tmp_path / "m"), str(runs["pipeline-1"]), str(again),
                  str(runs["pipeline-2"]))
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    one = json.loads((runs["pipeline"] / "results.json").read_text())
    assert _units(merged["records"]) == _units(one["records"])
    assert "the first's records kept" in done.stderr
    assert len(merged["meta"]["merge_notes"]) == 1
    assert "the first's records kept" in (tmp_path / "m" / "README.md").read_text()


def test_a_kernel_run_and_a_pipeline_run_do_not_merge(runs, tmp_path):
    done = _merge("--pipeline", str(tmp_path / "m"), str(runs["kernels"]))
    assert done.returncode == 2
    assert "not a pipeline results.json" in done.stderr


def test_partial_report_names_the_units_still_to_come(runs, tmp_path):
    records = json.loads((runs["pipeline-1"] / "results.json").read_text())
    meta = {**records["meta"], "units": {"planned": ["a", "b", "c"], "done": ["a"],
                                         "timed_out": ["b"], "failed": [],
                                         "partial": True},
            "unit_time_limit_s": 5.0}
    meta.pop("shard")
    runner.write_report_atomically(records["records"], meta, tmp_path)
    readme = (tmp_path / "README.md").read_text()
    assert "1 of 3 units finished so far" in readme
    assert "unit time limit of 5.0 s, so not in the tables: b" in readme
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]


def test_a_run_cut_off_keeps_its_finished_units_report(runs, tmp_path):
    # the runner's own bookkeeping, fed the two shards' records as their units end: after the
    # first unit the report holds it (written while running); a second unit cut off at its
    # limit leaves the first's report, naming the second as cut off
    records = {}
    for k in ("pipeline-1", "pipeline-2"):
        data = json.loads((runs[k] / "results.json").read_text())
        records[data["records"][0]["head"]] = data
    preset = dataclasses.replace(PIPELINE_PRESETS["quick"], seeds=(0,), heads=tuple(
        PAPER_HEADS[h] for h in ("A1", "A2")))
    units = runner.units_of(preset, {})
    meta = {k: v for k, v in records["A1"]["meta"].items()
            if k not in ("shard", "units", "data", "wall_seconds", "cpu_seconds")}
    collector = runner._Collector(preset, tmp_path, units, {**meta, "unit_time_limit_s": 9.0},
                                  _NoBar())
    first = records[units[0].head.name]
    collector.done(units[0], (first["records"], "synthetic", "test data", 1.0), "ok")
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["records"] == first["records"]
    assert written["meta"]["units"]["partial"] is True
    assert "1 of 2 units finished so far" in (tmp_path / "README.md").read_text()
    collector.done(units[1], None, "timed out")
    collector.write()
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["records"] == first["records"]
    assert written["meta"]["units"]["timed_out"] == [runner.unit_label(units[1])]
    readme = (tmp_path / "README.md").read_text()
    assert f"unit time limit of 9.0 s, so not in the tables: {runner.unit_label(units[1])}" \
        in readme
    assert "finished so far" not in readme


class _NoBar:
    def update(self) -> None:
        pass

    def finish(self, unit) -> None:  # bench.harness.progress.EtaBar's: a unit ended
        pass

    def item_seconds(self, unit) -> None:  # EtaBar's: this bar saw no unit start
        return None


def test_a_unit_past_its_time_limit_is_stopped_and_named(tmp_path):
    # far too short for a unit (its process alone takes seconds to start): the run ends,
    # no record, and its report says why rather than hanging or raising (since stop 48 a run
    # with no unit finished still writes one, so a cut-off GPU lease keeps the reason)
    records = runner.run_preset("quick", tmp_path, heads=["A2"], seeds=1, device="cpu",
                                progress=False, unit_time_limit_s=0.2)
    assert records == []
    assert json.loads((tmp_path / "results.json").read_text())["records"] == []
    readme = (tmp_path / "README.md").read_text()
    assert "no unit finished" in readme
    assert "cut off at the unit time limit of 0.2 s" in readme
    assert "A2 on synthetic, seed 0" in readme


# the split itself


def test_shard_numbers_from_each_launcher():
    assert shards.from_environment({}) is None
    assert shards.from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert shards.from_environment({"RANK": "2", "WORLD_SIZE": "4"}) == shards.Shard(
        3, 4, "torchrun")
    assert shards.from_environment(SLURM_1) == shards.Shard(1, 2, "SLURM")
    # SLURM_ARRAY_TASK_MIN defaults to 0; SLURM wins over torchrun's variables
    assert shards.from_environment({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "3",
                                    "RANK": "0", "WORLD_SIZE": "2"}) == shards.Shard(
        2, 3, "SLURM")
    assert shards.resolve(shards.Shard(1, 2), {"RANK": "1", "WORLD_SIZE": "2"}) == shards.Shard(
        1, 2)


@pytest.mark.parametrize("environ, named", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "$RANK"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "$RANK"),
    ({"WORLD_SIZE": "two"}, "$WORLD_SIZE"),
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "2"}, "$SLURM_ARRAY_TASK_ID"),
])
def test_a_bad_launcher_variable_is_named(environ, named):
    with pytest.raises(ValueError, match=named.replace("$", r"\$")):
        shards.from_environment(environ)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2", "1/2/3"])
def test_a_bad_shard_spec_is_an_argparse_error(text):
    with pytest.raises(argparse.ArgumentTypeError, match="K/N"):
        shards.parse(text)


def test_cli_refuses_a_bad_shard_and_a_sharded_install(capsys):
    from bench import __main__ as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--shard", "3/2"])
    assert exit_.value.code == 2
    assert "argument --shard" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--shard", "1/2", "--install-dispatch"])
    assert exit_.value.code == 2
    assert "--install-dispatch: not with --shard" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["pipeline", "--shard", "0/2"])
    assert exit_.value.code == 2


def test_split_is_a_deterministic_balanced_partition():
    costs = [5.0, 1.0, 4.0, 1.0, 3.0, 2.0, 2.0]
    parts = [shards.split(range(len(costs)), costs.__getitem__, shards.Shard(k, 3))
             for k in (1, 2, 3)]
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert all(p == sorted(p) for p in parts)  # each in the original order
    loads = [sum(costs[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(costs)  # greedy longest-first's bound
    # longest first into the least-loaded bin: 5 | 4 | 3, 2 -> 3's, 2 -> 4's, 1 -> 5's,
    # 1 -> 3's (the bins now 6, 6, 5): deterministic, and here perfectly even
    assert parts == [[0, 1], [2, 6], [3, 4, 5]]
    assert shards.split([1, 2], float, None) == [1, 2]
    assert shards.split([1], float, shards.Shard(2, 2)) == []


def test_kernel_and_pipeline_costs_rank_the_big_ones_first():
    from bench.harness import suite
    from bench.harness.runner import cases_for

    cases = cases_for(KERNEL_PRESETS["quick"], heads=["A1"])
    by_batch = {c.shape.batch: suite.case_cost(c) for c in cases if c.sweep == "batch@A1"}
    assert by_batch[256] > by_batch[16]
    preset = PIPELINE_PRESETS["default"]
    costs = {u.head.name: runner.unit_cost(preset, u)
             for u in runner.units_of(preset, {}) if u.seed == 0}
    assert costs["B1"] > costs["A2"]  # B's units are the longest (docs/notes/benchmarks.md)


def test_is_pipeline_run_tells_the_two_kinds_of_folder(runs):
    assert pipeline_merge.is_pipeline_run(runs["pipeline-1"])
    assert not pipeline_merge.is_pipeline_run(runs["kernels-1"])
    assert not pipeline_merge.is_pipeline_run(runs["tmp"] / "absent")
