"""The cells and tables of the generated markdown pages (`fractune results`, `fractune compare`)."""

from __future__ import annotations

import math


def fmt(v, spec: str = ".4f") -> str:
    """A figure as a cell: ``n/a`` for none or a non-finite float."""
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def pct(v) -> str:
    """A fraction as a signed percentage cell (0.125 -> +12.5%)."""
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:+.1f}%"


def upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]  # "accuracy" -> "Accuracy"; "BLEU" stays BLEU


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table without the columns that are empty (``n/a`` or ``-``) in every row: a sweep without an
    FP32 row has no "vs FP32" column, one without gated methods no gated cp."""
    empty = {"n/a", "-", "n/a / n/a", ""}
    keep = [i for i in range(len(header)) if i == 0 or any(r[i] not in empty for r in rows)]
    pick = lambda cells: [cells[i] for i in keep]  # noqa: E731
    return ["| " + " | ".join(pick(header)) + " |", "|" + " --- |" * len(keep)] + \
        ["| " + " | ".join(pick(r)) + " |" for r in rows]

