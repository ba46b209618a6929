"""The peers (bench/harness/peers.py): each gives the float64 oracle's answer under the one verdict,
never becomes a backend or a winner, and the best-peer ratio in the table and the summary is
computed right."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from bench.harness import peers, results
from bench.harness.ceilings import Ceilings
from bench.harness.passes import PASSES, Tensors
from bench.reporting import summary
from glai_kernels import registry
from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs
from reference.verdict import judge

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

CPU = torch.device("cpu")


def _tensors(dtype: torch.dtype, seed: int = 0) -> Tensors:
    x, act, weight, _ = make_inputs(5, 7, 3, 4, dtype=dtype, seed=seed, bias=False)
    dy = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return Tensors(x, act, weight, dy)


def _check(name: str, pass_: str, t: Tensors) -> None:
    """Every output of one call of `pass_` on peer `name` passes the oracle's verdict."""
    out = peers.make_call(name, PASSES[pass_], [t])()
    assert set(out) == set(PASSES[pass_].outputs)
    expected = {"y": (forward64(t.x, t.act, t.weight), abs_forward64(t.x, t.act, t.weight))}
    g, scale = grads64(t.dy, t.x, t.act, t.weight), abs_grads64(t.dy, t.x, t.act, t.weight)
    expected |= {f"d{k}": (getattr(g, k), getattr(scale, k)) for k in ("x", "act", "weight")}
    for key, value in out.items():
        verdict = judge(value, *expected[key], t.x.dtype)
        assert verdict.ok, f"{name} {pass_} {key}: {verdict}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("pass_", list(PASSES))
def test_einsum_peer_matches_the_oracle(pass_, dtype):
    if peers.PEERS["peer:einsum"].availability("cpu") is not None:
        pytest.skip("opt_einsum is not installed")
    _check("peer:einsum", pass_, _tensors(dtype))


@pytest.mark.parametrize("pass_", ["forward", "both"])
def test_max_autotune_peer_matches_the_oracle(pass_):
    if peers.PEERS["peer:max-autotune"].availability("cpu") is not None:
        pytest.skip("no compiler for torch.compile")
    _check("peer:max-autotune", pass_, _tensors(torch.float32))


def test_peers_are_not_backends():
    for name in peers.PEERS:
        with pytest.raises(ValueError):
            registry.get(name)
    assert peers.is_peer_or_backend_peer("torch") and not peers.is_peer("torch")
    assert peers.get("einsum").name == "peer:einsum"
    with pytest.raises(ValueError, match="unknown peer"):
        peers.get("nonsense")


def test_for_sweeps_keeps_max_autotune_to_the_heads_sweep():
    names = list(peers.PEERS)
    assert peers.for_sweeps(names, ["batch@A1"]) == ["peer:einsum"]
    assert peers.for_sweeps(names, ["heads", "batch@A1"]) == names


def _row(backend: str, median_ms: float, batch: int = 16, status: str = "ok",
         correct: bool = True) -> dict:
    return {"sweep": "heads", "head": "A1", "backend": backend, "batch": batch, "inputs": 384,
            "paths": 256, "outputs": 37, "dtype": "float32", "pass": "both", "device": "cpu",
            "mu": None, "status": status, "correct": correct, "median_s": median_ms / 1e3,
            "min_s": median_ms / 1e3, "iqr_s": 0.0}


def _table(rows: list[dict]) -> pd.DataFrame:
    return results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})


def test_best_peer_ratio_on_a_synthetic_table():
    df = _table([_row("einsum", 10.0), _row("torch", 4.0), _row("cpp", 1.0),
                 _row("peer:einsum", 2.0), _row("peer:max-autotune", 3.0),
                 # a wrong peer is never the best, however fast
                 _row("einsum", 8.0, batch=32), _row("cpp", 2.0, batch=32),
                 _row("torch", 6.0, batch=32), _row("peer:einsum", 0.5, batch=32,
                                                    status="wrong", correct=False)])
    keys = zip(df["backend"], df["batch"], strict=True)
    ratio = dict(zip(keys, df[results.PEER_COLUMN], strict=True))
    assert ratio[("cpp", 16)] == pytest.approx(2.0)  # best peer: peer:einsum, 2 ms
    assert ratio[("torch", 16)] == pytest.approx(0.5)
    assert ratio[("peer:einsum", 16)] == pytest.approx(1.0)
    assert ratio[("cpp", 32)] == pytest.approx(3.0)  # best correct peer: torch, 6 ms
    winners = df[df["winner"] == True]  # noqa: E712
    # a peer never wins, even when it is the fastest correct measurement
    assert set(winners["backend"]) == {"cpp"}


def test_no_peer_measured_gives_no_ratio():
    df = _table([_row("einsum", 10.0), _row("cpp", 1.0)])
    assert df[results.PEER_COLUMN].isna().all()


def test_summary_winner_cell_shows_the_best_peer_ratio():
    df = _table([_row("einsum", 10.0), _row("torch", 4.0), _row("cpp", 1.0),
                 _row("peer:einsum", 2.0)])
    text = summary.winners_table(df, "float32", "both")
    assert "**cpp** 10.00×, 2.00× best peer" in text


def test_summary_peer_table_lists_every_backend():
    df = _table([_row("einsum", 10.0), _row("torch", 4.0), _row("cpp", 1.0),
                 _row("peer:einsum", 2.0), _row("peer:max-autotune", 8.0)])
    text = summary.peer_table(df, "float32", "both")
    assert "| head | B | best peer | einsum | torch | cpp |" in text
    assert "| A1 | 16 | peer:einsum 2 ms | 0.20× | 0.50× | 2.00× |" in text
    assert summary.peer_table(df, "float32", "forward") is None
