"""`auto` from measurements: the machine's dispatch table (glai_kernels/dispatch/) decides
where it has an entry, the priorities everywhere else."""

from __future__ import annotations

import json

import pytest
import torch
from auto_tables import check_auto_follows_table, write_table

import glai_kernels
from glai_kernels import dispatch, registry
from glai_kernels.dispatch import Call


@pytest.fixture
def spies(monkeypatch, spy_calls):
    """Two CPU backends recording their calls: spy_high outranks spy_low by priority
    (correctness/conftest.py), with no backend named by the environment."""
    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    return spy_calls


def _entry(winner: str, bucket: int, size: int = 7, mode: str = "both",
           dtype: str = "float32") -> dict:
    return {"dtype": dtype, "mode": mode, "batch_bucket": bucket, "size_class": size,
            "winner": winner}


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    """A folder the package reads its tables from; `write(entries)` puts one there for this
    machine kind."""
    monkeypatch.setattr(dispatch, "TABLE_DIR", tmp_path)
    dispatch.clear_cache()

    def write(entries: list[dict], kind: str | None = None) -> None:
        write_table(tmp_path, entries, kind)

    yield write
    dispatch.clear_cache()


def _args(batch: int = 3, grad: bool = True):
    gen = torch.Generator().manual_seed(0)
    # O*I*P = 5*4*6 = 120 elements: size class 7
    return (torch.randn(batch, 4, generator=gen), torch.randn(batch, 6, generator=gen),
            torch.randn(5, 4, 6, generator=gen, requires_grad=grad))


def test_the_table_decides_where_it_has_an_entry(spies, table_dir):
    table_dir([_entry("spy_low", 4, mode="train"), _entry("spy_high", 4, mode="forward")])
    check_auto_follows_table(spies, registry.ESTIMATOR,
                             lambda: glai_kernels.estimator(*_args()))


def test_a_machine_kind_without_a_table_falls_back_to_priorities(spies, table_dir):
    table_dir([_entry("spy_low", 4, mode="train")], kind="cpu-some-other-machine-2t")
    glai_kernels.estimator(*_args()).sum().backward()
    assert spies == ["spy_high.forward", "spy_high.backward"]
    rule = registry.auto_rule("cpu", torch.float32, Call("train", 3, 4, 6, 5))
    assert rule.startswith("priorities (no dispatch table for ")


def test_a_dtype_or_mode_without_entries_falls_back_to_priorities(spies, table_dir):
    table_dir([_entry("spy_low", 4, mode="forward", dtype="float64")])
    assert registry.pick_auto("cpu", torch.float32, Call("forward", 3, 4, 6, 5)).name \
        == "spy_high"
    assert registry.pick_auto("cpu", torch.float64, Call("both", 3, 4, 6, 5)).name \
        == "spy_high"
    assert registry.pick_auto("cpu", torch.float64, Call("forward", 3, 4, 6, 5)).name \
        == "spy_low"


@pytest.mark.parametrize("winner", ["cuda", "ghost", "einsum"])
def test_an_entry_naming_a_backend_auto_cannot_take_falls_back(spies, table_dir, winner):
    # cuda: registered, unavailable on this CPU; ghost: not registered; einsum: registered
    # and available but never an auto candidate (no auto_priority)
    table_dir([_entry(winner, 4)])
    call = Call("both", 3, 4, 6, 5)
    assert registry.pick_auto("cpu", torch.float32, call).name == "spy_high"
    assert registry.auto_rule("cpu", torch.float32, call).startswith("priorities")


@pytest.mark.parametrize(("batch", "bucket"), [(1, 1), (2, 2), (3, 4), (16, 16), (17, 32),
                                               (256, 256), (257, 512), (4096, 4096)])
def test_batch_bucket_is_the_next_power_of_two(batch, bucket):
    assert dispatch.batch_bucket(batch) == bucket


def test_size_class_and_thread_bucket():
    assert dispatch.size_class(384, 256, 37) == 22  # A1: 3.6M weight elements
    assert dispatch.size_class(4, 6, 5) == 7
    assert [dispatch.thread_bucket(n) for n in (1, 2, 3, 4, 5, 16)] == [1, 2, 4, 4, 8, 16]


def test_a_batch_between_entries_takes_the_nearest_bucket(spies, table_dir):
    table_dir([_entry("spy_low", 16), _entry("spy_high", 256)])
    pick = {b: registry.pick_auto("cpu", torch.float32, Call("both", b, 4, 6, 5)).name
            for b in (1, 16, 20, 40, 100, 200, 256, 10_000)}
    # 20 -> bucket 32, one octave from 16; 100 -> 128, one octave from 256; 40 -> 64, two
    # octaves from either: the tie goes to the larger batch
    assert pick == {1: "spy_low", 16: "spy_low", 20: "spy_low", 40: "spy_high",
                    100: "spy_high", 200: "spy_high", 256: "spy_high", 10_000: "spy_high"}


def test_call_mode():
    x, act, w = _args(grad=False)
    assert dispatch.call_mode(x, act, w) == "forward"
    assert dispatch.call_mode(x, act, w.requires_grad_()) == "train"
    assert dispatch.call_mode(x, act.requires_grad_(), w) == "both"
    with torch.no_grad():
        assert dispatch.call_mode(x, act, w) == "forward"


def test_machine_kind_extends_the_gates():
    # the gate's baselines are kept per "cpu-<N>core-<vendor family model>"; a dispatch table
    # adds the instruction set and the thread bucket
    from bench.gate.store import machine_kind
    from bench.harness import provenance

    gate = machine_kind(provenance.collect(torch.device("cpu")))
    kind = dispatch.machine_kind("cpu", threads=3)
    assert kind.startswith(gate + "-") and kind.endswith("-4t")
    assert torch.backends.cpu.get_cpu_capability() in kind


def test_shipped_tables_load_and_name_registered_backends():
    for path in sorted(dispatch.TABLE_DIR.glob("*.json")):
        if "." in path.stem:  # another op's table (<kind>.sparse_estimator, .layout_crossover)
            continue
        table = dispatch.Table.from_dict(json.loads(path.read_text()), str(path))
        assert path.stem == table.machine_kind
        assert table.entries and table.provenance.get("command")
        for entry in table.entries:
            assert entry.mode in dispatch.MODES
            assert entry.winner in registry.names()


def test_backend_for_follows_the_table_when_told_the_call(spies, table_dir):
    from glai_kernels.op import backend_for

    table_dir([_entry("spy_low", 4, mode="train")])
    x, act, weight = _args()
    assert backend_for(x, None, act, weight) == "spy_low"
    assert backend_for(x) == "spy_high"  # no call shape: the priorities
    assert backend_for(x, "spy_high", act, weight) == "spy_high"
