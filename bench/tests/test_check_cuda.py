"""`glai-bench check-cuda` (bench/tools/check_cuda.py) without nvcc: the ptxas report's parser,
which decides whether a spill fails CI, and the helper that runs the compilers on every core."""

from __future__ import annotations

import threading
import time

import pytest

from bench.tools import check_cuda

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

# ptxas -v output in the form nvcc 12 and 13 print it (one kernel clean, one spilling, one
# device function with a stack frame only)
PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5cleanPf' for 'sm_90'
ptxas info    : Function properties for _Z5cleanPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 8576 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function '_Z5spillPf' for 'sm_90'
ptxas info    : Function properties for _Z5spillPf
    40 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, 17920 bytes smem, 368 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_the_parser_reads_each_functions_resources_and_flags_only_the_spill():
    found = {f.name: f for f in check_cuda.parse_ptxas(PTXAS_LOG)}
    assert list(found) == ["_Z5cleanPf", "_Z5spillPf", "_Z6helperv"]
    clean, spill, helper = found.values()
    assert (clean.entry, clean.registers, clean.shared_bytes, clean.spills) == (
        True, 96, 8576, False)
    assert (spill.registers, spill.shared_bytes, spill.stack_bytes) == (255, 17920, 40)
    assert (spill.spill_stores, spill.spill_loads, spill.spills) == (24, 16, True)
    assert (helper.entry, helper.stack_bytes, helper.spills) == (False, 16, False)


def test_the_report_has_a_row_per_function_with_its_spills():
    rows = [("k.cu", f) for f in check_cuda.parse_ptxas(PTXAS_LOG)]
    table = check_cuda.report("90", "nvcc test", rows)
    spill_row = next(line for line in table.splitlines() if "_Z5spillPf" in line
                     or "spill(float*)" in line)
    assert spill_row.rstrip("|").split("|")[-2:] == [" 24 ", " 16 "]
    assert sum(line.startswith("| k.cu") for line in table.splitlines()) == 3


def test_every_core_runs_the_compiles_at_once_and_keeps_their_order(monkeypatch):
    monkeypatch.setattr(check_cuda.os, "cpu_count", lambda: 2)
    # each call waits for the other: run one at a time, the barrier breaks
    both_running = threading.Barrier(2, timeout=10)

    def compile_one(n: int) -> int:
        both_running.wait()
        return n * n

    assert check_cuda.on_every_core(compile_one, [3, 4]) == [9, 16]


def test_one_core_runs_them_in_turn(monkeypatch):
    monkeypatch.setattr(check_cuda.os, "cpu_count", lambda: 1)
    running, most = [0], [0]
    lock = threading.Lock()

    def compile_one(n: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)  # room for a second call to start, were there a second worker
        with lock:
            running[0] -= 1
        return -n

    assert check_cuda.on_every_core(compile_one, range(5)) == [0, -1, -2, -3, -4]
    assert most[0] == 1
    with pytest.raises(ZeroDivisionError):
        check_cuda.on_every_core(lambda n: 1 // n, [1, 0])
