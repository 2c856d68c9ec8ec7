"""Precision schedules as functions of training progress: static, PFQ and its loss indicator, CPT and its
precision range test, the runner of one iteration, and the preview (docs/methods.md §4, §5)."""
