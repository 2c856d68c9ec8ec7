"""Sweep specifications (``schema``: ``SweepSpec``'s fields; ``spec``: a spec loaded and checked), a trial's config
(``trial``) and the YAML presets beside this module. The spec's names are loaded on first use (PEP 562):
``search_spaces.trial`` alone does not import the engine's config (and torch), so readers of MLflow start fast."""

from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent

__all__ = ["PRESETS_DIR", "LoadedSpec", "SweepSpec", "load_spec", "parse_spec"]


def __getattr__(name: str):
    if name == "SweepSpec":
        from search_spaces.schema import SweepSpec

        return SweepSpec
    if name in __all__:
        from search_spaces import spec

        return getattr(spec, name)
    raise AttributeError(f"module 'search_spaces' has no attribute {name!r}")
