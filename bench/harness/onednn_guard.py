"""A guard against a crash in the oneDNN that torch 2.13 ships, on CPUs with AMX.

oneDNN's AMX bfloat16 matmul dies of an integer division by zero (SIGFPE, in libtorch_cpu.so)
for some shapes: seen on an Intel Xeon (family 6, model 207) under KVM, first in the heads
sweep's `torch.einsum` peer (B2 at B = 32, bfloat16: the backward's
[32, 49152] @ [49152, 769] with a transposed right operand). A signal kills the process; Python
cannot catch it. oneDNN reads `ONEDNN_MAX_CPU_ISA` once, at its first primitive, so before
anything in a benchmark process calls it, `apply()` runs that product in a child process; if
the child dies of the signal, this process limits oneDNN to AVX512_CORE_BF16 (no AMX) and says
so: torch's bfloat16 matmuls (the peers', the `torch` backend's) then run without AMX in this
run, which its provenance records (`onednn_guard`). Elsewhere (no AMX, the bug fixed, the
variable already set by the user) nothing changes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

ISA_VAR = "ONEDNN_MAX_CPU_ISA"
# the reason, passed to child processes (the gate's fresh-process runs) with the limit itself
REASON_VAR = "GLAI_ONEDNN_GUARD"
LIMIT = "AVX512_CORE_BF16"
KNOWN_CRASH = ("import torch\n"
               "a = torch.ones(1, 32, 49152, dtype=torch.bfloat16)\n"
               "b = torch.ones(1, 768, 49152, dtype=torch.bfloat16)\n"
               "torch.bmm(a, b.transpose(1, 2))\n")


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether /proc/cpuinfo (or `cpuinfo`) lists the amx_bf16 flag."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    return any(line.startswith("flags") and "amx_bf16" in line.split()
               for line in cpuinfo.splitlines())


def crashes(code: str = KNOWN_CRASH, timeout_s: float = 300) -> bool:
    """Whether `code` run by this Python in a child process dies of SIGFPE."""
    env = {k: v for k, v in os.environ.items() if k != ISA_VAR}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          timeout=timeout_s)
    return proc.returncode == -signal.SIGFPE


def apply(has_amx: bool | None = None) -> str | None:
    """Limit oneDNN in this process if its AMX matmul crashes here; the reason, or None when
    nothing was changed. Call it before this process's first bfloat16 matmul."""
    if ISA_VAR in os.environ:
        return os.environ.get(REASON_VAR)  # the user's choice, or a parent's guard
    if not (cpu_has_amx() if has_amx is None else has_amx) or not crashes():
        return None
    reason = (f"oneDNN's AMX bfloat16 matmul crashes (SIGFPE) on this CPU with torch's "
              f"oneDNN; {ISA_VAR}={LIMIT} for this run: torch's bfloat16 matmuls ran "
              "without AMX (bench/harness/onednn_guard.py)")
    os.environ[ISA_VAR], os.environ[REASON_VAR] = LIMIT, reason
    return reason
