"""`python -m glai_kernels`: print every backend's availability and the auto choice."""

import torch

import glai_kernels
from glai_kernels import registry


def main() -> None:
    print(f"glai-kernels {glai_kernels.__version__}, torch {torch.__version__}")
    for status in glai_kernels.backends():
        print(" ", status)
    device_types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device_type in device_types:
        for dtype in glai_kernels.SUPPORTED_DTYPES:
            chosen = registry.pick_auto(device_type, dtype).name
            print(f"  auto on {device_type} {str(dtype).removeprefix('torch.')}: {chosen}")


if __name__ == "__main__":
    main()
