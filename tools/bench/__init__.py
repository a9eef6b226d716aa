"""The benchmarks: `python -m tools.bench <name> [options]` from the repository root.

Every figure is a side-by-side comparison in one run on one machine (CONTRIBUTING.md rule 9); the
current numbers, with date, machine, command and method, are in docs/performance.md.
Shared pieces live in `common` (processes, database, CPU, percentiles, machine) and `wire` (the fake
orchestrator and the raw streaming client); nothing here imports `tests`.
"""
