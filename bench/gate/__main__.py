"""`python -m bench.gate check|accept|measure`: see bench/gate/__init__.py."""

from bench.gate.cli import main

raise SystemExit(main())
