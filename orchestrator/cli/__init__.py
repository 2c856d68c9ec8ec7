"""The ``fractune`` command line: the parser (``main``) and the commands it dispatches to."""

from orchestrator.cli.main import main

__all__ = ["main"]
