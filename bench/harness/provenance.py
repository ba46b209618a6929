"""Where a result came from: commit, date, package versions, the machine and its settings.

`collect(device)` returns a flat dict of strings and numbers; `ROW_FIELDS` are the ones
copied into every CSV row, the rest go once into the JSON and the summary.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

import glai_kernels
from glai_kernels.dispatch import cpu_id  # one definition: the gate and the tables key on it

ROOT = Path(__file__).resolve().parents[2]
ROW_FIELDS: tuple[str, ...] = ("commit", "date", "machine", "device_name", "cpu_model",
                               "threads", "torch_version", "triton_version")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def commit() -> str:
    """HEAD's hash, with "-dirty" when tracked files outside reports/ differ from it."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!reports")
    return head + ("-dirty" if dirty else "")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu(device: torch.device) -> dict[str, object]:
    props = torch.cuda.get_device_properties(device)
    info: dict[str, object] = {
        "gpu_name": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "gpu_sm_count": props.multi_processor_count,
        "gpu_capability": f"{props.major}.{props.minor}",
        "cuda_version": torch.version.cuda or "absent",
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    try:
        import pynvml

        from bench.harness.energy import _physical_index

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        h = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
        info["gpu_driver"] = pynvml.nvmlSystemGetDriverVersion()
        for label, clock in (("sm", pynvml.NVML_CLOCK_SM), ("mem", pynvml.NVML_CLOCK_MEM)):
            info[f"gpu_{label}_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, clock)
            info[f"gpu_{label}_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, clock)
        info["gpu_power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1e3
    except Exception as e:  # no nvidia-ml-py, or a query this GPU does not support
        info["gpu_nvml"] = f"unavailable: {e}"
    return info


def machine_label(device: torch.device) -> str:
    """A short name for the machine, e.g. "cpu-2core" or "cuda-NVIDIA-H100-80GB-HBM3"."""
    if device.type == "cuda":
        return "cuda-" + torch.cuda.get_device_name(device).replace(" ", "-")
    return f"cpu-{os.cpu_count()}core"


def load_average() -> float:
    """The 1-minute load average (runnable processes), -1 where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def collect(device: torch.device) -> dict[str, object]:
    """Every provenance field for a run on `device`."""
    info: dict[str, object] = {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_label(device),
        "device": device.type,
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else cpu_model()),
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_average": load_average(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "triton_version": _version("triton"),
        "numpy_version": _version("numpy"),
        "glai_kernels_version": glai_kernels.__version__,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "glai_backend_env": os.environ.get("GLAI_BACKEND", ""),
        # set by bench/harness/onednn_guard.py (or the user): which oneDNN instruction sets ran, why
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "onednn_guard": os.environ.get("GLAI_ONEDNN_GUARD", ""),
        # whether float32 products could use TF32 (`glai-bench run --matmul-precision`)
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if device.type == "cuda":
        info.update(_gpu(device))
    return info
