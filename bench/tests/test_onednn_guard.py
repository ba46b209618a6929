"""bench/harness/onednn_guard.py: the crash check runs in a child, and the limit is set only when
the child dies of SIGFPE."""

from __future__ import annotations

import pytest

from bench.harness import onednn_guard

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores


def test_the_amx_flag_is_read_from_cpuinfo():
    assert onednn_guard.cpu_has_amx("processor: 0\nflags\t: fpu avx512f amx_bf16 amx_tile\n")
    assert not onednn_guard.cpu_has_amx("processor: 0\nflags\t: fpu avx512f avx512_bf16\n")


def test_a_child_dying_of_sigfpe_is_told_from_one_that_fails_otherwise():
    assert onednn_guard.crashes("import os, signal; os.kill(os.getpid(), signal.SIGFPE)")
    assert not onednn_guard.crashes("raise SystemExit(3)")
    assert not onednn_guard.crashes("pass")


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(onednn_guard.ISA_VAR, raising=False)
    monkeypatch.delenv(onednn_guard.REASON_VAR, raising=False)
    return monkeypatch


def test_the_limit_is_set_only_where_the_known_product_crashes(clean_env):
    import os

    clean_env.setattr(onednn_guard, "crashes", lambda: False)
    assert onednn_guard.apply(has_amx=True) is None and onednn_guard.ISA_VAR not in os.environ
    clean_env.setattr(onednn_guard, "crashes", lambda: True)
    assert onednn_guard.apply(has_amx=False) is None  # no AMX: not even asked
    reason = onednn_guard.apply(has_amx=True)
    assert "SIGFPE" in reason and os.environ[onednn_guard.ISA_VAR] == onednn_guard.LIMIT
    # a child process (the gate's runs) inherits both and is not asked again
    clean_env.setattr(onednn_guard, "crashes", lambda: pytest.fail("asked twice"))
    assert onednn_guard.apply(has_amx=True) == reason


def test_a_limit_the_user_set_is_left_alone(clean_env):
    clean_env.setenv(onednn_guard.ISA_VAR, "AVX2")
    clean_env.setattr(onednn_guard, "crashes", lambda: pytest.fail("asked"))
    assert onednn_guard.apply(has_amx=True) is None
