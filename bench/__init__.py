"""The benchmark suite: which backend is fastest for each head, how far from the machine's
ceilings, at what memory and energy cost, and whether its answer is right.

    glai-bench [COMMAND] [ARGS]   # or python -m bench; bench/__main__.py lists the commands
    pytest bench/tests            # the suite's own tests and pytest-benchmark cases

Subpackages, by role (each one's __init__ says what belongs there):
  harness/    measures: the cases (`sweeps`), the timed calls (`passes`, `calls`), timers,
              memory, energy, the oracle, the machine's ceilings, the result table, `suite`
              (a whole run, end to end)
  reporting/  turns results into reports: summary.md, plots, the history and its dashboard,
              redrawing and merging finished runs, roofline predictions
  gate/       the regression gate against a committed baseline
  pipeline/   the GLAI pipeline's experiments (the paper's tables)
  studies/    one-off measurements behind decisions recorded in docs/notes/README.md
  tools/      CI and GPU-lease tools: CUDA and header compile checks, the lease script and
              its pytest plugin
  tests/      the suite's own tests
"""
