"""Every module in this package registers one sparse backend in `SPARSE_ESTIMATOR` when
imported (glai_kernels/sparse/registry.py states the signatures); adding a backend means
adding one file here. A module whose optional dependency is missing still registers,
reporting why it is unavailable."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
