"""`glai-bench step-anatomy`: the engineered steps' time by part (bench/studies/step_anatomy.py).
The differences' arithmetic on made-up rounds, the recorder's contract, and one real run at A1
(its replays checked against the step's own calls). Nothing here asserts on a time."""

from __future__ import annotations

import pytest
import torch

from bench.studies import step_anatomy as anatomy
from glai_kernels import extension

pytestmark = pytest.mark.shares_cores


def _needs_extension() -> None:
    if extension.load().error is not None:
        pytest.skip("the cpp extension is unavailable here")


def test_python_and_interference_are_taken_round_by_round():
    rounds = {"forward": (10.0, 20.0), "loss": (5.0, 6.0), "update": (30.0, 31.0),
              "sequence": (50.0, 60.0), "step": (70.0, 65.0)}
    out = anatomy.derived(rounds)
    assert out["python"] == (20.0, 5.0)
    assert out["interference"] == (5.0, 3.0)
    assert {k: out[k] for k in rounds} == rounds  # the parts themselves are kept as they were


def test_the_table_has_every_part_for_both_sides_and_their_difference():
    glai = anatomy.derived({"forward": (2e-6,), "loss": (1e-6,), "update": (3e-6,),
                            "sequence": (7e-6,), "step": (9e-6,)})
    mlp = anatomy.derived({"forward": (1e-6,), "loss": (1e-6,), "update": (2e-6,),
                           "sequence": (4e-6,), "step": (6e-6,)})
    text = anatomy.report("A2", "B = 16", {"GLAI": glai, "MLP": mlp})
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:-1]}
    assert set(rows) == set(anatomy.PARTS + anatomy.DERIVED)
    assert rows["step"][1:] == ["9.0", "[9.0,", "9.0]", "6.0", "[6.0,", "6.0]", "3.0", "[3.0,",
                                "3.0]"]
    assert rows["interference"][1] == "1.0" and rows["interference"][4] == "0.0"
    assert text.splitlines()[-1].endswith("1.50 [1.50, 1.50]")


def test_the_recorder_records_the_last_call_and_puts_the_ops_back_on_an_error():
    _needs_extension()
    original = torch.ops.glai_ext.cpu_isa
    with pytest.raises(KeyError, match="boom"), anatomy.recorded_calls(("cpu_isa",)) as seen:
        current = torch.ops.glai_ext.cpu_isa("")  # "": which set runs, changing nothing
        assert current == original("")
        torch.ops.glai_ext.cpu_isa(current)  # the same set again: nothing changes
        assert seen == {"cpu_isa": (current,)}
        raise KeyError("boom")
    assert torch.ops.glai_ext.cpu_isa is original


def test_a_step_that_makes_no_such_call_is_refused_naming_the_op():
    _needs_extension()
    with pytest.raises(RuntimeError, match="no glai_ext::sparse_step_forward call"):
        anatomy.side_parts(lambda: None, "sparse_step_forward", "sparse_step_update")
    assert not isinstance(torch.ops.glai_ext.sparse_step_forward, type(lambda: None))


def test_the_replays_read_and_write_the_steps_own_operands_at_a1(monkeypatch):
    _needs_extension()
    steps, _ = anatomy.head_steps("A1", compiled=False)
    for step, forward_op, update_op in anatomy.SIDES.values():
        parts = anatomy.side_parts(steps[step], forward_op, update_op)
        assert set(parts) == set(anatomy.PARTS)
        replayed = parts["forward"]()[0].clone()
        assert replayed.shape == (16, 37) and torch.isfinite(replayed).all()
        op, outputs = getattr(torch.ops.glai_ext, forward_op), []

        def keep(*args, op=op, outputs=outputs):
            out = op(*args)
            outputs.append(out[0].detach().clone())
            return out

        monkeypatch.setattr(torch.ops.glai_ext, forward_op, keep)
        steps[step]()  # its forward reads the parameters the replay read: the same y
        monkeypatch.undo()
        assert len(outputs) == 1 and torch.equal(outputs[0], replayed), step
        before = parts["forward"]()[0].clone()  # the step's own update moved the parameters
        assert not torch.equal(before, replayed), step
        parts["update"]()  # and so does the replayed one: it writes the step's parameters
        assert not torch.equal(parts["forward"]()[0], before), step
        for part in ("loss", "sequence"):
            parts[part]()


def test_a_real_run_at_a1(capsys):
    _needs_extension()
    assert anatomy.main(["--heads", "A1", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "A1 (B = 16, K = " in out and "median over 2 rounds" in out
    for part in anatomy.PARTS + anatomy.DERIVED:
        assert f"\n  {part} " in out
    assert "step ratio GLAI / MLP, round by round:" in out


def test_without_the_extension_it_says_so(monkeypatch, capsys):
    import types

    monkeypatch.setattr(extension, "load", lambda: types.SimpleNamespace(error="no compiler"))
    with pytest.raises(SystemExit) as stop:
        anatomy.main(["--heads", "A1"])
    assert stop.value.code == 2 and "no compiler" in capsys.readouterr().err
