"""The triton backend's choices (issue 38): the TF32 rule, split-K up to the SM count, the
candidates the cost model keeps, and the tuned configs kept on disk
(glai_kernels/triton_tuning.py).

Under the interpreter nothing can be timed, so the tuning tests turn tuning on and give it a
fake timer that runs each candidate once (so every candidate is also checked to run) and
makes the last one timed the fastest: the choice then follows the timings, not the order.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glai_kernels import registry, triton_configs, triton_tuning
from glai_kernels.contract import Shape
from glai_kernels.paper_heads import PAPER_HEADS
from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error

triton_backend = pytest.importorskip("glai_kernels.backends.triton")
ForwardConfig = triton_backend.ForwardConfig

DEVICE = next((d for d in ("cuda", "cpu") if registry.get("triton").unsupported_reason(d) is None),
              None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="the triton backend cannot run here: "
                                f"{registry.get('triton').unsupported_reason('cpu')}")
ROOT = Path(__file__).resolve().parents[1]


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---- the TF32 rule


def _default_matmul_settings() -> None:
    """torch's float32 matmul settings as a fresh process has them (torch 2.9+ links the old
    names, allow_tf32 and the matmul precision, to fp32_precision; this order resets all)."""
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "none"
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "none"


@pytest.fixture
def matmul_settings():
    """Each test starts from, and leaves, torch's default float32 matmul settings."""
    _default_matmul_settings()
    yield torch.backends.cuda.matmul
    _default_matmul_settings()


def _set_precision(value: str) -> None:
    torch.set_float32_matmul_precision(value)


def _allow(value: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = value


def _new_api(value: str) -> None:
    torch.backends.cuda.matmul.fp32_precision = value


# (how the settings are made, the precision the kernels must use)
SETTINGS = [
    ((), "ieee"),
    (((_set_precision, "highest"),), "ieee"),
    (((_set_precision, "high"),), "tf32"),
    (((_set_precision, "medium"),), "tf32"),
    (((_allow, True),), "tf32"),
    (((_allow, False),), "ieee"),
    (((_new_api, "tf32"),), "tf32"),
    (((_new_api, "ieee"),), "ieee"),
    # the later setting wins, as for torch's own matmuls (reading the precision now raises)
    (((_set_precision, "high"), (_allow, False)), "ieee"),
    # allow_tf32 now raises when read; the precision it set ("high") still allows TF32
    (((_allow, True), (_new_api, "none")), "tf32"),
]


@pytest.mark.parametrize(("steps", "expected"), SETTINGS,
                         ids=["+".join(f"{f.__name__[1:]}={v}" for f, v in s) or "default"
                              for s, _ in SETTINGS])
def test_float32_dot_precision_follows_both_torch_settings(matmul_settings, steps, expected):
    if any(f is _new_api for f, _ in steps) and not hasattr(matmul_settings, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision setting")
    for set_it, value in steps:
        set_it(value)
    assert triton_configs.float32_dot_precision() == expected
    assert triton_backend._numerics(torch.float32)["PRECISION"] == expected
    # the other dtypes do not follow it: bfloat16 is its own dot, float16's widened
    # operands are exact in TF32, float64 never calls tl.dot
    assert triton_backend._numerics(torch.bfloat16)["PRECISION"] == "ieee"
    assert triton_backend._numerics(torch.float16)["PRECISION"] == "tf32"
    assert triton_backend._numerics(torch.float64)["FMA"]


class _Recorder:
    """Wraps a kernel to record the keyword arguments of every launch."""

    def __init__(self, kernel, calls: list[dict]) -> None:
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.calls.append(kwargs)
            return launch(*args, **kwargs)
        return run


@pytest.mark.parametrize("mode", ["ieee", "tf32"])
def test_each_float32_mode_meets_its_own_tolerance(monkeypatch, matmul_settings, mode):
    """Every kernel gets the mode's precision, and its results meet that mode's tolerance.
    The interpreter's tl.dot is full float32 whatever it is told, so there the kernels round
    a "tf32" dot's operands themselves (EMULATE_TF32): the tf32 results must differ from the
    ieee ones, or the mode would be tested in name only."""
    torch.set_float32_matmul_precision("highest" if mode == "ieee" else "high")
    interpreted = triton_backend.interpreted()
    monkeypatch.setattr(triton_backend, "interpreted", lambda: interpreted)
    calls: list[dict] = []
    for name in ("_forward_kernel", "_grad_weight_kernel", "_grad_inputs_kernel"):
        monkeypatch.setattr(triton_backend, name, _Recorder(getattr(triton_backend, name), calls))
    data = make_inputs(19, 13, 37, 21, device=DEVICE, seed=41, bias=False)
    dy = torch.randn(19, 21, generator=torch.Generator().manual_seed(42)).to(DEVICE)
    inputs = (data.x, data.act, data.weight)
    y = triton_backend.triton_forward(*inputs, config=ForwardConfig(16, 16, 32, split_k=3))
    grads = triton_backend.triton_backward(
        dy, *inputs, (True, True, True),
        weight_config=triton_backend.GradWeightConfig(16, 64, 16),
        inputs_config=triton_backend.GradInputsConfig(16, 2, 16, 16, i_splits=2))
    assert len(calls) == 3
    assert all(c["PRECISION"] == mode and c["EMULATE_TF32"] == (interpreted and mode == "tf32")
               for c in calls)
    results = [y, *grads]
    expected = [forward64(*inputs), *grads64(dy, *inputs)[:3]]
    scales = [abs_forward64(*inputs), *abs_grads64(dy, *inputs)[:3]]
    for name, got, want, scale in zip(("y", "dx", "dact", "dweight"), results, expected, scales,
                                      strict=True):
        assert worst_error(got, want, scale) <= tolerance(torch.float32, mode == "tf32"), name
    if mode == "tf32":
        ieee = triton_backend._numerics(torch.float32) | {"PRECISION": "ieee",
                                                           "EMULATE_TF32": False}
        monkeypatch.setattr(triton_backend, "_numerics", lambda dtype: ieee)
        full = triton_backend.triton_forward(*inputs, config=ForwardConfig(16, 16, 32, split_k=3))
        assert not torch.equal(full, y)


# ---- split-K up to the SM count


def test_forward_splits_fill_the_sms_with_short_chains():
    # A1 at B = 16 on a 132-SM GPU: one (b, o) tile, 768 k-tiles of 128: 128 slices of 6
    # k-tiles (the autotuner's list stopped at 64 slices of 12), then 64 of 12
    assert triton_configs.forward_splits(1, 768, 132) == (128, 64)
    assert triton_configs.forward_splits(2, 6400, 132) == (66, 33)  # B1's two tiles of 64
    assert triton_configs.forward_splits(132, 768, 132) == (1,)  # the tiles fill the SMs
    assert triton_configs.forward_splits(1, 10, 132) == (2, 1)  # chains of MIN_CHAIN k-tiles
    for tiles, k_tiles, sms in itertools.product((1, 2, 3, 7, 33, 200), (1, 3, 17, 530, 4096),
                                                 (4, 108, 132)):
        splits = triton_configs.forward_splits(tiles, k_tiles, sms)
        for s in splits:
            chain = -(-k_tiles // s)
            assert s == 1 or (tiles * s <= sms and chain >= triton_configs.MIN_CHAIN)
            assert (s - 1) * chain < k_tiles  # no empty slice
        # the rule's split: the shortest chain of any split keeping one program per SM
        allowed = range(1, max(1, min(sms // tiles, k_tiles // triton_configs.MIN_CHAIN)) + 1)
        assert -(-k_tiles // splits[0]) == min(-(-k_tiles // s) for s in allowed)


def test_split_beyond_the_old_cap_matches_oracle_and_repeats_in_deterministic_mode(
        deterministic):
    """A forward cut into 130 slices (more than the 64 the autotuner offered before), each
    one or two k-tiles, in the fixed-order reduction: the same bits twice, and right."""
    data = make_inputs(3, 67, 31, 5, device=DEVICE, seed=43, bias=False)
    config = ForwardConfig(16, 16, 16, split_k=130)
    first = triton_backend.triton_forward(data.x, data.act, data.weight, config=config)
    second = triton_backend.triton_forward(data.x, data.act, data.weight, config=config)
    assert torch.equal(first, second)
    inputs = (data.x, data.act, data.weight)
    assert worst_error(first, forward64(*inputs), abs_forward64(*inputs)) <= tolerance(
        torch.float32)


def test_no_timing_based_choice_in_deterministic_mode(monkeypatch, deterministic):
    monkeypatch.setattr(triton_backend, "interpreted", lambda: False)
    assert not triton_backend._autotunes(torch.float32)
    torch.use_deterministic_algorithms(False)
    assert triton_backend._autotunes(torch.float32)
    assert not triton_backend._autotunes(torch.float64)


# ---- the candidates the cost model keeps

# awkward shapes: batches 1 to past 4096, one output to 129, K from 6 to the B heads'
AWKWARD_SHAPES = [Shape(b, i, p, o) for b, i, p, o in itertools.product(
    (1, 3, 16, 33, 4097), (2, 1280), (3, 640), (1, 4, 37, 129))]


def _valid_forward(c, shape: Shape, sms: int) -> bool:
    k_tiles = -(-shape.gemm_k // c.block_k)
    return (all(v >= 16 and v & (v - 1) == 0 for v in (c.block_m, c.block_n, c.block_k))
            and c.block_m <= max(16, _pow2(shape.batch))
            and c.block_n <= max(16, _pow2(shape.outputs))
            and 1 <= c.split_k <= sms
            and (c.split_k - 1) * -(-k_tiles // c.split_k) < k_tiles  # no empty slice
            and c.num_warps in (4, 8) and c.num_stages >= 1)


@pytest.mark.parametrize("sms", [4, 132])
def test_pruning_keeps_a_few_valid_candidates(monkeypatch, sms):
    monkeypatch.setattr(triton_backend, "_sms", lambda device: sms)
    device = torch.device(DEVICE)
    for shape, dtype in itertools.product(AWKWARD_SHAPES, (torch.float32, torch.bfloat16)):
        forward = triton_backend.forward_candidates(shape, dtype, device)
        assert 1 <= len(forward) <= triton_configs.TOP_K["forward"], shape
        assert len(set(forward)) == len(forward)
        assert all(_valid_forward(c, shape, sms) for c in forward), (shape, forward)
        weight = triton_backend.grad_weight_candidates(shape, dtype, device)
        assert 1 <= len(weight) <= triton_configs.TOP_K["grad_weight"]
        assert all(c.block_o <= max(16, _pow2(shape.outputs))
                   and c.block_b <= max(16, _pow2(shape.batch)) for c in weight), shape
        inputs = triton_backend.grad_inputs_candidates(shape, dtype, device)
        assert 1 <= len(inputs) <= triton_configs.TOP_K["grad_inputs"]
        for c in inputs:
            assert c.block_o <= max(16, _pow2(shape.outputs)), shape
            assert 1 <= c.i_splits <= -(-shape.inputs // c.block_i), (shape, c)
        # best-predicted first
        costs = [triton_configs.forward_cost(shape, c, dtype, sms) for c in forward]
        assert costs == sorted(costs)


def test_the_cost_model_splits_the_paper_batch_and_not_the_large_one(monkeypatch):
    monkeypatch.setattr(triton_backend, "_sms", lambda device: 132)
    device = torch.device(DEVICE)
    for name in ("A1", "C2"):
        head = PAPER_HEADS[name]
        best = triton_backend.forward_candidates(head.shape(16), torch.float32, device)[0]
        tiles = -(-16 // best.block_m) * -(-head.outputs // best.block_n)
        # most SMs stream weight, each a short chain, one program per SM
        assert 0.75 * 132 <= tiles * best.split_k <= 132, (name, best)
    c2 = triton_backend.forward_candidates(PAPER_HEADS["C2"].shape(16), torch.float32, device)
    assert c2[0].split_k > 64  # one tile: more slices than the old autotuner's list offered
    for name, dtype in (("B2", torch.bfloat16), ("C2", torch.float32)):
        large = triton_backend.forward_candidates(PAPER_HEADS[name].shape(4096), dtype, device)
        assert large[0].block_m >= 64, (name, large)  # the weight re-read less often


# ---- tuning kept on disk


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """Tuning on, under a fresh cache folder, with the fake timer of the module docstring;
    yields the list of calls it timed (one per candidate)."""
    monkeypatch.setenv("GLAI_KERNELS_CACHE", str(tmp_path))
    monkeypatch.setattr(triton_backend, "_autotunes", lambda dtype: True)
    timed: list[int] = []

    def fake_bench(fn):
        fn()
        timed.append(len(timed))
        return 1.0 / len(timed)

    monkeypatch.setattr(triton_backend, "_bench_s", fake_bench)
    triton_tuning.forget()
    yield timed
    triton_tuning.forget()


TUNED = (5, 13, 37, 21)  # B, I, P, O


def _tuned_step(seed: int = 44):
    data = make_inputs(*TUNED, device=DEVICE, seed=seed, bias=False)
    dy = torch.randn(TUNED[0], TUNED[3], generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    inputs = (data.x, data.act, data.weight)
    y = triton_backend.triton_forward(*inputs)
    dx, dact, dweight = triton_backend.triton_backward(dy, *inputs, (True, True, True))
    for name, got, want, scale in zip(
            ("y", "dx", "dact", "dweight"), (y, dx, dact, dweight),
            (forward64(*inputs), *grads64(dy, *inputs)[:3]),
            (abs_forward64(*inputs), *abs_grads64(dy, *inputs)[:3]), strict=True):
        assert worst_error(got, want, scale) <= tolerance(torch.float32), name


def test_tuning_times_each_candidate_once_and_writes_the_cache(tuning):
    _tuned_step()
    log = triton_tuning.tuning_log()
    assert [r.kernel for r in log] == ["forward", "grad_weight", "grad_inputs"]
    assert all(r.source == "tuned" and r.seconds > 0 for r in log)
    assert len(tuning) == sum(r.timed for r in log) <= sum(triton_configs.TOP_K.values())
    for record in log:
        stored = json.loads(Path(record.path).read_text())
        assert stored["kernel"] == record.kernel and stored["tune_s"] >= 0
        # the fake timer makes the last candidate timed the fastest
        assert stored["config"] == stored["timings_s"][-1][0] == dataclasses.asdict(
            record.config)
        key = dict(record.key)
        assert key["B"] == 8 and key["device"] and key["triton"] and key["dtype"] == "float32"
    _tuned_step(seed=45)  # the same shape again: nothing timed, nothing logged
    assert len(tuning) == sum(r.timed for r in log) and len(triton_tuning.tuning_log()) == 3
    triton_tuning.forget()  # this process forgets; the disk remembers
    _tuned_step(seed=46)
    assert len(tuning) == sum(r.timed for r in log)
    assert [r.source for r in triton_tuning.tuning_log()] == ["cache"] * 3


def test_a_fresh_process_reads_the_cache_without_tuning(tuning, tmp_path):
    _tuned_step()
    chosen = {r.kernel: dataclasses.asdict(r.config) for r in triton_tuning.tuning_log()}
    # the child imports through the package layout only (PYTHONPATH = the repository: the
    # package and `reference`), and runs _tuned_step's calls and checks itself
    code = f"""
import dataclasses, importlib, json
import torch
from glai_kernels import triton_tuning
tb = importlib.import_module('glai_kernels.backends.triton')
from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error
tb._autotunes = lambda dtype: True
def refuse(fn):
    raise AssertionError('tuned again')
tb._bench_s = refuse
data = make_inputs(*{TUNED!r}, device={DEVICE!r}, seed=44, bias=False)
dy = torch.randn({TUNED[0]}, {TUNED[3]}, generator=torch.Generator().manual_seed(44)).to({DEVICE!r})
inputs = (data.x, data.act, data.weight)
got = (tb.triton_forward(*inputs), *tb.triton_backward(dy, *inputs, (True, True, True)))
for name, g, want, scale in zip(("y", "dx", "dact", "dweight"), got,
                                (forward64(*inputs), *grads64(dy, *inputs)[:3]),
                                (abs_forward64(*inputs), *abs_grads64(dy, *inputs)[:3])):
    assert worst_error(g, want, scale) <= tolerance(torch.float32), name
print(json.dumps({{r.kernel: [r.source, dataclasses.asdict(r.config)]
                  for r in triton_tuning.tuning_log()}}))
"""
    env = os.environ | {"GLAI_KERNELS_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read == {kernel: ["cache", config] for kernel, config in chosen.items()}


@pytest.mark.parametrize("text", ['{"kernel": "forward", "key"', "[]",
                                  '{"kernel": "forward", "key": {}, "config": {}}'],
                         ids=["truncated", "not-an-object", "another-key"])
def test_a_corrupt_cache_file_is_ignored_with_a_warning(tuning, text):
    _tuned_step()
    path = Path(triton_tuning.tuning_log()[0].path)
    path.write_text(text)
    triton_tuning.forget()
    timed = len(tuning)
    with pytest.warns(UserWarning, match=re.escape(str(path))):
        _tuned_step()
    sources = {r.kernel: r.source for r in triton_tuning.tuning_log()}
    assert sources == {"forward": "tuned", "grad_weight": "cache", "grad_inputs": "cache"}
    assert len(tuning) > timed  # the forward was timed again
    assert json.loads(path.read_text())["kernel"] == "forward"  # and its file rewritten


def test_choose_stops_timing_at_its_budget_and_keys_everything(monkeypatch, tmp_path):
    monkeypatch.setenv("GLAI_KERNELS_CACHE", str(tmp_path))
    triton_tuning.forget()
    timed = []
    candidates = [ForwardConfig(16, 16, 16, s) for s in (1, 2, 3)]
    key = {"B": 16, "device": "a GPU", "triton": "3.9.0"}
    chosen = triton_tuning.choose("k", key, lambda: candidates,
                                  lambda c: timed.append(c) or 1.0, budget_s=0.0)
    assert timed == candidates[:1] and chosen == candidates[0]  # the first is always timed
    # one candidate: nothing to time, nothing cached
    assert triton_tuning.choose("k1", key, lambda: candidates[:1], None) == candidates[0]
    assert not triton_tuning.cache_path("k1", key).exists()
    paths = {triton_tuning.cache_path("k", key | {name: "other"}) for name in key}
    assert len(paths | {triton_tuning.cache_path("k", key)}) == len(key) + 1
    with pytest.raises(ValueError, match="no candidate configs for k"):
        triton_tuning.choose("k", {"B": 1}, list, None)
    triton_tuning.forget()
