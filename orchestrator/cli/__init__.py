"""The ``fractune`` command line: what it accepts (``parser``), the dispatch (``main``), how failures are told
(``failures``) and the commands it dispatches to."""

from orchestrator.cli.main import main

__all__ = ["main"]
