"""Machine kinds as dispatch tables name them, and the nearest measured kind to an unseen one.

A table is measured on one machine kind (`machine_kind` in this package):

    cpu-<cores>core-<vendor>-family-<f>-model-<m>-<ISA>-<threads>t
        e.g. cpu-2core-AuthenticAMD-family-26-model-2-AVX512-2t
    cuda-<device name>-sm<major><minor>
        e.g. cuda-NVIDIA-H100-80GB-HBM3-sm90

On a kind with no table of its own, `auto` takes the table of the nearest measured kind
rather than the priorities: what decides a winner is the instruction set the kernels run (the
CPU's vector ISA, the GPU's compute capability) first, and the vendor's cores second (an AMD
and an Intel CPU with AVX-512 differ in their FMA ports and caches; two AVX-512 AMD
generations much less). So:

1. same instruction set and vendor, then
2. same instruction set;

never another instruction set or device type. Within a tier the nearer one shares the thread
bucket, then the core count, then the longer common start of the CPU or GPU name (H100 PCIe
is nearer to H100 SXM than to H200); ties go to the name that sorts first, so the choice is
the same on every run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CPU = re.compile(r"^cpu-(?P<cores>\d+)core-(?P<cpu>.+)-(?P<isa>[A-Za-z0-9]+)-(?P<threads>\d+)t$")
_CUDA = re.compile(r"^cuda-(?P<name>.+)-(?P<isa>sm\d+)$")


@dataclass(frozen=True)
class KindParts:
    """What a machine kind says about the machine, as far as a winner depends on it."""

    device: str  # "cpu" or "cuda"
    vendor: str  # "AuthenticAMD", "GenuineIntel", "NVIDIA", ...
    isa: str  # "AVX512", "AVX2", "DEFAULT", "sm90", ...
    threads: int  # the CPU thread bucket; 0 on CUDA
    cores: int  # the CPU's core count; 0 on CUDA
    name: str  # the CPU id or GPU name, for the tie-break


def parse(kind: str) -> KindParts | None:
    """The parts of a machine kind, None for a name of neither form (a table's file stem of
    another op, say)."""
    cpu = _CPU.match(kind)
    if cpu is not None:
        name = cpu["cpu"]
        return KindParts("cpu", name.split("-")[0], cpu["isa"], int(cpu["threads"]),
                         int(cpu["cores"]), name)
    cuda = _CUDA.match(kind)
    if cuda is not None:
        name = cuda["name"]
        return KindParts("cuda", name.split("-")[0], cuda["isa"], 0, 0, name)
    return None


def _common_start(a: str, b: str) -> int:
    """How many leading '-'-separated words two names share."""
    count = 0
    for x, y in zip(a.split("-"), b.split("-"), strict=False):
        if x != y:
            break
        count += 1
    return count


def nearest(kind: str, measured: list[str]) -> str | None:
    """The kind among `measured` whose table best stands in for `kind` (the rule above), or
    None when none shares its device type and instruction set. `kind` itself is never
    returned: this is asked only when it has no usable table."""
    me = parse(kind)
    if me is None:
        return None
    ranked = []
    for other in measured:
        them = parse(other)
        if (other == kind or them is None or them.device != me.device
                or them.isa != me.isa):
            continue
        ranked.append((them.vendor != me.vendor, them.threads != me.threads,
                       them.cores != me.cores, -_common_start(them.name, me.name), other))
    return min(ranked)[-1] if ranked else None
