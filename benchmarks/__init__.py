"""The django-redlock benchmark; ``benchmarks/bench.py`` is its entry point."""
