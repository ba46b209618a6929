"""`python -m glai_kernels`: print every backend's availability and the auto choice, for the
dense op and the sparse kept-path op, and which dispatch table (this machine kind's, or the
nearest measured kind's) and rule each op's auto follows on this machine."""

import torch

import glai_kernels
from glai_kernels import dispatch, registry, sparse
from glai_kernels.glai.prune import layout_crossover
from glai_kernels.paper_heads import PAPER_HEADS

# the calls shown: GLAI's paper batch and a large one, at the first paper head
_SHOWN_HEAD, _SHOWN_BATCHES = "A1", (16, 256)


def _report(title: str, reg: registry.Registry, device_types: list[str]) -> None:
    print(title)
    for status in reg.statuses():
        print(" ", status)
    for device_type in device_types:
        for dtype in glai_kernels.SUPPORTED_DTYPES:
            try:
                chosen = reg.pick_by_priority(device_type, dtype).name
            except RuntimeError as error:
                chosen = f"none ({error})"
            print(f"  auto on {device_type} {str(dtype).removeprefix('torch.')} "
                  f"by priority: {chosen}")


def _dispatch(device_type: str, reg: registry.Registry) -> None:
    """The table `reg`'s auto consults on `device_type` (this machine kind's, or the nearest
    measured kind's) and the rule it follows for a few calls."""
    kind = dispatch.machine_kind(device_type)
    table = dispatch.table_for(device_type, op=reg.op)
    if table is None:
        print(f"  {device_type}: no {reg.op} dispatch table for machine kind {kind} nor a "
              f"near one (looked for {dispatch.table_path(kind, op=reg.op)}): auto follows "
              f"the priorities above")
        return
    prov = table.provenance
    print(f"  {device_type}: dispatch table {table.source} ({len(table.entries)} entries; "
          f"measured by `{prov.get('command', '?')}`, preset {prov.get('preset', '?')}, "
          f"commit {str(prov.get('commit', '?'))[:12]}, {prov.get('date', '?')})")
    if table.stand_in_for:
        shared = "instruction set and vendor" if _same_vendor(table, kind) else "instruction set"
        print(f"    measured on {table.machine_kind}, the nearest measured kind to this "
              f"machine's {kind} (same {shared}); `nox -s bench` measures and installs this "
              f"machine's own")
    head = PAPER_HEADS[_SHOWN_HEAD]
    for dtype in glai_kernels.SUPPORTED_DTYPES:
        for batch in _SHOWN_BATCHES:
            for mode in dispatch.MODES:
                shape = head.shape(batch)
                call = dispatch.Call(mode, batch, shape.inputs, shape.paths, shape.outputs)
                try:
                    chosen = reg.pick_auto(device_type, dtype, call).name
                except RuntimeError as error:
                    chosen = f"none ({error})"
                print(f"    {str(dtype).removeprefix('torch.'):8s} {mode:7s} {_SHOWN_HEAD} "
                      f"B={batch:<4d} -> {chosen:7s} by "
                      f"{reg.auto_rule(device_type, dtype, call)}")


def _same_vendor(table: dispatch.Table, kind: str) -> bool:
    theirs, mine = dispatch.kinds.parse(table.machine_kind), dispatch.kinds.parse(kind)
    return theirs is not None and mine is not None and theirs.vendor == mine.vendor


def main() -> None:
    print(f"glai-kernels {glai_kernels.__version__}, torch {torch.__version__}")
    device_types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    _report("dense estimator (glai_kernels.estimator):", registry.ESTIMATOR, device_types)
    print("  auto with a call's mode and shape (estimator calls): the measured dispatch table "
          "where this machine kind has one, else the priorities")
    for device_type in device_types:
        _dispatch(device_type, registry.ESTIMATOR)
    _report("sparse kept-path estimator (glai_kernels.sparse.estimator):",
            sparse.SPARSE_ESTIMATOR, device_types)
    print("  auto with a call's mode and shape: the sparse op's own measured table "
          "(<machine kind>.sparse_estimator.json) where there is one, else the priorities")
    for device_type in device_types:
        _dispatch(device_type, sparse.SPARSE_ESTIMATOR)
    _layout_crossovers(device_types)


def _layout_crossovers(device_types: list[str]) -> None:
    """The kept fraction up to which prune(layout="auto") takes the sparse layout on each
    device, and whether it was measured or is a roofline prediction."""
    print("  pruned heads take the sparse layout at a kept fraction of at most (the training "
          "step's crossover; glai_kernels.glai.prune(layout=...) forces either):")
    for device_type in device_types:
        for name in ("A1", "B1"):
            shape = PAPER_HEADS[name].shape(16)
            found = layout_crossover(torch.device(device_type),
                                     (shape.outputs, shape.inputs, shape.paths))
            said = ("dense always (no table, no prediction)" if found is None else
                    f"{found.fraction:.1%}, {found.source}: {found.detail}")
            print(f"    {device_type} {name}-shaped head: {said}")


if __name__ == "__main__":
    main()
