"""`python -m glai_kernels`: print every backend's availability and the auto choice, for the
dense op and the sparse kept-path op."""

import torch

import glai_kernels
from glai_kernels import registry, sparse
from glai_kernels.glai.prune import SPARSE_CROSSOVER


def _report(title: str, reg: registry.Registry, device_types: list[str]) -> None:
    print(title)
    for status in reg.statuses():
        print(" ", status)
    for device_type in device_types:
        for dtype in glai_kernels.SUPPORTED_DTYPES:
            try:
                chosen = reg.pick_auto(device_type, dtype).name
            except RuntimeError as error:
                chosen = f"none ({error})"
            print(f"  auto on {device_type} {str(dtype).removeprefix('torch.')}: {chosen}")


def main() -> None:
    print(f"glai-kernels {glai_kernels.__version__}, torch {torch.__version__}")
    device_types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    _report("dense estimator (glai_kernels.estimator):", registry.ESTIMATOR, device_types)
    _report("sparse kept-path estimator (glai_kernels.sparse.estimator):",
            sparse.SPARSE_ESTIMATOR, device_types)
    print("  pruned heads take the sparse layout at a kept fraction of at most: "
          + ", ".join(f"{d} {f:.0%}" for d, f in SPARSE_CROSSOVER.items())
          + " (other devices: dense); glai_kernels.glai.prune(layout=...) forces either")


if __name__ == "__main__":
    main()
