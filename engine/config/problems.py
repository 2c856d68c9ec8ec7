"""Pydantic validation errors as fractune's ``(field, value, allowed)`` problems (architecture rule 10).

``validation_problems(exc, model, prefix)`` walks each error's location through the config models (discriminated
union tags dropped: ``schedule.static.fw`` -> ``schedule.fw``), names unknown keys with the allowed ones, literal
and bound errors with their allowed values, and leaves every other message as pydantic wrote it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


def validation_problems(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[tuple[str, object, str]]:
    """Turn pydantic errors into ``(field, value, allowed)`` triples."""
    problems = []
    for err in exc.errors(include_url=False):
        loc, holder = _walk(err["loc"], model)
        field = ".".join([prefix] + loc if prefix else loc) or "config"
        value = err.get("input")
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = sorted(getattr(holder, "model_fields", None) or {})
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        elif kind == "literal_error":
            msg = f"allowed: {err['ctx']['expected']}"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = err.get("ctx", {})
            field = f"{field}.{ctx.get('discriminator', 'kind').strip(chr(39))}"
            value = ctx.get("tag")
            msg = f"allowed: {ctx.get('expected_tags', '')}"
        elif kind in _TYPES:
            msg = f"allowed: {_TYPES[kind]}"
        elif kind.startswith("greater_than") or kind.startswith("less_than"):
            msg = _bounds_msg(holder, loc) or err["msg"]
        else:
            msg = err["msg"].removeprefix("Value error, ")
            msg = msg[0].lower() + msg[1:] if msg else msg
        problems.append((field, value, msg))
    return problems


# strict types (engine.config.types.Strict): what a value of each kind is written as
_TYPES = {"int_type": "a whole number (not true/false, not text)", "float_type": "a number (not true/false, not text)",
          "bool_type": "true or false", "string_type": "text"}


def _walk(loc: tuple, model: type[BaseModel]) -> tuple[list[str], Any]:
    """The location without discriminator tags (``schedule.static.fw`` -> ``schedule.fw``; list indices kept)
    and the model that holds its last field (None when the location leaves the models)."""
    out: list[str] = []
    node: Any = model  # a model, a list of union members (awaiting their tag), or None
    holder: Any = model
    for part in loc:
        if isinstance(part, int) or node is None:
            out.append(str(part))
            continue
        if isinstance(node, list):  # a discriminated union: this part is the member's tag
            tagged = [m for m in node if getattr(m.model_fields.get("kind"), "default", None) == part]
            if tagged:
                node = tagged[0]
                continue
            node = node[0] if len(node) == 1 else None
            if node is None:
                out.append(str(part))
                continue
        fields = getattr(node, "model_fields", None) or {}
        out.append(str(part))
        holder = node
        if part not in fields:
            node = None
            continue
        members = _models_in(fields[part].annotation)
        node = members[0] if len(members) == 1 else (members or None)
    return out, holder


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (one, or the members of a union)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for arg in getattr(ann, "__args__", ()) or ():
        out += [m for m in _models_in(arg) if m not in out]
    return out


def _bounds_msg(holder: Any, loc: list[str]) -> str | None:
    """The bounds of the field at ``loc``, or of its items (``seeds.1``: a ``list[Seed]``'s bounds)."""
    fields = getattr(holder, "model_fields", {})
    name = next((p for p in reversed(loc) if not p.isdigit()), None)
    info = fields.get(name) if name else None
    if info is None:
        return None
    metadata = list(info.metadata) if name == loc[-1] else \
        [m for arg in getattr(info.annotation, "__args__", ()) for m in getattr(arg, "__metadata__", ())]
    lo = hi = None
    for meta in metadata:
        for attr in ("ge", "gt"):
            if getattr(meta, attr, None) is not None:
                lo = f"{'>=' if attr == 'ge' else '>'} {getattr(meta, attr)}"
        for attr in ("le", "lt"):
            if getattr(meta, attr, None) is not None:
                hi = f"{'<=' if attr == 'le' else '<'} {getattr(meta, attr)}"
    parts = [p for p in (lo, hi) if p]
    return f"allowed: {' and '.join(parts)}" if parts else None
