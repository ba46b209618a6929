"""Robust per-epoch costs (glai_kernels/glai/timing.py), cap detection in `fit` and the
tasks' step counts."""

from __future__ import annotations

import pytest
import torch

from glai_kernels.glai.episodes import FewShot
from glai_kernels.glai.tasks import Classification, Contrastive
from glai_kernels.glai.timing import Cost, interleaved, training_probe
from glai_kernels.glai.training import EarlyStopping, fit, make_optimizer


def test_interleaved_rotates_the_order_and_takes_the_median():
    order = []
    walls = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 50.0, 6.0]), "c": iter([1.0] * 3)}

    def probe(name):
        def run():
            order.append(name)
            return {"part": (next(walls[name]), 0.5)}
        return run

    costs = interleaved({name: probe(name) for name in "abc"}, repeats=3)
    assert order == list("abc" "bca" "cab")  # every round, every probe, rotated
    a = costs["a"]["part"]
    assert a.seconds == 1.0 and a.median == 2.0 and a.samples == (3.0, 1.0, 2.0)
    # one loaded sample (50) moves the range and not the robust value (the least disturbed)
    assert costs["b"]["part"].seconds == 5.0 and costs["b"]["part"].high == 50.0
    assert costs["b"]["part"].cpu_seconds == 0.5
    assert costs["c"]["part"].spread == 0.0
    assert Cost.of([(1.0, 1.0), (3.0, 1.0)]).spread == pytest.approx(2.0)
    on_cpu = Cost.of([(9.0, 1.0), (4.0, 3.0), (5.0, 2.0)]).on("cpu")
    assert on_cpu.seconds == 1.0 and on_cpu.samples == (1.0, 3.0, 2.0) and on_cpu.median == 2.0
    with pytest.raises(ValueError, match="repeats"):
        interleaved({}, repeats=0)


def _classification(rows=40, batch=8):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, 5, generator=gen), torch.randint(0, 3, (rows,), generator=gen)
    return Classification(x, y, x[:16], y[:16], batch)


def test_training_probe_scales_its_steps_to_an_epoch():
    task = _classification(rows=40, batch=8)  # 5 steps per epoch
    model = torch.nn.Linear(5, 3)
    optimizer = make_optimizer("sgd", model.parameters(), lr=0.1, weight_decay=0.0)
    before = model.weight.detach().clone()
    probe = training_probe(model, task, optimizer, steps=2, seed=0)
    parts = probe()
    assert set(parts) == {"train", "validate", "epoch"}
    assert parts["epoch"][0] == pytest.approx(parts["train"][0] + parts["validate"][0])
    assert not torch.equal(model.weight, before)  # it trains (after the model's results)
    assert set(training_probe(model, task, optimizer, steps=99, seed=0,
                              validate=False)()) == {"train"}


def test_fit_counts_a_cap_hit_and_not_an_early_stop():
    task = _classification()
    model = torch.nn.Linear(5, 3)
    optimizer = make_optimizer("sgd", model.parameters(), lr=0.0, weight_decay=0.0)
    never = EarlyStopping(patience=100, min_delta=0.0)
    capped = fit(model, task, optimizer, max_epochs=3, early=never, seed=0)
    assert capped.epochs == 3 and capped.capped
    # lr 0: the score never improves, so patience 1 stops after epoch 2 of 5
    stopped = fit(model, task, optimizer, max_epochs=5, early=EarlyStopping(1, 0.0), seed=0)
    assert stopped.epochs == 2 and not stopped.capped
    # stopping on the very last allowed epoch is early stopping, not the cap
    exact = fit(model, task, optimizer, max_epochs=2, early=EarlyStopping(1, 0.0), seed=0)
    assert exact.epochs == 2 and not exact.capped


def test_steps_per_epoch_match_the_batches():
    gen = torch.Generator().manual_seed(1)
    for task in (_classification(rows=41, batch=8),
                 Contrastive(torch.randn(33, 4), torch.randn(8, 4), 8, temperature=0.1),
                 Contrastive(torch.randn(34, 4), torch.randn(8, 4), 8, temperature=0.1),
                 FewShot(torch.randn(60, 4), torch.arange(6).repeat_interleave(10),
                         torch.randn(60, 4), torch.arange(6).repeat_interleave(10), way=5,
                         shot=2, query=3, episodes=7, val_episodes=2)):
        assert task.steps_per_epoch() == sum(1 for _ in task.batches(gen))
