"""The layout crossover `prune(layout="auto")` follows per machine kind
(glai_kernels/dispatch/crossover.py, glai_kernels/glai/prune.py's `layout_crossover`): a
measured table read back (its own kind's, or the nearest measured kind's), a malformed one
warned about and passed over, and on a CUDA kind with no table the roofline prediction,
labelled as one, here and in `python -m glai_kernels`. No GPU is needed: the machine kind is
faked (`prune.machine_kind_of`) and tables are written to $GLAI_DISPATCH_DIR.
"""

from __future__ import annotations

import importlib
import json
import warnings

import pytest
import torch

from glai_kernels import __main__ as glai_main
from glai_kernels.dispatch import crossover
from glai_kernels.paper_heads import PAPER_HEADS

# the module (glai_kernels.glai re-exports its `prune` function under the same name)
prune_mod = importlib.import_module("glai_kernels.glai.prune")

FAKE_GPU = "cuda-Fake-GPU-sm77"  # a kind no table or datasheet knows
H100 = "cuda-NVIDIA-H100-80GB-HBM3-sm90"


def _shape(name: str) -> tuple[int, int, int]:
    s = PAPER_HEADS[name].shape(16)
    return s.outputs, s.inputs, s.paths


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """An empty dispatch folder of our own, read afresh."""
    monkeypatch.setenv("GLAI_DISPATCH_DIR", str(tmp_path))
    crossover.clear_cache()
    yield tmp_path
    crossover.clear_cache()


def _write(folder, kind: str, data) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    crossover.table_path(kind, folder).write_text(text)


def _table(kind: str, value) -> dict:
    return {"kind": crossover.KIND, "schema": crossover.SCHEMA, "machine_kind": kind,
            "crossover": value, "provenance": {}, "cases": []}


def _on(monkeypatch, kind: str) -> None:
    monkeypatch.setattr(prune_mod, "machine_kind_of", lambda device: kind)


def test_an_unknown_cuda_kind_gets_the_prediction(tables, monkeypatch):
    _on(monkeypatch, FAKE_GPU)
    a1 = prune_mod.layout_crossover(torch.device("cuda"), _shape("A1"))
    b1 = prune_mod.layout_crossover(torch.device("cuda"), _shape("B1"))
    assert a1.source == b1.source == "prediction"
    assert "prediction" in a1.detail and "assumed" in a1.detail  # not a datasheet GPU
    assert 0 < b1.fraction < a1.fraction <= 1  # the larger dense weight is bandwidth-bound
    # choose_layout follows it: just under B1's predicted crossover sparse, just over dense
    weights = int(torch.tensor(_shape("B1")).prod())
    under, over = int(0.9 * b1.fraction * weights), int(1.1 * b1.fraction * weights)
    assert prune_mod.choose_layout("auto", under, _shape("B1"), torch.device("cuda"),
                                   "torch") == "sparse"
    assert prune_mod.choose_layout("auto", over, _shape("B1"), torch.device("cuda"),
                                   "torch") == "dense"


def test_the_prediction_scales_as_its_model_says():
    """Floor-bound (small weights): the crossover halves when the weights double; bandwidth-
    bound (large): it no longer depends on their number; a faster memory raises the first."""
    # 1.5M and 3M weights: the dense step under its floor on an H100, the sparse one not
    small, large = (15, 1000, 100), (128, 1281, 320)
    base = crossover.predict(H100, small).fraction
    doubled = crossover.predict(H100, (30, 1000, 100)).fraction
    assert base < 1 and doubled == pytest.approx(base / 2)
    big = crossover.predict(H100, large).fraction
    assert crossover.predict(H100, (256, 1281, 320)).fraction == pytest.approx(big)
    assert big < base
    assert crossover.predict("cuda-NVIDIA-H200-sm90", small).fraction > base  # 4.8 > 3.35 TB/s
    assert "H100 datasheet" in crossover.predict(H100, small).detail


def test_a_measured_table_is_read_back_and_stands_in_for_a_near_kind(tables, monkeypatch):
    _write(tables, H100, _table(H100, 0.42))
    _on(monkeypatch, H100)
    found = prune_mod.layout_crossover(torch.device("cuda"), _shape("B1"))
    assert (found.fraction, found.source) == (0.42, "measured")
    assert str(crossover.table_path(H100, tables)) in found.detail
    # another sm90 GPU takes the nearest measured kind's table, and says so
    _on(monkeypatch, "cuda-NVIDIA-H100-PCIe-sm90")
    found = prune_mod.layout_crossover(torch.device("cuda"), _shape("B1"))
    assert found.fraction == 0.42 and "nearest measured kind" in found.detail
    # never another instruction set's: an sm80 GPU gets the prediction
    _on(monkeypatch, "cuda-NVIDIA-A100-SXM4-80GB-sm80")
    assert prune_mod.layout_crossover(torch.device("cuda"), _shape("B1")).source == "prediction"
    # a measured 0 keeps every head dense
    _write(tables, H100, _table(H100, 0))
    crossover.clear_cache()
    _on(monkeypatch, H100)
    assert prune_mod.choose_layout("auto", 1, _shape("B1"), torch.device("cuda"),
                                   "torch") == "dense"


@pytest.mark.parametrize("content", [
    "{not json", json.dumps([1, 2]), json.dumps({**_table(H100, 0.5), "kind": "other"}),
    json.dumps(_table(H100, 1.5)), json.dumps(_table(H100, True)),
    json.dumps({**_table(H100, 0.5), "schema": 99}), json.dumps(_table(H100, "0.5")),
], ids=["bad-json", "array", "wrong-kind", "over-one", "bool", "newer-schema", "string"])
def test_a_malformed_table_warns_and_falls_back(tables, monkeypatch, content):
    _write(tables, H100, content)
    _on(monkeypatch, H100)
    with pytest.warns(RuntimeWarning, match="layout crossover table"):
        found = prune_mod.layout_crossover(torch.device("cuda"), _shape("A1"))
    assert found.source == "prediction"  # the next rule on a CUDA kind
    # once per process: the second look is silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prune_mod.layout_crossover(torch.device("cuda"), _shape("A1"))


def test_a_cpu_kind_without_a_table_keeps_the_measured_constant(tables, monkeypatch):
    kind = "cpu-2core-AuthenticAMD-family-26-model-2-AVX512-2t"
    _on(monkeypatch, kind)
    found = prune_mod.layout_crossover(torch.device("cpu"), _shape("A1"))
    assert found.fraction == prune_mod.SPARSE_CROSSOVER["cpu"] and found.source == "measured"
    _write(tables, kind, "{broken")
    crossover.clear_cache()  # read once per process: this one wrote it after the first look
    with pytest.warns(RuntimeWarning):
        assert prune_mod.layout_crossover(torch.device("cpu"), _shape("A1")).fraction == \
            prune_mod.SPARSE_CROSSOVER["cpu"]
    # a device type with no kind, table or prediction: dense
    assert prune_mod.layout_crossover(torch.device("meta"), _shape("A1")) is None


def test_python_m_glai_kernels_labels_the_prediction(tables, monkeypatch, capsys):
    _on(monkeypatch, FAKE_GPU)
    glai_main._layout_crossovers(["cuda"])
    out = capsys.readouterr().out
    assert "cuda A1-shaped head" in out and "prediction" in out


def test_shipped_layout_crossover_tables_parse_and_name_their_kind():
    from glai_kernels import dispatch

    for path in sorted(dispatch.TABLE_DIR.glob(f"*.{crossover.SUFFIX}.json")):
        data = json.loads(path.read_text())
        assert 0 <= crossover.parse_table(data, str(path)) <= 1
        assert path.name == crossover.table_path(data["machine_kind"], path.parent).name
        assert data["provenance"].get("command") and data["cases"]
