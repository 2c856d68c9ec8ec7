"""Sweeps read back from MLflow: the trial rows, fronts, objectives, provenance and ablation analysis.

Below both ``orchestrator`` and ``dashboards``; imports neither. No Ray."""
