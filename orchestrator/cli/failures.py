"""How a command's failures reach the terminal: one safe line each (``safe_line``), an argument given as '' refused
(``empty_arguments``), and a path the system refuses traced to the argument that gave it (``path_problem``: bad
input, exit 2) or told as the machine's trouble (a full disk, an I/O error: exit 1)."""

from __future__ import annotations

import argparse

from engine.errors import FractuneError


def safe_line(text: str) -> str:
    """One terminal-safe line: credentials in URIs replaced by ***, newlines and control characters escaped
    (a hostile value must not forge extra lines or terminal escapes), and any run of over 300 characters without
    a space cut in the middle (a reason that repeats a hostile value, such as a path thousands of characters long,
    must not flood the terminal; real paths stay whole)."""
    import re

    from engine.errors import cut_middle
    from results.store import redact

    text = " ".join(str(text).splitlines())
    text = redact("".join(c if c.isprintable() else repr(c)[1:-1] for c in text))
    return re.sub(r"\S{301,}", lambda m: cut_middle(m.group(), 300), text)


BAD_PATH_ERRNOS = ("ENAMETOOLONG", "ELOOP", "ENOTDIR", "EISDIR", "ENOENT", "EACCES", "EPERM", "EROFS", "EINVAL",
                   "EEXIST", "ENXIO")  # what a bad path gives; ENOSPC, EIO, ... are the machine's trouble, not input


class SystemTrouble(FractuneError):
    """The machine's trouble rather than bad input (a full disk, an I/O error): one line, exit 1."""

    exit_code = 1


def path_problem(command: argparse.ArgumentParser, args: argparse.Namespace, err: OSError) -> FractuneError:
    """The argument behind a path the system refused (the one whose value, as given or made absolute, the
    refused path is or lies under): bad input naming that field, exit 2, where the error is one a bad path
    gives; otherwise (a full disk, an I/O error, a path of no argument) one line, exit 1."""
    import errno
    import os

    from engine.errors import ConfigError, _short
    from results.store import redact
    from results.store_checks import sqlite_path

    reason = err.strerror or str(err) or type(err).__name__
    if err.filename is None:
        return SystemTrouble(reason)
    name = err.filename if isinstance(err.filename, str) else os.fsdecode(err.filename)
    flags = {a.dest: _arg_name(a) for a in command._actions}
    best = None
    for dest, value in vars(args).items():
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, str) or not v or dest not in flags:
                continue
            store = sqlite_path(v)  # a store's URI: the database file's path
            path = str(store) if store is not None else v[len("file://"):] if v.startswith("file:///") else v
            for given in {path, os.path.abspath(path)}:
                if name == given or name.startswith(given.rstrip(os.sep) + os.sep):
                    if best is None or len(given) > len(best[1]):
                        best = (dest, given, v)
    if best is not None and err.errno in {getattr(errno, e) for e in BAD_PATH_ERRNOS}:
        return ConfigError.single(flags[best[0]], redact(best[2]), f"{reason}; allowed: a path this system accepts")
    where = f"{flags[best[0]]} {_short(redact(best[2]))}: " if best is not None else ""
    return SystemTrouble(f"{where}path {_short(name)}: {reason}")


def empty_arguments(command: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """One error line per argument given as '' (e.g. ``--data-dir "$UNSET"``): never read as "the default"."""
    lines = []
    for a in command._actions:
        value = getattr(args, a.dest, None)
        if a.nargs == 0 or a.dest == "help" or not (value == "" or (isinstance(value, list) and "" in value)):
            continue
        hint = " (leave the flag out for its default)" if a.option_strings and not a.required else ""
        lines.append(f"{_arg_name(a)}: got ''; allowed: a non-empty value{hint}")
    return lines


def _arg_name(action: argparse.Action) -> str:
    """How errors name an argument: its long flag, or a positional's name."""
    return action.option_strings[-1] if action.option_strings else action.dest
