"""Measurements of vfkit (speed, learning, the race against TRL); results in RESULTS.md.

A package so that `python -m benchmarks.race.run` and the race's tests (collected by
`make test`) import it from the repository root.
"""
