"""Every module in this package is one backend, named as the backend, registered on import.

Adding a backend means adding one file here that calls `glai_kernels.registry.register`
(its launchers named `<backend>_forward` / `<backend>_backward`); a module whose optional
dependency is missing still registers, reporting why it is unavailable, so
`glai_kernels.backends()` can say so. Code that is not a backend lives outside this package:
glai_kernels/extension_build.py builds and loads the C++/CUDA library that `cpp` and `cuda`
run, and glai_kernels/extension.py wraps its ops.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
