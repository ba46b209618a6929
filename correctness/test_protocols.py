"""The pipeline's two protocols (glai/protocol.py; docs/ARCHITECTURE.md §4): the engineered
steps compute the ordinary steps' updates (so both protocols share one training run per model
and differ only in the cost per epoch), and the reports carry both."""

from __future__ import annotations

import copy

import pytest
import torch
from glai_models import random_mlp

from glai_kernels.glai import from_mlp, make_optimizer, prune
from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.mlp import make_mlp
from glai_kernels.glai.mlp_step import HandFusedMLPStep, compiled_mlp_step
from glai_kernels.glai.tasks import Classification, Contrastive
from glai_kernels.glai.training import EarlyStopping, fit, training_step

STEPS = 4


def _tasks() -> dict:
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 12, generator=gen), torch.randint(0, 5, (40,), generator=gen)
    return {"classification": Classification(x, y, x[:8], y[:8], batch_size=10),
            "contrastive": Contrastive(x, x[:8], batch_size=10, temperature=0.07),
            "few-shot": FewShot(x, y, x, y, way=3, shot=2, query=2, episodes=STEPS,
                                val_episodes=2, seed=0)}


def _models(dropout: float) -> dict:
    torch.manual_seed(3)
    linear = torch.nn.Sequential(*([torch.nn.Dropout(dropout)] if dropout else []),
                                 torch.nn.Linear(12, 5))
    return {"mlp": make_mlp((12, 16, 5), dropout=dropout),
            "two hidden": make_mlp((12, 16, 8, 5), dropout=dropout), "linear": linear}


def _train(model, task, make_step) -> torch.nn.Module:
    """STEPS steps of SGD (fused, weight decay) by make_step(model, optimizer), same seeds."""
    optimizer = make_optimizer("sgd", model.parameters(), lr=0.1, weight_decay=1e-2)
    step = make_step(model, optimizer)
    torch.manual_seed(11)  # dropout's random numbers
    for batch in list(task.batches(torch.Generator().manual_seed(2)))[:STEPS]:
        step(batch)
    return model


def _same(a: torch.nn.Module, b: torch.nn.Module, exact: bool) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        if exact:
            assert torch.equal(p, q), name
        else:  # the weight gradient's product in another order: rounding only
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("task_name", ["classification", "contrastive", "few-shot"])
def test_the_hand_fused_mlp_step_is_the_ordinary_step(task_name, dropout):
    task = _tasks()[task_name]
    for name, model in _models(dropout).items():
        twin = copy.deepcopy(model)
        ordinary = _train(model, task, lambda m, o: training_step(m, task, o, fused=False))

        def hand(m, o):
            stepper = HandFusedMLPStep(m, o)
            return lambda batch: stepper.step(lambda stand_in: task.loss(stand_in, batch))
        _same(ordinary, _train(twin, task, hand), exact=False)
        assert all(p.grad is None for p in twin.parameters()), name


def test_the_hand_fused_step_takes_any_optimizer_and_refuses_other_models():
    task = _tasks()["classification"]
    model = make_mlp((12, 16, 5))
    twin = copy.deepcopy(model)
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = next(iter(task.batches(torch.Generator().manual_seed(0))))
    task.loss(model, batch).backward()
    adam.step()
    stepper = HandFusedMLPStep(twin, torch.optim.Adam(twin.parameters(), lr=1e-2))
    stepper.step(lambda stand_in: task.loss(stand_in, batch))
    _same(model, twin, exact=False)
    with pytest.raises(ValueError, match="model must be"):
        HandFusedMLPStep(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh()), adam)
    with pytest.raises(ValueError, match="optimizer must step exactly"):
        HandFusedMLPStep(make_mlp((3, 4, 2)), adam)


def test_the_compiled_mlp_step_is_the_ordinary_step():
    pytest.importorskip("torch._inductor")
    task = _tasks()["contrastive"]  # dropout's random numbers too
    model = make_mlp((12, 16, 5), dropout=0.3)
    twin = copy.deepcopy(model)
    ordinary = _train(model, task, lambda m, o: training_step(m, task, o, fused=False))
    try:
        compiled = _train(twin, task, lambda m, o: compiled_mlp_step(m, task.loss, o))
    except Exception as error:  # no C++ compiler for inductor here
        if "compil" in str(error).lower():
            pytest.skip(f"torch.compile unavailable: {error}")
        raise
    _same(ordinary, compiled, exact=False)


def test_the_fused_sparse_step_trains_as_the_ordinary_loop():
    # the pipeline trains a sparse estimator once (fused step, Adam inside the cpp kernel)
    # and prices its epochs in both protocols: the same epochs and values to rounding
    mlp = random_mlp((11, 14, 5), seed=3, dtype=torch.float32)
    omega = torch.randn(64, 11, generator=torch.Generator().manual_seed(1))
    head = prune(from_mlp(mlp), omega, mu=0.3, layout="sparse").head.train()
    twin = copy.deepcopy(head)
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(48, 11, generator=gen), torch.randint(0, 5, (48,), generator=gen)
    task = Classification(x, y, x[:16], y[:16], batch_size=16)
    results = []
    for model, fused in ((head, True), (twin, False)):
        optimizer = make_optimizer("adam", model.parameters(), lr=1e-2, weight_decay=0.1)
        results.append(fit(model, task, optimizer, max_epochs=3, early=EarlyStopping(2, 0.1),
                           seed=0, fused_step=fused))
    assert results[0].fused_step and not results[1].fused_step
    assert results[0].epochs == results[1].epochs and results[0].scores == results[1].scores
    _same(head, twin, exact=False)



@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    from bench.pipeline.runner import run_preset

    out = tmp_path_factory.mktemp("quick")
    return run_preset("quick", out, heads=["A1", "B1"], seeds=1, device="cpu",
                      progress=False, jobs=1), out


def test_the_quick_preset_writes_both_protocols(quick_run):
    import pandas as pd

    _, out = quick_run
    for name in ("table3", "wilcoxon"):
        for suffix in ("", "_engineered"):
            table = pd.read_csv(out / f"{name}{suffix}.csv")
            assert set(table["exp" if name == "table3" else "comparison"]) and len(table) > 0
    assert (out / "figure5_engineered.png").read_bytes()[:4] == b"\x89PNG"
    readme = (out / "README.md").read_text()
    paper = readme.index("## Headline (paper protocol)")
    engineered = readme.index("## Engineered protocol")
    assert paper < engineered  # the headline first
    assert "**Paper protocol (the headline)**" in readme
    assert "**Engineered protocol**" in readme
    assert "Which engineered step each MLP took" in readme
    assert "## Table 3 analogue, engineered protocol" in readme
    assert "## Wilcoxon tests, paper protocol (the headline)" in readme
    assert "Paper protocol (the headline)" in (out / "table3.md").read_text()
    assert "Engineered protocol" in (out / "table3_engineered.md").read_text()


def test_each_record_is_priced_by_both_protocols(quick_run):
    from bench.pipeline.report import protocol_records

    records, _ = quick_run
    for r in records:
        e = r["engineered"]
        # the same epochs, each protocol's own cost per epoch
        assert r["time"] == pytest.approx(r["epochs"] * r["epoch_cost"]) or r[
            "model"].startswith("GLAI")
        assert set(e["step_costs"]) and e["step"] == min(e["step_costs"],
                                                         key=e["step_costs"].get)
        if r["model"].startswith("GLAI"):
            assert e["step"] == ("fused" if r["layout"] == "sparse" else "ordinary")
            assert e["t_reduced"] + e["t_convert"] + e["t_estimator"] == pytest.approx(
                e["time"])
            assert e["t_estimator"] == pytest.approx(r["estimator_epochs"] * e["epoch_cost"])
        else:
            assert set(e["step_costs"]) == {"hand-fused"}  # quick: no torch.compile
            assert e["time"] == pytest.approx(r["epochs"] * e["epoch_cost"])
        assert r["trained_by"] == ("fused" if r.get("fused_step") else "ordinary")
    engineered = protocol_records(records, "engineered")
    assert [r["epochs"] for r in engineered] == [r["epochs"] for r in records]
    assert protocol_records([{"model": "MLP"}], "engineered") == []
    with pytest.raises(ValueError, match="protocol must be"):
        protocol_records(records, "other")


def test_compare_reads_either_protocol(quick_run, capsys):
    from bench.pipeline.compare import compare, main

    _, out = quick_run
    results = out / "results.json"
    paper, engineered = compare(results, results), compare(results, results,
                                                           protocol="engineered")
    assert paper.agrees.all() and engineered.agrees.all()
    # the same training runs, each protocol's own prices
    assert (paper["epochs A"] == engineered["epochs A"]).all()
    assert not (paper["speedup A"] == engineered["speedup A"]).all()
    assert main([str(results), str(results), "--protocol", "engineered"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_the_step_study_times_both_protocols_steps_and_the_pieces():
    from bench.studies.sparse_train_step import _cells, _pieces_line, head_steps, ordinary_pieces

    steps, what = head_steps("A1", compiled=False)
    assert {"MLP", "GLAI", "GLAI fused", "MLP hand-fused"} <= set(steps) and "K = " in what
    for step in steps.values():
        step()
    line = _cells("cpu", {name: 1e-3 for name in steps})
    assert "paper ratio 1.00x" in line and "engineered ratio (fused / hand-fused) 1.00x" in line
    pieces = ordinary_pieces("A1")
    for piece in pieces.values():
        piece()
    seconds = dict.fromkeys(pieces, 1e-5) | {"step": 4e-5}
    assert "Adam's Python wrapper 0.0 (0%)" in _pieces_line("A1", seconds)


def test_the_paper_protocol_runs_a_glai_selector_on_torchs_gemm(monkeypatch):
    """The paper protocol prices GLAI's ordinary step with its selector's frozen layer on
    torch's GEMM, as the MLPs' layers run there; the engineered probes keep the model itself
    (the extension's GEMM). The copy's results match the head's to rounding."""
    from glai_kernels.glai import protocol as protocol_module
    from glai_kernels.glai.selector import PathSelector
    from glai_kernels.glai.training import on_torch_gemm
    from glai_kernels.paper_heads import PAPER_HEADS

    def gemms(model):
        return [m.gemm for m in model.modules() if isinstance(m, PathSelector)]

    torch.manual_seed(3)
    mlp = make_mlp((13, 24, 5))
    head = prune(from_mlp(make_mlp((13, 12, 5))), torch.randn(64, 13), keep=200,
                 layout="sparse").head
    paper = on_torch_gemm(head)
    assert paper is not head and on_torch_gemm(mlp) is mlp
    assert gemms(paper) == ["torch"] and gemms(head) == ["auto"]
    assert all(p.data_ptr() != q.data_ptr()
               for p, q in zip(paper.parameters(), head.parameters(), strict=True))
    x = torch.randn(9, 13)
    torch.testing.assert_close(paper(x), head(x))

    seen: list[tuple[str, torch.nn.Module]] = []

    def spy(model, task, optimizer, **kwargs):
        seen.append((kwargs.get("kind"), model))
        return lambda: {}

    monkeypatch.setattr(protocol_module, "training_probe", spy)
    monkeypatch.setattr(protocol_module, "interleaved", lambda probes, repeats: probes)
    glai = protocol_module.GLAIRun(records=[], reference=torch.randn(4, 13),
                                   estimators={"GLAI": head})
    rules = protocol_module.Protocol(engineered=True, compile_mlp=False,
                                     switches=("fixed",))
    protocol_module.measure_costs(PAPER_HEADS["A1"], None, rules, 0, {"MLP": mlp}, glai,
                                  torch.device("cpu"))
    kinds = [(kind, gemms(model)) for kind, model in seen]
    assert kinds == [("ordinary", []), ("hand-fused", []), ("ordinary", ["torch"]),
                     ("fused", ["auto"])]
    assert seen[1][1] is mlp and seen[3][1] is head
