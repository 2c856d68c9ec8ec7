"""The MLflow write side: the driver-side Tune callback that records every trial."""
