"""One exception hierarchy for the whole project (architecture rule 10).

Every error a user can cause is a ``FractuneError``; the CLI prints ``str(err)`` as one line per
problem and exits 2. Messages name the field, the value and what is allowed.
"""

from __future__ import annotations


class FractuneError(Exception):
    """Base class of every error fractune raises on purpose."""

    exit_code = 2

    def lines(self) -> list[str]:
        return [str(self)]


class ConfigError(FractuneError):
    """One or more invalid settings. ``problems`` holds one ``(field, value, allowed)`` per error."""

    def __init__(self, problems: list[tuple[str, object, str]], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        super().__init__("; ".join(self.lines()))

    @classmethod
    def single(cls, field: str, value: object, allowed: str, source: str | None = None) -> ConfigError:
        return cls([(field, value, allowed)], source)

    @classmethod
    def check_all(cls, *checks) -> None:
        """Run every check (a callable taking no argument) and raise one error with all their problems, so a
        command reports every bad input at once; a problem two checks find alike (one bad value given twice) is
        printed once."""
        problems: list[tuple[str, object, str]] = []
        printed: set[tuple[str, str, str]] = set()
        for check in checks:
            try:
                check()
            except ConfigError as err:
                for field, value, allowed in err.problems:
                    if (line := (field, _short(value), allowed)) not in printed:
                        printed.add(line)
                        problems.append((field, value, allowed))
        if problems:
            raise cls(problems)

    def lines(self) -> list[str]:
        prefix = f"{self.source}: " if self.source else ""
        return [f"{prefix}{field}: got {_short(value)}; {allowed}" for field, value, allowed in self.problems]


class DataError(FractuneError):
    """A data set cannot be read (missing files, wrong folder)."""


class CheckpointError(FractuneError):
    """A checkpoint is missing, unreadable or from an incompatible run."""


class TrainingDiverged(FractuneError):
    """The training loss became NaN or infinite."""

    exit_code = 1


def _short(value: object, limit: int = 120) -> str:
    """The value as the user gave it, cut in the middle when long: a path keeps its file name."""
    return cut_middle(repr(value), limit)


def cut_middle(text: str, limit: int = 120) -> str:
    """``text`` cut in the middle to ``limit`` characters when longer."""
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[len(text) - (limit - 3 - head):]
