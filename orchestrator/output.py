"""Output helpers shared by every CLI command: tables for people, one JSON line for programs."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _clean(obj.item())
    return obj


def emit_json(obj: dict) -> None:
    """The last stdout line of a command with --json: one JSON object (NaN/inf become null)."""
    sys.stdout.flush()
    print(json.dumps(_clean(obj), sort_keys=False, allow_nan=False), flush=True)


def fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if abs(v) >= 1e6 or (v != 0 and abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if "." in f"{v:.{digits}f}" else f"{v}"
    return str(v)


def table(rows: Sequence[dict], columns: Sequence[str] | None = None, file=None) -> None:
    file = file or sys.stdout
    if not rows:
        print("(no rows)", file=file)
        return
    columns = list(columns or rows[0].keys())
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)), file=file)


def info(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
