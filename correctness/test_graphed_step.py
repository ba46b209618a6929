"""CUDA graphs for the training step (glai_kernels/glai/graphed_step.py), and the pricing of
every model's step with them (glai/timing.py's `graphs`, glai/protocol.py's graphed probes).

On the CPU the capture is the eager stand-in (`EagerStandIn`: "replay" runs the step on the
static buffers), so what is checked here is the wrapper's own logic: one set of static buffers
per batch shape, the copy-in, warm-up then capture then replay, a failed capture falling back,
and training through it equal to training without it, bit for bit, over several steps and a
partial last batch. The `_on_cuda` tests run the real capture; they skip without CUDA and run
unchanged with it (the lease script's `-k "cuda or triton"` selects them).
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from fused_step_setup import sparse_head

from glai_kernels.glai import graphed_step as gs
from glai_kernels.glai.mlp import make_mlp
from glai_kernels.glai.protocol import GRAPHED, apply_graphed, graphed_view
from glai_kernels.glai.tasks import Classification, Contrastive
from glai_kernels.glai.timing import Cost, training_probe
from glai_kernels.glai.training import make_optimizer, training_step

STEPS = 7  # two epochs of 3 full batches and a partial one, less one


def _classification(n0: int, classes: int, rows: int = 37, batch: int = 10,
                    device: str = "cpu") -> Classification:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(rows, n0, generator=gen)
    y = torch.randint(0, classes, (rows,), generator=gen)
    return Classification(x.to(device), y.to(device), x[:8].to(device), y[:8].to(device), batch)


def _batches(task, count: int) -> list:
    gen = torch.Generator().manual_seed(11)
    epochs = itertools.chain.from_iterable(task.batches(gen) for _ in range(count))
    return list(itertools.islice(epochs, count))


def _train(model, task, optimizer, batches, wrap=None) -> list[list[torch.Tensor]]:
    """The parameters after each step, training by the ordinary step (wrapped or not)."""
    step = training_step(model, task, optimizer, fused=False)
    if wrap is not None:
        step = wrap(step)
    out = []
    for batch in batches:
        step(batch)
        out.append([p.detach().clone() for p in model.parameters()])
    return out


MODELS = {
    "mlp-sgd": lambda: (make_mlp((6, 9, 4)), "sgd"),
    "glai-sparse-adam": lambda: (sparse_head(torch.float32).train(), "adam"),
}


@pytest.mark.parametrize("name", MODELS)
def test_training_through_the_stand_in_is_the_plain_training(name):
    torch.manual_seed(0)
    model, kind = MODELS[name]()
    n0 = 6 if name == "mlp-sgd" else model.in_features
    classes = 4 if name == "mlp-sgd" else model.out_features
    task = _classification(n0, classes)
    batches = _batches(task, STEPS)
    assert {len(b[0]) for b in batches} == {10, 7}  # a full and a partial batch shape
    twin = copy.deepcopy(model)
    plain = _train(model, task, make_optimizer(kind, model.parameters(), lr=1e-2,
                                               weight_decay=1e-3), batches)
    holder = {}

    def wrap(step):
        holder["g"] = gs.GraphedStep(step, torch.device("cpu"), gs.EagerStandIn(), warmup=2)
        return holder["g"]

    graphed = _train(twin, task, make_optimizer(kind, twin.parameters(), lr=1e-2,
                                                weight_decay=1e-3), batches, wrap)
    for a, b in zip(plain, graphed, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    wrapper = holder["g"]
    assert len(wrapper.entries) == 2
    # the full shape met 6 times: 2 warm-ups, then captured; the partial one once: a warm-up
    assert wrapper.captured == 1 and wrapper.fallback is None


def test_the_step_always_reads_the_same_static_buffers_holding_the_batch():
    seen = []

    def spy(batch):
        x, y = batch
        seen.append((x, y, x.clone(), y.clone()))

    wrapper = gs.GraphedStep(spy, torch.device("cpu"), gs.EagerStandIn(), warmup=1)
    batches = [(torch.randn(4, 3), torch.arange(4)) for _ in range(3)] + [
        (torch.randn(2, 3), torch.arange(2))]
    for b in batches:
        wrapper(b)
    full = seen[:3]
    assert all(s[0] is full[0][0] and s[1] is full[0][1] for s in full)  # static, reused
    assert all(s[0] is not b[0] for s, b in zip(seen, batches, strict=True))  # copies
    for (_, _, x, y), (bx, by) in zip(seen, batches, strict=True):
        assert torch.equal(x, bx) and torch.equal(y, by)  # each call saw its own batch
    assert seen[3][0] is not full[0][0] and seen[3][0].shape == (2, 3)  # its own buffers


class _FailingCapture(gs.EagerStandIn):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")


def test_a_failed_capture_falls_back_to_eager_steps_and_says_why():
    calls = []
    wrapper = gs.GraphedStep(lambda b: calls.append(b.clone()), torch.device("cpu"),
                             _FailingCapture(), warmup=1)
    for k in range(4):
        wrapper(torch.full((3,), float(k)))
    assert [float(c[0]) for c in calls] == [0.0, 1.0, 2.0, 3.0]  # one step per call, still
    assert wrapper.captured == 0
    assert wrapper.fallback == "RuntimeError: operation not permitted when stream is capturing"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="warmup"):
        gs.GraphedStep(lambda b: None, torch.device("cpu"), warmup=0)
    with pytest.raises(TypeError, match="batch"):
        gs.GraphedStep(lambda b: None, torch.device("cpu"))({"x": torch.zeros(1)})
    assert gs.strategy_for(torch.device("cpu")).name == "stand-in"


def test_prepare_optimizer_sets_capturable_on_cuda_only():
    p = torch.nn.Parameter(torch.zeros(3))
    adam, sgd = torch.optim.Adam([p]), torch.optim.SGD([p], lr=0.1)
    gs.prepare_optimizer(adam, torch.device("cpu"))
    assert adam.param_groups[0]["capturable"] is False
    gs.prepare_optimizer(adam, torch.device("cuda"))  # a device object needs no GPU
    gs.prepare_optimizer(sgd, torch.device("cuda"))
    assert adam.param_groups[0]["capturable"] is True and "capturable" not in sgd.param_groups[0]


def test_a_graphed_training_probe_warms_and_captures_before_its_clock():
    torch.manual_seed(1)
    model = make_mlp((6, 9, 4))
    task = _classification(6, 4, rows=64, batch=8)
    optimizer = make_optimizer("sgd", model.parameters(), lr=1e-2, weight_decay=0.0)
    probe = training_probe(model, task, optimizer, steps=3, seed=2, kind="ordinary",
                           graphs=True)
    assert probe.graphed.captured == 1  # the timed steps' one shape, captured already
    parts = probe()
    assert set(parts) == {"train", "validate", "epoch"} and parts["train"][0] > 0
    assert training_probe(model, task, optimizer, steps=3, seed=2).graphed is None


def _cost(seconds: float) -> dict[str, Cost]:
    return {"epoch": Cost.of([(seconds, seconds)]), "train": Cost.of([(seconds, seconds)])}


def test_graphed_costs_price_each_record_in_its_own_fields():
    costs = {"MLP": _cost(2.0), "Linear": _cost(1.0), f"MLP{GRAPHED}": _cost(0.5),
             f"Linear{GRAPHED}": _cost(0.25)}
    assert graphed_view({"MLP": _cost(2.0)}) == {}
    assert graphed_view(costs)["MLP"] is costs[f"MLP{GRAPHED}"]
    records = [{"model": "MLP", "epochs": 4}, {"model": "Linear", "epochs": 2}]
    apply_graphed(records, costs, "wall", {"MLP": "cuda-graph: 1 capture(s)"})
    assert records[0]["graphed"]["time"] == 4 * 0.5
    assert records[1]["graphed"]["time"] == 2 * 0.25
    assert records[0]["graphed"]["graphs"] == "cuda-graph: 1 capture(s)"
    assert "time" not in records[0]  # the paper protocol's own fields are apply_costs'


def test_the_pipeline_prices_every_model_with_graphs_when_asked(tmp_path):
    """The quick preset at A1 with `graphs` (on the CPU: the stand-in): every record priced a
    third way, and the report's graphed tables and README section."""
    from bench.pipeline.report import protocol_records
    from bench.pipeline.runner import run_preset

    records = run_preset("quick", tmp_path, heads=["A1"], seeds=1, device="cpu",
                         progress=False, jobs=1, graphs=True)
    for r in records:
        g = r["graphed"]
        assert g["graphs"] == "stand-in: 1 capture(s)"
        if r["model"].startswith("GLAI"):
            assert g["t_reduced"] + g["t_convert"] + g["t_estimator"] == pytest.approx(g["time"])
        else:
            assert g["time"] == pytest.approx(r["epochs"] * g["epoch_cost"])
    assert [r["epochs"] for r in protocol_records(records, "graphed")] == [
        r["epochs"] for r in records]
    assert "CUDA graphs" in (tmp_path / "table3_graphed.md").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert "## With CUDA graphs: GLAI vs the original MLP" in readme
    assert "stand-in: 1 capture(s)" in readme  # the per-model table says how each capture went
    # without the option (a CPU run's default) nothing is graphed
    plain = run_preset("quick", tmp_path / "plain", heads=["A1"], seeds=1, device="cpu",
                       progress=False, jobs=1)
    assert all("graphed" not in r for r in plain)


# ---- on a GPU -----------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("name", MODELS)
def test_training_through_cuda_graphs_follows_the_plain_training_on_cuda(name):
    torch.manual_seed(0)
    model, kind = MODELS[name]()
    model = model.cuda()
    n0 = 6 if name == "mlp-sgd" else model.in_features
    classes = 4 if name == "mlp-sgd" else model.out_features
    task = _classification(n0, classes, device="cuda")
    batches = _batches(task, STEPS)
    twin = copy.deepcopy(model)
    plain = _train(model, task, make_optimizer(kind, model.parameters(), lr=1e-2,
                                               weight_decay=1e-3), batches)
    optimizer = make_optimizer(kind, twin.parameters(), lr=1e-2, weight_decay=1e-3)
    gs.prepare_optimizer(optimizer, torch.device("cuda"))
    holder = {}

    def wrap(step):
        holder["g"] = gs.graphed(step, torch.device("cuda"), warmup=2)
        return holder["g"]

    graphed = _train(twin, task, optimizer, batches, wrap)
    assert holder["g"].fallback is None and holder["g"].captured == 1
    assert holder["g"].strategy.name == "cuda-graph"
    for a, b in zip(plain, graphed, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


@cuda
def test_contrastive_dropout_replays_fresh_random_numbers_on_cuda():
    """A captured dropout draws new masks at each replay (torch's graph-safe generator): the
    replayed steps move the weights differently from step to step."""
    torch.manual_seed(0)
    model = make_mlp((6, 9, 4), dropout=0.5).cuda()
    task = Contrastive(torch.randn(40, 6, device="cuda"), torch.randn(8, 6, device="cuda"), 8,
                       temperature=0.07)
    optimizer = make_optimizer("sgd", model.parameters(), lr=1e-2, weight_decay=0.0)
    step = gs.graphed(training_step(model, task, optimizer, fused=False), torch.device("cuda"),
                      warmup=1)
    batch = next(task.batches(torch.Generator().manual_seed(0)))
    moves = []
    for _ in range(4):
        before = model[0].weight.detach().clone()
        step(batch)
        moves.append(model[0].weight.detach() - before)
    assert step.captured == 1
    assert not torch.equal(moves[2], moves[3])


@cuda
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_the_fused_sparse_step_kernels_follow_the_ordinary_step_on_cuda(decoupled):
    """FusedSparseStep on a `cuda` sparse head: dvalues + Adam in one kernel, the bias's
    update in another (glai_ext::sparse_dvalues_adam_t, bias_adam_t), the step count read on
    the device; against autograd + torch.optim over the same steps."""
    from glai_kernels.glai.fused_step import FusedSparseStep

    head = sparse_head(torch.float32, backend="cuda").cuda()
    twin = copy.deepcopy(head)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    plain_opt = cls(head.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    fused_opt = cls(twin.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    stepper = FusedSparseStep(twin, fused_opt)
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        x = torch.randn(13, head.in_features, generator=gen).cuda()
        target = torch.randint(0, head.out_features, (13,), generator=gen).cuda()
        plain_opt.zero_grad(set_to_none=True)
        F.cross_entropy(head(x), target).backward()
        plain_opt.step()
        stepper.step(lambda model, x=x, t=target: F.cross_entropy(model(x), t))
    for a, b in zip(head.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
