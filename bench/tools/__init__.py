"""CI and GPU-lease tools, which build or test the code rather than measure it.

What belongs here: the CUDA compile check (`check_cuda`) and the check against another torch
release's headers (`check_headers`), both run by CI without a GPU; the script for a short
lease of a GPU machine (`on_gpu.sh`), the pytest plugin that keeps its test run inside the
lease (`lease_plugin`, loaded by the root conftest.py) and what the script prints of its energy
and triton steps' results (`lease_summaries`).
"""
