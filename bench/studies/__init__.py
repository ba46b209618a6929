"""One-off measurements: each answers one question whose answer is recorded in
docs/notes/README.md or a backend's docstring (which kernel layout, which candidate, where the
sparse layout starts to win, whether a CPU target is met), and stays runnable so the answer
can be checked again on another machine.

Each is a `glai-bench` command (bench/__main__.py lists them) and runs as
`python -m bench.studies.NAME` too. Timings go through bench/harness/timing.py. What
belongs here: measurements the suite's run does not repeat; what does not: anything a run,
the gate or a report imports.
"""
