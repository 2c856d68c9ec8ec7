"""Pydantic validation errors as fractune's ``(field, value, allowed)`` problems (architecture rule 10).

``validation_problems(exc, model, prefix)`` walks each error's location through the config models (discriminated
union tags dropped: ``schedule.static.fw`` -> ``schedule.fw``), names unknown keys with the allowed ones, literal
and bound errors with their allowed values, and leaves every other message as pydantic wrote it. A value no member
of a plain union takes (``fw_min: 3`` or ``auto``; ``options``: a preset or a list) is one problem, not one per
member: the members of the value's own shape (a list's, for a list) speak, their allowed values joined.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

_CONTAINER_TAGS = ("list[", "tuple[", "dict[", "set[")


def validation_problems(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[tuple[str, object, str]]:
    """Turn pydantic errors into ``(field, value, allowed)`` triples."""
    problems, tagged = [], []
    for err in exc.errors(include_url=False):
        loc, holder, tag = _walk(err["loc"], model)
        field = ".".join([prefix] + loc if prefix else loc) or "config"
        value = err.get("input")
        kind = err["type"]
        if kind == "missing":  # pydantic's input is the whole section around the missing key
            value, msg = NOTHING, "required"
        elif kind == "extra_forbidden":
            value = Withheld(value)
            allowed = sorted(getattr(holder, "model_fields", None) or {})
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        elif kind == "literal_error":
            msg = f"allowed: {err['ctx']['expected']}"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = err.get("ctx", {})
            field = f"{field}.{ctx.get('discriminator', 'kind').strip(chr(39))}"
            value = ctx.get("tag", NOTHING)  # no tag: the key is missing (pydantic then names no tags: the members do)
            tags = ctx.get("expected_tags") or ", ".join(repr(t) for t in _tags(holder, loc[-1] if loc else None))
            msg = f"allowed: {tags}"
        elif kind in _TYPES:
            msg = f"allowed: {_TYPES[kind]}" + _null_too(holder, loc)
        elif kind.startswith("greater_than") or kind.startswith("less_than"):
            msg = _bounds_msg(holder, loc) or err["msg"]
        else:
            msg = err["msg"].removeprefix("Value error, ")
            msg = msg[0].lower() + msg[1:] if msg else msg
        if tag is None:
            problems.append((field, value, msg))
        else:
            tagged.append((field, value, msg, tag))
    return problems + _one_per_union(tagged)


class _Nothing:
    def __repr__(self) -> str:
        return "nothing"


NOTHING = _Nothing()  # the value of a required key left out


class Withheld:
    """An unknown key's value in a problem, by its kind only: the key names the problem, and a value put under a
    key fractune does not know (a misplaced password or token) must not reach a terminal or a log."""

    KINDS = {str: "text", int: "a number", float: "a number", bool: "true/false", dict: "a section",
             list: "a list", type(None): "nothing"}

    def __init__(self, value: object):
        self.kind = self.KINDS.get(type(value), type(value).__name__)

    def __repr__(self) -> str:
        return f"{self.kind} (not shown)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Withheld) and other.kind == self.kind

    def __hash__(self) -> int:
        return hash(self.kind)


def _one_per_union(tagged: list[tuple[str, object, str, tuple[str, str]]]) -> list[tuple[str, object, str]]:
    """The errors of a plain union's members (``tag``: the union's field and the member's name) as the problems
    of the members shaped like the value (a list's members for a list), one line per field and value."""
    by_union: dict[str, list] = {}
    for item in tagged:
        by_union.setdefault(item[3][0], []).append(item)
    out: list[tuple[str, object, str]] = []
    for union_field, items in by_union.items():
        whole = [v for f, v, _, _ in items if f == union_field]
        if whole:
            shaped = isinstance(whole[0], list | tuple | dict | set)
            mine = [i for i in items if i[3][1].startswith(_CONTAINER_TAGS) == shaped]
            items = mine or items
        merged: dict[tuple[str, str], tuple[str, object, list[str]]] = {}
        for field, value, msg, _ in items:
            key = (field, repr(value))
            if key not in merged:
                merged[key] = (field, value, [])
            if msg not in merged[key][2]:
                merged[key][2].append(msg)
        for field, value, msgs in merged.values():
            rest = [m.removeprefix("allowed: ") for m in msgs[1:]]
            out.append((field, value, "; or ".join([msgs[0], *rest])))
    return out


# strict types (engine.config.types.Strict): what a value of each kind is written as
_TYPES = {"int_type": "a whole number (not true/false, not text)", "float_type": "a number (not true/false, not text)",
          "bool_type": "true or false", "string_type": "text"}


def _walk(loc: tuple, model: type[BaseModel]) -> tuple[list[str], Any, tuple[str, str] | None]:
    """The location without discriminator tags (``schedule.static.fw`` -> ``schedule.fw``; list indices kept)
    and without a plain union's member name (``options.list[str].1`` -> ``options.1``), the model that holds its
    last field (None when the location leaves the models), and the plain union's field and member, if any."""
    out: list[str] = []
    node: Any = model  # a model, a list of union members (awaiting their tag), or None
    holder: Any = model
    member_next, tag = False, None
    for part in loc:
        if member_next and isinstance(part, str):  # the member of a plain union that raised this error
            member_next, tag = False, (".".join(out), part)
            continue
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
        member_next = not members and _plain_union(fields[part].annotation)
    return out, holder, tag


def _tags(holder: Any, name: str | None) -> list[str]:
    """The ``kind`` of each member of the discriminated union in ``holder``'s field ``name``."""
    field = (getattr(holder, "model_fields", None) or {}).get(name)
    members = _models_in(field.annotation) if field is not None else []
    return [m.model_fields["kind"].default for m in members if "kind" in m.model_fields]


def _null_too(holder: Any, loc: tuple) -> str:
    """``, or null`` where the field at ``loc`` (its last part, in ``holder``) also takes null, most often its
    default (the reference's choice for the model or method); else nothing."""
    field = (getattr(holder, "model_fields", None) or {}).get(loc[-1]) if loc else None
    if field is None or type(None) not in _union_members(field.annotation):
        return ""
    return ", or null (the default)" if field.default is None else ", or null"


def _plain_union(ann: Any) -> bool:
    """A union of two or more non-model members besides None: pydantic names the member in an error's location."""
    return len([a for a in _union_members(ann) if a is not type(None)]) > 1


def _union_members(ann: Any) -> tuple:
    """The members of a union annotation (inside ``Annotated`` too); () for any other annotation."""
    if typing.get_origin(ann) is typing.Annotated:
        return _union_members(typing.get_args(ann)[0])
    return typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else ()


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
