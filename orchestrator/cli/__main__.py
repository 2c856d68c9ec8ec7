"""``python -m orchestrator.cli``: the ``fractune`` command."""

import sys

from orchestrator.cli.main import run

sys.exit(run())
