"""``python -m orchestrator.cli``: the ``fractune`` command."""

import sys

from orchestrator.cli.main import main

sys.exit(main())
