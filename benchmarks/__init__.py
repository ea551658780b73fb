"""Speed and memory benchmarks with their own runner: ``python -m benchmarks.run [NAME]``.

Not part of the test suite; see ``docs/benchmarks.md`` for the figures and how they were taken.
"""
