"""Benchmark scenarios: each module has ``run(setup) -> list[Row]``."""
