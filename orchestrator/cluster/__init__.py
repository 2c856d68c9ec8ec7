"""Ray clusters: sweeps submitted as Ray Jobs."""
