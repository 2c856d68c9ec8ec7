"""Run names a person reads in MLflow's run list: what tells one trial of a sweep from the others.

A trial's run name is the values that differ between the sweep's trials, then its seed: ``fw6/bw8 s0``,
``cp1.5 s1``, ``dfq cp3 s2``. ``variation`` reads the sweep's search space (or an ablation's points) once:
the settings (dotted paths, a swept section as its leaves) whose values are not the same in every point. When
the points set the schedule's kind, a setting counts only among the points of one method (a DFQ row's
``target_cp`` is not named because a FracTrain row has none), and the method leads the name where the sweep has
more than one. Everything the trial shares with the others stays out of the name: the full configuration is
in the run's params (the flattened resolved config), its ``config.yaml`` artifact and its ``fractune.point``
tag. A stage of a staged sweep prefixes its name (``retrain-dfq s0``); two trials that still read the same
(values equal at the printed precision) get ``#2``, ``#3``... (``unique_name``).

No Ray and no torch here: the tracker calls ``run_name`` on the driver with the variation it was given.
"""

from __future__ import annotations

import json
from typing import Any

KIND = "schedule.kind"
# The short labels of the settings that tell trials apart ("": the value alone; a text value reads
# label:value); any other setting is named by its own key. "cp" is DFQ's target alone: FracTrain's first-stage
# target and its total read "cp0=" and "cp_total=", so a FracTrain row never reads as a DFQ target.
LABELS = {"epsilon": "eps", "alpha": "a", "target_cp": "cp", "weight_bits": "w", "num_cycles": "cyc",
          "eval_every": "ev", "eval_windows": "ew", "block_floor": "bf", "force_final_at": "ff", "cp0": "cp0=",
          "cp_total": "cp_total=",
          "cp_step": "+", "learning_rate": "lr", "batch_size": "bs", "weight_decay": "wd", "momentum": "mom",
          "epochs": "ep", "model.name": "", "options": "", "execution": "", "mode": "", "controller": "",
          "beta": "beta", "rounding": "", "routed_sample_fraction": "frac", "routed_statistics": "stats",
          "option_state": "state", "routed_estimator": "est", "routed_warmup": "warmup", "num_turning_points": "tp",
          "eval_unit": "unit", "lr_schedule": "", "dataset": "", "head": ""}
PAIRS = (("fw", "bw"), ("fw_min", "fw_max"), ("bw_min", "bw_max"))  # read as one word: fw6/bw8, fw3-8
MAX_WORD = 20  # characters of one value's word: longer ones (a long option list) are cut, ending in "~"
ABSENT = object()


def leaves(path: str, value: Any) -> dict[str, Any]:
    """``{dotted path: value}`` of one swept value: a section as its leaves, anything else as itself."""
    if not isinstance(value, dict):
        return {path: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(leaves(f"{path}.{key}" if path else str(key), sub))
    return out


def _key(value: Any) -> str:
    return "\0absent" if value is ABSENT else json.dumps(value, sort_keys=True, default=str)


def _differing(alternatives: list[dict[str, Any]]) -> list[str]:
    """The leaves that tell the alternatives apart, first seen first: every leaf with two values or more where it
    is set, and of the leaves set in some alternatives only (one value where set: e.g. routed's own settings
    pinned in its rows, beside masked rows without them) those needed to keep apart alternatives that the
    others leave alike."""
    paths = list(dict.fromkeys(p for alt in alternatives for p in alt))
    values = {p: {_key(alt.get(p, ABSENT)) for alt in alternatives} for p in paths}
    chosen = [p for p in paths if len(values[p] - {_key(ABSENT)}) > 1]

    def apart(keys: list[str]) -> int:
        return len({tuple(_key(alt.get(p, ABSENT)) for p in keys) for alt in alternatives})

    whole = apart(paths)
    for p in paths:
        if p not in chosen and len(values[p]) > 1 and apart(chosen) < whole:
            chosen.append(p)
    return [p for p in paths if p in chosen]


def _vary(alternatives: list[dict[str, Any]], out: dict) -> None:
    """Add what differs between ``alternatives`` (flat leaf dicts of one swept parameter, or of whole points)."""
    kinds = list(dict.fromkeys(alt[KIND] for alt in alternatives if KIND in alt))
    if not kinds:
        for p in _differing(alternatives):
            if p not in out["common"]:
                out["common"].append(p)
        return
    if len(kinds) > 1:
        out["kinds"] = True
    for kind in kinds:
        group = [alt for alt in alternatives if alt.get(KIND) == kind]
        named = out["by_kind"].setdefault(str(kind), [])
        named += [p for p in _differing(group) if p != KIND and p not in named]


def variation(loaded) -> dict:
    """What differs between the trials of a sweep (``search_spaces.spec.LoadedSpec``, one stage's, or an
    ablation's): ``{"common": [paths], "by_kind": {method: [paths]}, "kinds": bool}``, plain data (the tracker
    is pickled with Tune's experiment state)."""
    out: dict = {"common": [], "by_kind": {}, "kinds": False}
    points = getattr(loaded, "points", None)
    if points is not None:  # an ablation: its explicit points, one grid
        _vary([{k: v for path, value in p.items() for k, v in leaves(path, value).items()} for p in points], out)
        return out
    for path, param in loaded.spec.parameters.items():
        if param.kind in ("grid", "choice"):
            _vary([leaves(path, v) for v in (param.grid if param.kind == "grid" else param.choice)], out)
        elif path not in out["common"]:  # a range: every trial draws its own value
            out["common"].append(path)
    return out


def _word(label: str, value: Any) -> str:
    text = short_value(value)
    if len(text) > MAX_WORD:
        text = text[:MAX_WORD - 1] + "~"
    if isinstance(value, str):
        return f"{label}:{text}" if label else text
    return f"{label}{text}"


def run_name(point: dict[str, Any], seed: Any, varied: dict, kind: str | None = None, stage: str | None = None
             ) -> str:
    """A trial's run name: its method where the sweep has several, the values ``varied`` names (``variation``),
    the seed; ``kind``: the trial's schedule kind (read from ``point`` when it sets one); ``stage``: a staged
    sweep's stage, as a prefix. Pure: the tracker makes it unique within the sweep."""
    flat = {k: v for path, value in point.items() for k, v in leaves(path, value).items()}
    kind = str(flat.get(KIND, kind or "trial"))
    named = set(varied.get("common", [])) | set(varied.get("by_kind", {}).get(kind, []))
    chosen = [p for p in flat if p in named or _partner(p, flat, named)]
    words = [kind] if varied.get("kinds") else []
    done: set[str] = set()
    for path in chosen:
        if path in done or path == KIND:
            continue
        head, _, key = path.rpartition(".")
        pair = next(((a, b) for a, b in PAIRS if key == a and _join(head, b) in flat), None)
        if pair:  # fw/bw (and min/max) read as one: fw6/bw8, fw3-8
            a, b = pair
            other = flat[_join(head, b)]
            done.add(_join(head, b))
            if a.endswith("_min"):
                words.append(a[:-4] + (short_value(flat[path]) if flat[path] == other
                                       else f"{short_value(flat[path])}-{short_value(other)}"))
            else:
                words.append(f"{_word(a, flat[path])}/{_word(b, other)}")
            continue
        if any(key == b and _join(head, a) in flat for a, b in PAIRS):
            continue  # the second of a pair: written with its first
        label = LABELS.get(path, LABELS.get(key, key))
        if label == "+":  # FracTrain's cp step joins its start: cp0=1.5+0.5
            if words and words[-1].startswith("cp"):
                words[-1] += f"+{short_value(flat[path])}"
            else:
                words.append(f"cpstep{short_value(flat[path])}")
            continue
        words.append(_word(label, flat[path]))
    if not words:  # nothing differs but the seed: the method says what the runs are
        words = [kind]
    if seed is not None:
        words.append(f"s{seed}")
    name = " ".join(w for w in words if w)
    return f"{stage}-{name}" if stage else name


def _join(head: str, key: str) -> str:
    return f"{head}.{key}" if head else key


def _partner(path: str, flat: dict, named: set[str]) -> bool:
    """``path`` is one of a pair (fw/bw, fw_min/fw_max...) whose other member is named: both are written."""
    head, _, key = path.rpartition(".")
    for a, b in PAIRS:
        if key == a and _join(head, b) in named:
            return True
        if key == b and _join(head, a) in named:
            return True
    return False


def short_value(value: Any) -> str:
    """A value as a run name shows it: booleans on/off, floats to 3 significant digits, lists joined by -."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list | tuple):
        return "-".join(short_value(v) for v in value)
    return str(value)


def unique_name(name: str, taken: set[str] | list[str]) -> str:
    """``name``, or ``name #2``, ``name #3``... when a run of the sweep already has it."""
    if name not in taken:
        return name
    n = 2
    while f"{name} #{n}" in taken:
        n += 1
    return f"{name} #{n}"


def every_value(point: dict[str, Any]) -> dict:
    """A variation naming every value of ``point`` and its method: the name of a trial whose tracker was pickled
    before it knew the sweep's variation."""
    return {"common": list({k for path, value in point.items() for k in leaves(path, value)}), "by_kind": {},
            "kinds": True}
