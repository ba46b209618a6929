"""Every module in this package registers one or more backends when imported.

Adding a backend means adding one file here that calls `glai_kernels.registry.register`;
a module whose optional dependency is missing still registers, reporting why it is
unavailable, so `glai_kernels.backends()` can say so.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
