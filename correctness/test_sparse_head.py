"""A pruned GLAIHead in the sparse layout trains only what exists: its parameters are the K
kept values (plus the bias), it computes what the dense layout computes, trains the same,
saves and loads, and `prune` chooses the layout by the crossover or as the user forces."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from glai_models import random_mlp
from torch.utils._python_dispatch import TorchDispatchMode

from glai_kernels import registry
from glai_kernels.glai import count_parameters, from_mlp, path_scores, prune
from glai_kernels.glai.prune import SPARSE_CROSSOVER, kept_scores, to_layout
from glai_kernels.sparse import SPARSE_ESTIMATOR


@pytest.fixture(autouse=True)
def _no_backend_request(monkeypatch):
    """These tests are about the layout: a $GLAI_BACKEND run restricting the backends (which
    may name a dense-only one, so layout="sparse" refuses it) must not change them."""
    monkeypatch.delenv(registry.ENV_VAR, raising=False)


def pair(widths=(9, 13, 4), mu=0.1, seed=0, dtype=torch.float64):
    """(reference inputs, the same pruning in the dense and the sparse layout)."""
    head = from_mlp(random_mlp(widths, seed=seed, dtype=dtype))
    omega = torch.randn(64, widths[0], dtype=dtype, generator=torch.Generator().manual_seed(1))
    dense = prune(head, omega, mu=mu, layout="dense")
    sparse = prune(head, omega, mu=mu, layout="sparse")
    return omega, dense, sparse


@pytest.mark.parametrize("widths", [(9, 13, 4), (6, 5, 4, 3)], ids=["L1", "L2"])
def test_sparse_head_holds_only_the_kept_values(widths):
    _, dense, sparse = pair(widths)
    head = sparse.head
    assert sparse.layout == head.layout == "sparse" and dense.head.layout == "dense"
    assert dict(head.named_parameters()).keys() == {"sparse_weight.values", "bias"}
    assert sum(p.numel() for p in head.parameters()) == head.num_parameters()
    assert count_parameters(head) == head.num_parameters() == dense.head.num_parameters()
    assert sparse.kept == dense.kept and sparse.dropped_score == pytest.approx(
        dense.dropped_score)
    # the dense view reads the same weight and mask as the dense layout's
    assert torch.equal(head.weight, dense.head.weight.detach())
    assert torch.equal(head.weight_mask, dense.head.weight_mask)
    assert "layout=sparse" in repr(head)


def test_same_function_and_same_training():
    omega, dense, sparse = pair(mu=0.2)
    d, s = dense.head, sparse.head
    torch.testing.assert_close(s(omega), d(omega), rtol=1e-12, atol=1e-12)
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                 lambda p: torch.optim.Adam(p, lr=1e-2),
                 lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)):
        opt_d, opt_s = make(d.parameters()), make(s.parameters())
        for step in range(3):
            x = omega[16 * step:16 * step + 16]
            for head, opt in ((d, opt_d), (s, opt_s)):
                opt.zero_grad()
                head(x).square().mean().backward()
                opt.step()
        torch.testing.assert_close(s.sparse_weight.values,
                                   d.weight.detach()[s.sparse_weight.entries()],
                                   rtol=1e-10, atol=1e-12)
        assert bool((d.weight.detach()[~d.weight_mask] == 0).all())
        torch.testing.assert_close(s.bias, d.bias, rtol=1e-10, atol=1e-12)
    assert s.backend_used == f"sparse:{SPARSE_ESTIMATOR.pick_auto('cpu', torch.float64).name}"
    assert d.backend_used == registry.pick_auto("cpu", torch.float64).name


def test_state_dict_round_trip_and_to():
    omega, _, sparse = pair()
    head = sparse.head
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    buffer.seek(0)
    fresh = pair(seed=0)[2].head
    with torch.no_grad():
        fresh.sparse_weight.values.zero_()
    fresh.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(fresh(omega), head(omega), rtol=0, atol=0)
    single = head.to(torch.float32)
    assert single.sparse_weight.values.dtype == torch.float32
    assert single.sparse_weight.inputs.dtype == torch.int32
    single(omega.float())


def test_auto_layout_follows_the_crossover(monkeypatch):
    head = from_mlp(random_mlp((9, 13, 4), seed=2))
    omega = torch.randn(32, 9, dtype=torch.float64)
    crossover = SPARSE_CROSSOVER["cpu"]
    assert prune(head, omega, mu=crossover / 4).layout == "sparse"
    assert prune(head, omega, mu=min(1.0, crossover * 3)).layout == "dense"
    monkeypatch.setitem(SPARSE_CROSSOVER, "cpu", 0.0)
    assert prune(head, omega, mu=0.05).layout == "dense"
    monkeypatch.setitem(SPARSE_CROSSOVER, "cpu", 1.0)
    assert prune(head, omega, mu=0.9).layout == "sparse"
    assert prune(head, omega, mu=0.9, layout="dense").layout == "dense"


def test_dense_only_backend_keeps_the_dense_layout(monkeypatch):
    head = from_mlp(random_mlp((9, 13, 4), seed=3))
    omega = torch.randn(32, 9, dtype=torch.float64)
    dense_only = next(n for n in registry.names() if n not in ("torch",))
    monkeypatch.setenv(registry.ENV_VAR, dense_only)
    assert prune(head, omega, mu=0.01).layout == "dense"  # auto respects the request
    with pytest.raises(ValueError, match=rf"GLAI_BACKEND='{dense_only}' names no sparse"):
        prune(head, omega, mu=0.01, layout="sparse")
    with pytest.raises(ValueError, match=r"layout must be one of auto, dense, sparse"):
        prune(head, omega, mu=0.01, layout="csr")


def test_pruning_a_sparse_head_is_bounded_and_dense_free():
    """Theorem 2 holds when a sparse head is pruned again, from its [K] scores alone."""
    omega, _, first = pair(mu=0.3)
    head = first.head
    scores = kept_scores(head, omega)
    assert torch.equal(path_scores(head, omega)[head.sparse_weight.entries()], scores)
    for structured in (False, True):
        again = prune(head, omega, keep=head.path_count() // 3, structured=structured,
                      layout="sparse")
        with torch.no_grad():
            error = float((head(omega) - again.head(omega)).abs().mean(0).sum())
        assert error <= again.dropped_score * (1 + 1e-12) + 1e-15
        assert again.kept <= head.path_count() // 3 and again.candidates == head.path_count()
        assert again.head.layout == "sparse"
    back = to_layout(head, "dense")
    torch.testing.assert_close(back(omega), head(omega), rtol=1e-12, atol=1e-12)
    assert to_layout(back, "sparse").path_count() == head.path_count()


class _BigFloats(TorchDispatchMode):
    """Counts the distinct new float storages (not `existing`'s, which views such as detach
    share) of at least `size` elements that ops create."""

    def __init__(self, size: int, existing: torch.Tensor) -> None:
        super().__init__()
        self.size, self.storages = size, set()
        self.existing = existing.untyped_storage().data_ptr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            big = isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() >= self.size
            if big and t.untyped_storage().data_ptr() != self.existing:
                self.storages.add(t.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("structured", [False, True], ids=["unstructured", "structured"])
def test_prune_to_sparse_makes_one_dense_score_tensor(structured):
    head = from_mlp(random_mlp((20, 30, 6), seed=4, dtype=torch.float32))
    omega = torch.randn(40, 20)
    size = head.weight.numel()
    with _BigFloats(size, head.weight) as seen:
        result = prune(head, omega, mu=0.05 if not structured else 0.2, structured=structured,
                       layout="sparse")
    assert result.head.layout == "sparse"
    assert len(seen.storages) == 1  # the score tensor; no dense copy of the weight


def test_compile_a_sparse_training_step():
    omega, _, sparse = pair(dtype=torch.float32)
    head = sparse.head

    def loss(x):
        return head(x).square().mean()

    expected = torch.autograd.grad(loss(omega), list(head.parameters()))
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(omega),
                              list(head.parameters()))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_copy_and_pickle_a_sparse_head():
    omega, _, sparse = pair()
    head = sparse.head
    buffer = io.BytesIO()
    torch.save(head, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(head), torch.load(buffer, weights_only=False)):
        assert other.layout == "sparse"
        torch.testing.assert_close(other(omega), head(omega), rtol=0, atol=0)
