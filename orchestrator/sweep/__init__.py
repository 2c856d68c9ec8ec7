"""The sweep driver: Tune and its callbacks, stages, a sweep's lifecycle, run names."""
