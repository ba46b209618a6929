"""`glai-bench call-anatomy` (bench/studies/call_anatomy.py): the profiler's kernel totals, a CPU
dry run's rows and JSON, its refusals, and on a GPU the kernels it finds in a call."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from bench.studies import call_anatomy

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

CPU_KIND, CUDA_KIND = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


@dataclass
class FakeAverage:
    """The fields of torch.profiler's key_averages() entries that kernel_totals reads."""

    key: str
    device_type: torch.autograd.DeviceType
    self_device_time_total: float
    count: int


def test_kernel_totals_sum_the_device_kernels_per_call_and_name_the_longest():
    events = [FakeAverage("glai::forward", CPU_KIND, 900.0, 10),  # a host op: not a kernel
              FakeAverage("split_k_chain", CUDA_KIND, 200.0, 10),
              FakeAverage("reduce_splits", CUDA_KIND, 50.0, 10),
              FakeAverage("zero_fill", CUDA_KIND, 10.0, 20),
              FakeAverage("tail", CUDA_KIND, 1.0, 10)]
    per_call, launches, top = call_anatomy.kernel_totals(events, calls=10)
    assert per_call == pytest.approx(26.1)
    assert launches == pytest.approx(5.0)
    assert top == "split_k_chain 20.0; reduce_splits 5.0; zero_fill 1.0"


def test_the_bound_is_the_larger_of_host_and_kernels():
    row = call_anatomy.Anatomy("A1", 16, "forward", "cuda", 47.6, 30.0, 18.0, 2.0, "")
    assert row.bound == "host"
    assert call_anatomy.Anatomy("A1", 16, "forward", "cuda", 47.6, 10.0, 18.0, 2.0, "").bound \
        == "kernels"
    assert call_anatomy.Anatomy("A1", 16, "forward", "cpp", 5.0, 5.0, None, None, "").bound == "-"


def test_a_cpu_dry_run_writes_a_row_per_pass_and_backend(tmp_path, capsys):
    out = tmp_path / "deeper" / "anatomy.json"
    assert call_anatomy.main(["--device", "cpu", "--heads", "A2", "--passes", "forward", "both",
                              "--backends", "torch", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["pass_"], r["backend"]) for r in rows] == [("forward", "torch"), ("both", "torch")]
    assert all(r["event_us"] > 0 and r["host_us"] > 0 and r["kernels_us"] is None
               and r["bound"] == "-" for r in rows)
    assert "| A2 | 16 | both | torch |" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cpu", "--backends", "nope"], "--backends nope: not a backend"),
    (["--device", "cpu", "--backends", "cuda"], "--backends cuda:"),
])
def test_an_unusable_backend_is_refused_naming_it(argv, message, capsys):
    assert call_anatomy.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_cuda_without_a_gpu_is_refused(capsys):
    assert call_anatomy.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_cuda_call_shows_its_kernels():
    row = call_anatomy.anatomy("A1", 16, "forward", "cuda", torch.device("cuda"), 0.05)
    assert row.kernels is not None and row.kernels >= 1
    assert 0 < row.kernels_us < 10 * row.event_us and row.top
