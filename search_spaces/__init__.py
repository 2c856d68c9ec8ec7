"""Sweep specifications (``SweepSpec``) and the YAML presets shipped beside this module."""

from pathlib import Path

from search_spaces.spec import LoadedSpec, SweepSpec, load_spec, parse_spec, resolve_trial_config

PRESETS_DIR = Path(__file__).resolve().parent

__all__ = ["PRESETS_DIR", "LoadedSpec", "SweepSpec", "load_spec", "parse_spec", "resolve_trial_config"]
