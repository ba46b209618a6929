"""`glai-bench vmap-heads`: what memory each contender reads, and a fresh ensemble a repeat
(docs/notes/cpu-kernels.md, "vmap over stacked heads, fifth pass: where the weights sit (issue
43, stop 49)")."""

from __future__ import annotations

import pytest
import torch

from bench.studies import vmap_heads
from glai_kernels import extension


@pytest.fixture(scope="module")
def cpp():
    if extension.load().error is not None:
        pytest.skip("the cpp extension is unavailable here")


def test_folded_reads_the_stacked_weight_itself(cpp):
    """`folded` is the floor of `vmap` on the same memory: its weight and bias are views of
    stack_module_state's tensors (a copy's pages time differently), leaves needing gradients
    for the forward+backward pass."""
    e = vmap_heads.ensemble("A1", 3, 2, "cpp", seed=4)
    assert e.weight.data_ptr() == e.params["weight"].data_ptr()
    assert e.bias.data_ptr() == e.params["bias"].data_ptr()
    assert e.weight.shape == (2 * e.params["weight"].shape[1], *e.params["weight"].shape[2:])
    assert e.weight.is_leaf and e.weight.requires_grad and e.bias.requires_grad
    # the loop keeps the heads' own tensors: separate memory from the stacked state
    assert all(h.weight.data_ptr() != e.params["weight"].data_ptr() for h in e.heads)
    dw, db = vmap_heads.training_calls(e)["folded"]()
    assert dw.shape == e.weight.shape and db.shape == e.bias.shape


def test_every_repeat_times_a_fresh_ensemble(cpp, monkeypatch, capsys):
    """Repeat r builds its own ensemble with seed `--seed` + r, so the ratios come from as
    many allocations as repeats; each repeat's contenders are that ensemble's."""
    built: list[tuple[int, vmap_heads.Ensemble]] = []
    real = vmap_heads.ensemble

    def recording(head, batch, count, backend, seed=0):
        e = real(head, batch, count, backend, seed=seed)
        built.append((seed, e))
        return e

    timed_weights: list[int] = []

    def fake_timed(fns, rounds, min_time_s, clock):
        # the real one's result: {name: (median µs, interquartile range µs)}
        timed_weights.append(built[-1][1].params["weight"].data_ptr())
        return {name: (100.0 + i, 1.0) for i, name in enumerate(fns)}

    monkeypatch.setattr(vmap_heads, "ensemble", recording)
    monkeypatch.setattr(vmap_heads, "timed", fake_timed)
    assert vmap_heads.main(["--heads", "2", "--batch", "3", "--repeats", "3", "--seed", "5",
                            "--passes", "forward"]) == 0
    out = capsys.readouterr().out
    assert [seed for seed, _ in built] == [5, 6, 7]
    assert len(timed_weights) == 3
    weights = [e.params["weight"] for _, e in built]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
    for r, seed in enumerate((5, 6, 7), 1):
        assert f"ensemble {r} (seed {seed}), bit for bit with the loop: forward yes" in out
        assert f"repeat {r} (ensemble {r}):" in out
    assert "over repeats (ensembles): vmap 1.010 [1.010, 1.010]" in out
    assert "loop and op-loop read the heads' own weights" in out


def test_the_header_says_how_tensors_are_allocated(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert "4 KB pages" in vmap_heads.allocation()
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert "4 KB pages" in vmap_heads.allocation()
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    assert "2 MB pages" in vmap_heads.allocation()


def test_overhead_times_every_forward_contender_without_the_kernel(cpp, monkeypatch):
    """`--overhead`: each forward contender's Python alone, warm and cold, with the cpp kernel
    stood in by zeros (y = bias), and the real kernel back afterwards, even on an error."""
    import contextlib
    import time

    import glai_kernels.module

    e = vmap_heads.ensemble("A1", 3, 2, "cpp", seed=1)
    real, op = extension.run_forward, vmap_heads.estimator
    result = vmap_heads.overhead(e, rounds=1, calls=2, clock=time.perf_counter)
    assert extension.run_forward is real
    assert vmap_heads.estimator is op and glai_kernels.module.estimator is op
    assert set(result) == set(vmap_heads.forward_calls(e))
    # every contender was timed and calls the op (whether an op part, timed in rounds of its
    # own, stays under its total is a matter of the machine's noise, not of this code: the
    # op's part is checked exactly below, on a clock that ticks once a read)
    assert all(0 < v < 1e6 for times in result.values() for v in times)
    ticks = iter(range(1, 10**6))
    spent = [0.0, True]
    n = len(e.heads)
    expected = {"loop": n, "vmap": 1, "folded": 1, "op-loop": n, "op-vmap": 1}
    with vmap_heads.stand_in_kernel(), vmap_heads.op_clock(lambda: float(next(ticks)), spent):
        for name, fn in vmap_heads.forward_calls(e).items():
            spent[0] = 0.0
            fn()
            assert spent[0] == expected[name], name  # one tick per op call, inside the op
        spent[1] = False
        vmap_heads.forward_calls(e)["loop"]()
        assert spent[0] == 1  # not clocked: unchanged since the last contender's one call
    with vmap_heads.stand_in_kernel():
        y = vmap_heads.forward_calls(e)["vmap"]()
    assert torch.equal(y, e.params["bias"].detach()[:, None, :].expand(2, 3, -1))
    assert extension.run_forward is real
    # a stand-in that replaced nothing is refused, not timed as Python alone
    monkeypatch.setattr(vmap_heads, "stand_in_kernel", contextlib.nullcontext)
    with pytest.raises(RuntimeError, match="did not replace"):
        vmap_heads.overhead(e, rounds=1, calls=1, clock=time.perf_counter)


def test_overhead_needs_the_cpp_backend(capsys):
    with pytest.raises(SystemExit) as stop:
        vmap_heads.main(["--overhead", "--backend", "torch", "--heads", "2", "--batch", "3"])
    assert stop.value.code == 2
    assert "--overhead stands in for the cpp kernel" in capsys.readouterr().err
    e = vmap_heads.ensemble("A1", 3, 2, "torch", seed=1)
    with pytest.raises(ValueError, match="backend 'torch'"):
        vmap_heads.overhead(e, rounds=1, calls=1, clock=lambda: 0.0)
