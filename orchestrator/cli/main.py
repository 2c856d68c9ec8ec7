"""The ``fractune`` command line. Every command that reports results takes ``--json`` (stdout is then one
JSON object, all else goes to stderr). Bad input exits 2 with one line per problem on stderr, naming field, value and what is
allowed; no traceback. Heavy imports (torch, ray, mlflow) happen inside the command that needs them."""

from __future__ import annotations

import contextlib
import gc
import logging
import sys

from engine.errors import FractuneError
from orchestrator.cli.failures import empty_arguments, path_problem, safe_line
from orchestrator.cli.parser import build_parser
from results.output import json_stdout


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = parser._subparsers._group_actions[0].choices[args.command]  # the subcommand's own parser
    import importlib
    import os

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no INFO chatter (table creation) on stderr
    # MLflow's sqlite store logs a database error with its traceback before raising it again: the error itself
    # reaches the user as one line (below); the traceback is noise on stderr
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    problems = empty_arguments(command, args)
    # the engine's kernel switches (engine/numerics/fused.py, engine/numerics/gpu_kernels.py), checked before any work
    for switch, module in (("FRACTUNE_FUSED", "engine.numerics.fused"), ("FRACTUNE_GPU_KERNELS", "engine.numerics.gpu_kernels")):
        if switch in os.environ:
            problem = importlib.import_module(module).environment_problem()
            problems = problems + ([problem] if problem else [])
    if problems:
        for line in problems:
            print(f"fractune {args.command}: error: {safe_line(line)}", file=sys.stderr)
        return 2
    module_name, func_name = args.func.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        with json_stdout() if getattr(args, "json", False) else contextlib.nullcontext():
            return int(func(args) or 0)
    except FractuneError as err:
        for line in err.lines():
            print(f"fractune {args.command}: error: {safe_line(line)}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # a path the system refuses where no check caught it (too long a name, ...)
        problem = path_problem(command, args, err)
        print(f"fractune {args.command}: error: {safe_line(problem.lines()[0])}", file=sys.stderr)
        return problem.exit_code
    except KeyboardInterrupt:
        print(f"fractune {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if not type(err).__module__.startswith("mlflow."):
            raise
        # the tracking store failing after its checks passed (a server that breaks, a store that changes under
        # us): the machine's trouble, one line, exit 1, as a full disk is
        from results.store import one_line_error

        print(f"fractune {args.command}: error: the tracking store failed: {safe_line(one_line_error(err)[:400])}",
              file=sys.stderr)
        return 1


def run() -> int:
    """The ``fractune`` process (its console script, ``python -m orchestrator.cli``): ``main``, then an exit that
    skips the interpreter's last garbage collections. Those walk every object still tracked, which with torch, Ray
    and MLflow imported is most of the cost of ending the process, whose memory the system takes back anyway.
    Frozen objects are still freed as their references go, and atexit handlers (Ray's shutdown, logging's flush,
    temporary folders' clean-up) run as before."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
