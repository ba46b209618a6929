"""The benchmark suite's own tests and its pytest-benchmark cases: `pytest bench/tests`."""
