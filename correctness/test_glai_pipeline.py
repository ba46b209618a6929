"""The GLAI protocol (glai_kernels.glai) end to end through bench's experiment runner (tiny
heads, seconds), its data and its training pieces."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench.pipeline.data import digits, load_embeddings, save_embeddings, synthetic
from bench.pipeline.presets import Preset
from bench.pipeline.runner import run_config
from glai_kernels.glai.embeddings import EmbeddingSplits
from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.paper_training import INFO_NCE_TEMPERATURE
from glai_kernels.glai.protocol import MODELS, Protocol, run_head
from glai_kernels.glai.tasks import info_nce, two_views
from glai_kernels.glai.training import EarlyStopping
from glai_kernels.paper_heads import PAPER_HEADS


def tiny(name: str, n0: int, n1: int, n2: int):
    return dataclasses.replace(PAPER_HEADS[name], name=f"{name}-tiny", n0=n0, n1=n1, n2=n2)


TINY = (tiny("A1", 24, 16, 6), tiny("B1", 20, 16, 8), tiny("C1", 16, 12, 5))
TINY_PRESET = Preset(
    "test", TINY, (0, 1, 2),
    Protocol(max_epochs=4, max_epochs_b=3, max_epochs_c=4, patience_cap=2, reference_size=64,
             episodes_per_epoch=3, val_episodes=4, timing_repeats=3, probe_steps=4,
             compile_mlp=False),  # torch.compile's step: correctness/test_protocols.py
    {"A": {"train": 64, "val": 48, "test": 16}, "B": {"train": 48, "val": 32, "test": 16},
     "C": {"per_class": 12}},
    {"C1-tiny": ("synthetic", "digits")})  # digits' few-shot episodes are few: cheap


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    return run_config(TINY_PRESET, out, progress=False), out


def test_end_to_end_writes_every_report(tiny_run):
    records, out = tiny_run
    for name in ("README.md", "table3.md", "table3.csv", "figure5.png", "wilcoxon.md",
                 "wilcoxon.csv", "pruning.md", "results.json", "convergence.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "figure5.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # 4 (head, data) jobs x 3 seeds x every model
    assert len(records) == 4 * 3 * len(MODELS)
    readme = (out / "README.md").read_text()
    assert "synthetic embeddings" in readme and "scikit-learn digits" in readme
    assert "Estimator backend: " in readme
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["records"]) == len(records) and saved["meta"]["preset"] == "test"


def test_glai_records_are_consistent(tiny_run):
    records, _ = tiny_run
    glai = [r for r in records if r["model"].startswith("GLAI")]
    assert glai
    for r in glai:
        # reduced MLP + kept paths == original MLP (structured: whole columns, at most that)
        if r["model"] == "GLAI":
            assert r["params"] == r["params_original"] and not r["params_budget_capped"]
        else:
            assert r["params"] <= r["params_original"]
        wall = r["wall_reduced"] + r["wall_convert"] + r["wall_estimator"]
        assert r["seconds"] == pytest.approx(wall)
        assert min(r["wall_reduced"], r["wall_convert"], r["wall_estimator"]) > 0
        assert min(r["t_reduced"], r["t_convert"], r["t_estimator"]) > 0
        assert r["epochs_total"] == r["reduced_epochs"] + r["estimator_epochs"]
        assert r["backend"] and 0 < r["mu"] <= 1
        assert len(r["m_history"]) == r["reduced_epochs"]
    mlp = {(r["data"], r["head"], r["seed"]): r for r in records if r["model"] == "MLP"}
    for r in mlp.values():  # the original MLP's m_t, one per epoch, logged untimed
        assert len(r["m_history"]) == r["epochs"] and min(r["m_history"]) >= 0
    for r in glai:  # the paper's fixed fractions of the original MLP's epochs
        if r["switch"] != "fixed":
            continue
        family = r["family"]
        fraction = {"A": 0.2, "B": 0.15, "C": 0.1}[family]
        expected = max(1, int(fraction * mlp[(r["data"], r["head"], r["seed"])]["epochs"] + 0.5))
        assert r["reduced_epochs"] == expected


def test_tables_have_every_model_and_valid_p_values(tiny_run):
    import pandas as pd

    _, out = tiny_run
    table = pd.read_csv(out / "table3.csv")
    assert set(table["head"]) == set(MODELS)
    assert (table.groupby(["data", "exp"]).size() == len(MODELS)).all()
    tests = pd.read_csv(out / "wilcoxon.csv")
    assert set(tests["comparison"]) >= {"GLAI vs. MLP", "MLP reduced vs. MLP", "Linear vs. MLP",
                                        "GLAI vs. Linear", "GLAI vs. MLP reduced"}
    assert ((tests["time p"] > 0) & (tests["time p"] <= 1)).all()
    assert (tests.loc[tests.data == "synthetic", "pairs"] == 9).all()  # 3 heads x 3 seeds


def test_users_embeddings_roundtrip_and_run(tmp_path):
    head = TINY[0]
    data = synthetic(head, TINY_PRESET.sizes["A"], seed=3)
    for suffix in (".npz", ".pt"):
        path = tmp_path / f"mine{suffix}"
        save_embeddings(path, data)
        loaded = load_embeddings(path)
        for split in ("train", "val", "test"):
            assert torch.equal(loaded.x[split], data.x[split])
            assert torch.equal(loaded.y[split], data.y[split])
        assert loaded.description == data.description
    preset = dataclasses.replace(TINY_PRESET, heads=(head,), seeds=(0,))
    records = run_config(preset, tmp_path / "out", data_files={"A1": tmp_path / "mine.npz"},
                         progress=False)
    assert {r["data"] for r in records} == {"mine"} and len(records) == len(MODELS)


def test_loader_errors_name_the_problem(tmp_path):
    import numpy as np

    np.savez(tmp_path / "a.npz", x_train=np.ones((4, 3)), y_train=np.zeros(4))
    with pytest.raises(ValueError, match="missing x_val"):
        load_embeddings(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", x_train=np.ones((4, 3)), x_val=np.ones((2, 3)))
    with pytest.raises(ValueError, match="missing y_train"):
        load_embeddings(tmp_path / "b.npz")
    assert load_embeddings(tmp_path / "b.npz", need_labels=False).y["train"] is None
    np.savez(tmp_path / "c.npz", x_train=np.ones((4, 3)), y_train=np.zeros(3),
             x_val=np.ones((2, 3)), y_val=np.zeros(2))
    with pytest.raises(ValueError, match=r"y_train must be \[4\]"):
        load_embeddings(tmp_path / "c.npz")
    with pytest.raises(ValueError, match=r"\.npz or \.pt"):
        load_embeddings(tmp_path / "d.csv")


def test_synthetic_data_is_seeded_balanced_and_sized():
    head = PAPER_HEADS["A2"]
    a = synthetic(head, {"train": 400, "val": 100, "test": 100}, seed=1)
    b = synthetic(head, {"train": 400, "val": 100, "test": 100}, seed=1)
    c = synthetic(head, {"train": 400, "val": 100, "test": 100}, seed=2)
    assert torch.equal(a.x["train"], b.x["train"]) and not torch.equal(a.x["train"], c.x["train"])
    assert a.x["train"].shape == (400, 768) and a.y["val"].shape == (100,)
    counts = torch.bincount(a.y["train"], minlength=4)
    assert counts.min() > 0.6 * 100  # balanced to within a few percent of 100 each
    fewshot = synthetic(PAPER_HEADS["C1"], {"per_class": 15}, seed=0)
    assert not set(fewshot.classes["train"]) & set(fewshot.classes["val"])


def test_digits_splits():
    a2 = digits(PAPER_HEADS["A2"])
    assert a2.x["train"].shape[1] == 768 and set(a2.y["train"].tolist()) == {0, 1, 2, 3}
    c1 = digits(PAPER_HEADS["C1"])
    assert set(c1.y["train"].tolist()) == {0, 1, 2, 3, 4}
    assert set(c1.y["val"].tolist()) == {5, 6, 7, 8, 9}
    b1 = digits(PAPER_HEADS["B1"])
    assert b1.y["train"] is None and sum(len(v) for v in b1.x.values()) == 1797


def test_early_stopping_rules():
    stop = EarlyStopping(patience=2, min_delta=0.1)
    assert [stop.step(s) for s in (1.0, 1.05, 1.2, 1.25, 1.29)] == [False, False, False, False,
                                                                      True]
    loss = EarlyStopping(patience=1, min_delta=0.01, higher_is_better=False)
    assert [loss.step(s) for s in (1.0, 0.5, 0.495)] == [False, False, True]


def test_info_nce_and_views():
    z = torch.nn.functional.one_hot(torch.arange(8), 8).float()
    t = INFO_NCE_TEMPERATURE
    assert info_nce(z, z, t) < 1e-3 < info_nce(z, z.roll(1, 0), t)
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(6, 3))
    a, b = two_views(model.train(), torch.randn(5, 6))
    assert a.shape == b.shape == (5, 3) and not torch.equal(a, b)


def test_few_shot_episodes():
    x = torch.randn(60, 4)
    y = torch.arange(6).repeat_interleave(10)
    task = FewShot(x, y, x, y, way=5, shot=3, query=4, episodes=2, val_episodes=3)
    support, query = next(task.batches(torch.Generator().manual_seed(0)))
    assert support.shape == (5, 3) and query.shape == (5, 4)
    assert not set(support.flatten().tolist()) & set(query.flatten().tolist())
    assert len({int(y[row[0]]) for row in support}) == 5  # five distinct classes
    with pytest.raises(ValueError, match="5-way episodes need 5"):
        FewShot(x[:40], y[:40], x, y, way=5, shot=3, query=4, episodes=1, val_episodes=1)


def test_bad_data_dimensions_are_refused(tmp_path):
    head = TINY[0]
    wrong = EmbeddingSplits({s: torch.randn(8, 5) for s in ("train", "val")},
                            {s: torch.zeros(8, dtype=torch.long) for s in ("train", "val")},
                            "wrong", "wrong dims")
    save_embeddings(tmp_path / "w.pt", wrong)
    preset = dataclasses.replace(TINY_PRESET, heads=(head,), seeds=(0,))
    with pytest.raises(ValueError, match="embeddings have 5 dims, the head takes 24"):
        run_config(preset, tmp_path / "o", data_files={"A1": tmp_path / "w.pt"}, progress=False)


def test_automatic_switch_counts_its_monitoring():
    head = TINY[0]
    protocol = dataclasses.replace(TINY_PRESET.protocol, switches=("auto",), max_epochs=6)
    records = run_head(head, synthetic(head, TINY_PRESET.sizes["A"]), 0, protocol)
    assert not any(r["model"] == "GLAI" for r in records)
    glai = next(r for r in records if r["model"] == "GLAI auto")
    assert 1 <= glai["reduced_epochs"] <= 6 and glai["switch"] == "auto"
    assert len(glai["m_history"]) == glai["reduced_epochs"]
    assert glai["t_monitor"] > 0 and glai["wall_reduced"] >= glai["t_monitor"]


def test_cap_hits_are_counted(tiny_run):
    import pandas as pd

    records, out = tiny_run
    table = pd.read_csv(out / "table3.csv")
    for row in table.itertuples():
        runs = [r for r in records if r["data"] == row.data and r["head"] == row.exp
                and r["model"] == row.head]
        hits = sum(bool(r["capped"]) for r in runs)
        assert row.capped == f"{hits}/{len(runs)}"
    # the tiny caps (3-4 epochs) are below what early stopping needs somewhere: counted
    assert any(r["capped"] for r in records)
    for r in records:  # a capped run ran every epoch of its cap
        cap = {"A": 4, "B": 3, "C": 4}[r["family"]]
        if r["capped"] and r["model"] in ("MLP", "MLP reduced", "Linear"):
            assert r["epochs"] == cap


def test_phases_add_up_to_glai_time(tiny_run):
    records, _ = tiny_run
    mlp = {(r["data"], r["head"], r["seed"]): r for r in records if r["model"] == "MLP"}
    for r in records:
        if r["model"].startswith("GLAI"):
            phases = r["t_reduced"] + r["t_convert"] + r["t_estimator"]
            assert abs(phases - r["time"]) <= 0.01 * r["time"]
            wall = r["wall_reduced"] + r["wall_convert"] + r["wall_estimator"]
            assert abs(wall - r["seconds"]) <= 0.01 * r["seconds"]
            assert r["t_estimator"] == pytest.approx(r["estimator_epochs"] * r["epoch_cost"])
            assert r["convert_share"] == pytest.approx(r["t_convert"] / r["time"])
            base = mlp[(r["data"], r["head"], r["seed"])]
            assert r["cost_ratio"] == pytest.approx(r["epoch_cost"] / base["epoch_cost"])
        else:
            assert r["time"] == pytest.approx(r["epochs"] * r["epoch_cost"])
            assert r["time_wall"] == pytest.approx(r["epochs"] * r["epoch_cost_wall"])
            assert r["time_cpu"] == pytest.approx(r["epochs"] * r["epoch_cost_cpu"])
        # on a CPU device the headline clock is process CPU time (glai/protocol.py)
        assert r["clock"] == "cpu" and r["time"] == pytest.approx(r["time_cpu"])


def test_costs_come_from_interleaved_repeats(tiny_run):
    import statistics

    records, _ = tiny_run
    repeats = TINY_PRESET.protocol.timing_repeats
    assert repeats >= 2
    for r in records:
        samples = r["cost_samples"]
        assert len(samples) == repeats and min(samples) > 0
        assert r["epoch_cost"] == min(samples) == r["epoch_cost_low"]
        assert r["epoch_cost_median"] == pytest.approx(statistics.median(samples))
        assert r["epoch_cost_high"] == max(samples)


def test_both_switches_are_reported_with_their_wilcoxon_rows(tiny_run):
    import pandas as pd

    records, out = tiny_run
    assert {r["switch"] for r in records if r["model"] == "GLAI auto"} == {"auto"}
    assert {r["switch"] for r in records if r["model"] == "GLAI"} == {"fixed"}
    tests = pd.read_csv(out / "wilcoxon.csv")
    for data in ("synthetic", "digits"):
        sub = tests[tests.data == data].set_index("comparison")
        assert sub.loc["GLAI vs. MLP", "switch"] == "fixed"
        assert sub.loc["GLAI auto vs. MLP", "switch"] == "auto"
        assert {"GLAI auto vs. Linear", "GLAI auto vs. MLP reduced"} <= set(sub.index)
    readme = (out / "README.md").read_text()
    assert "GLAI auto (m_t switch)" in readme and "(m_t switch)" in readme
    assert "Wilcoxon GLAI vs. MLP on synthetic" in readme
    assert "Wilcoxon GLAI auto vs. MLP on synthetic" in readme
    assert "Which time is the headline" in readme


def test_compare_tool_checks_two_runs(tiny_run, tmp_path, capsys):
    from bench.pipeline.compare import compare, components, main

    _, out = tiny_run
    results = out / "results.json"
    assert main([str(results), str(results)]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "components" in printed
    parts = components(results, results)
    assert (parts["cost_ratio diff"] == 0).all() and (parts["convert A"] > 0).all()
    saved = json.loads(results.read_text())
    for r in saved["records"]:  # GLAI 30% slower in the second run: disagrees
        if r["model"] == "GLAI":
            r["time"] *= 1.3
    other = tmp_path / "results.json"
    other.write_text(json.dumps(saved))
    table = compare(results, other)
    assert not table.agrees.all() and table["same epochs"].all()
    assert main([str(results), str(other)]) == 1
    # a run's folder reads as its results.json; a path that is none ends in a line naming it
    assert main([str(out), str(results)]) == 0
    capsys.readouterr()
    assert main([str(results), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "not a pipeline run's results.json" in err
    (tmp_path / "junk.json").write_text("{}")
    assert main([str(tmp_path / "junk.json"), str(results)]) == 2
    assert "junk.json" in capsys.readouterr().err


def test_unstructured_glai_trains_on_the_sparse_layout():
    head = TINY[0]
    protocol = dataclasses.replace(TINY_PRESET.protocol, switches=("fixed",), layout="sparse",
                                   timing_repeats=1)
    records = {r["model"]: r for r in run_head(head, synthetic(head, TINY_PRESET.sizes["A"]),
                                               0, protocol)}
    glai, structured = records["GLAI"], records["GLAI structured"]
    assert glai["layout"] == "sparse" and structured["layout"] == "dense"
    assert glai["params"] == glai["params_original"]  # the K kept values are the parameters
    assert glai["backend"] and glai["epoch_cost"] > 0


def test_breakdown_sums_the_training_runs(tiny_run, capsys):
    from bench.pipeline.breakdown import breakdown, main

    records, out = tiny_run
    per_model, per_seed, totals = breakdown(out / "results.json")
    wall = sum(r["seconds"] for r in records)
    assert per_model.wall.sum() == pytest.approx(wall)
    assert per_seed.wall.sum() == pytest.approx(wall)
    assert totals["rest wall"] == pytest.approx(totals["run wall"] - wall)
    glai = per_model.xs("GLAI", level="model")
    assert (glai.reduced + glai.convert + glai.estimator).to_numpy() == pytest.approx(
        glai.wall.to_numpy())
    assert main([str(out / "results.json")]) == 0 and "per head" in capsys.readouterr().out


def test_parallel_units_give_the_serial_records(tiny_run, tmp_path):
    # each (head, data, seed) unit in its own process: the records are the serial run's
    # (training is deterministic per seed); only clocks may differ
    preset = dataclasses.replace(TINY_PRESET, heads=TINY[:2], seeds=(1,), sources={})
    parallel = run_config(preset, tmp_path / "out", progress=False, jobs=2)
    serial, _ = tiny_run
    fields = ("data", "head", "seed", "model", "epochs", "bvs", "capped", "params")

    def key(records):
        return sorted(tuple(r.get(f) for f in fields) for r in records
                      if r["seed"] == 1 and r["head"] in {h.name for h in TINY[:2]}
                      and r["data"] == "synthetic")

    assert key(parallel) and key(parallel) == key(serial)
    meta = json.loads((tmp_path / "out" / "results.json").read_text())["meta"]
    assert meta["jobs"] == 2 and meta["cpu_seconds"] > 0
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run_config(preset, tmp_path / "bad", progress=False, jobs=0)


def test_sparse_estimators_train_by_the_fused_step(tiny_run):
    records, _ = tiny_run
    glai = [r for r in records if r["model"] in ("GLAI", "GLAI auto", "GLAI structured")]
    assert glai
    for r in glai:  # Adam over a sparse head's kept values: fused; a dense head: ordinary
        assert r["fused_step"] == (r["layout"] == "sparse"), r
