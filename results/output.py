"""Output helpers shared by every CLI command: tables for people, one JSON line for programs."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.metrics import ACCURACY, PERPLEXITY, VAL_ACCURACY, VAL_PERPLEXITY

# what a training's per-epoch line shows
EPOCH_KEYS = ("epoch", "loss", "train_accuracy", VAL_ACCURACY, ACCURACY, VAL_PERPLEXITY, PERPLEXITY,
              "cum_gbitops", "cp", "fw_bits", "bw_bits", "stage", "target_cp", "cp_gated", "wall_seconds")


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


def json_text(obj: Any, **dumps) -> str:
    """Strict JSON of what a command writes for other programs (``--json``, ``--history``, ``pareto.json``,
    ``report.json``): NaN and infinities become null, since JSON has no token for them (Python's ``NaN`` is
    refused by JavaScript's and most other parsers)."""
    return json.dumps(_clean(obj), allow_nan=False, **dumps)


_JSON_OUT: list = []  # under --json: the command's own stdout, which carries the JSON object alone


@contextlib.contextmanager
def json_stdout():
    """A command run with ``--json``: its stdout holds the JSON object alone (``| jq`` reads it whole), and
    the tables and lines meant for people go to stderr meanwhile."""
    _JSON_OUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_OUT.pop()


def emit_json(obj: dict) -> None:
    """A command's result for programs, with --json: one JSON object on one line of stdout (NaN/inf null)."""
    out = _JSON_OUT[-1] if _JSON_OUT else sys.stdout
    sys.stdout.flush()
    print(json_text(obj), file=out, flush=True)


def fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if abs(v) >= 1e6 or (v != 0 and abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if "." in f"{v:.{digits}f}" else f"{v}"
    return str(v)


def epoch_lines(metrics: dict) -> list[str]:
    """A training's line for one epoch, and one per schedule event in it (a stage change, a new cp target)."""
    short = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["epoch " + "  ".join(f"{k}={short(metrics[k])}" for k in EPOCH_KEYS if k in metrics)]
    for ev in metrics.get("events", []):
        what = f"target cp {ev['target_cp']}" if "target_cp" in ev else f"FW{ev['fw_bits']}/BW{ev['bw_bits']}"
        lines.append(f"  {ev['reason']} at iteration {ev['iteration']}: stage {ev['stage']} -> {what}")
    return lines


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


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary name beside it, synced to the disk before the rename: a full, read-only
    or failing disk leaves the previous copy whole, never a cut one (the OSError propagates; the temporary file
    is removed where it can be)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def info(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- output paths, checked before any work starts (nothing is created here) ---------------------------------
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def _writable_folder(folder, field: str, value: str) -> None:
    """``folder`` exists, is a folder and a file can really be created in it (``os.access`` tells root yes on
    read-only and virtual file systems)."""

    from engine.errors import ConfigError

    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise ConfigError.single(field, value, f"its folder {folder} {what}; allowed: a path in an existing, "
                                 "writable folder")
    from results.store_checks import write_probe

    try:
        write_probe(folder)
    except OSError as exc:
        raise ConfigError.single(field, value, f"folder {folder} is not writable ({exc.strerror})") from None


def check_output_file(field: str, value: str, suffixes: tuple[str, ...] | None = None, beside: tuple[str, ...] = ()):
    """The resolved path of an output file: not a folder or special file, in an existing writable folder,
    with one of ``suffixes`` when given; nor is any file the command writes beside it (``beside``: endings of
    its stem, ``_pareto.png`` for ``results.md`` -> ``results_pareto.png``). Nothing is created or changed."""
    from pathlib import Path

    from engine.errors import ConfigError

    p = Path(value).expanduser()
    if suffixes and p.suffix.lower() not in suffixes:
        raise ConfigError.single(field, value, f"allowed: a file name ending in {', '.join(suffixes)}")
    _not_in_the_way(p, field, value, "is")
    for ending in beside:
        _not_in_the_way(p.with_name(p.stem + ending), field, value, f"writes {p.stem + ending} beside it, which is")
    _writable_folder(p.resolve().parent, field, value)
    return p.resolve()


def _not_in_the_way(p, field: str, value: str, what: str) -> None:
    """``p`` is a regular file or nothing: a folder or special file there would fail the write midway."""
    import stat

    from engine.errors import ConfigError

    try:
        st = p.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError.single(field, value, f"allowed: a writable file path ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a special file"
        raise ConfigError.single(field, value, f"{what} {kind}; allowed: a file path")


def check_output_folder(field: str, value: str, files: tuple[str, ...] = ()):
    """The resolved path of an output folder: a writable folder, or a path whose nearest existing ancestor is
    a writable folder (created later, once the work is known good), where none of the ``files`` the command
    writes into it is a folder or special file. Nothing is created here."""
    from pathlib import Path

    from engine.errors import ConfigError

    p = Path(value).expanduser().resolve()
    for name in files:
        _not_in_the_way(p / name, field, value, f"holds {name}, which is")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe != p and not probe.is_dir():
        raise ConfigError.single(field, value, f"{probe} is a file (Not a directory); allowed: a folder path")
    if probe == p and not p.is_dir():
        raise ConfigError.single(field, value, "is a file; allowed: a folder path")
    _writable_folder(probe, field, value)
    return p
