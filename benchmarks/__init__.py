"""Scripts that print figures (docs/benchmarks.md), each run from the checkout's root as a module:
`.venv/bin/python -m benchmarks.NAME --help`."""
