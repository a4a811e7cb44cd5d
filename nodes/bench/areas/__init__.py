"""Per-area benchmark scripts, each ``python main.py bench AREA [options]`` or
``python -m nodes.bench.areas.AREA [options]``: a ``main(argv)`` that prints figures, never asserts."""
