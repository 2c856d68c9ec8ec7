"""The one guarded path for reading YAML that a user hands to fractune: configs, sweep and ablation specs, a
spec's ``base:`` file, ``--set`` values, notes, cost tables, and what the readers load back from a tracking
store (a run's YAML artifacts and its params).

``read_text(path, field)`` reads a regular file only (not a folder, FIFO, device or socket: ``/dev/zero`` or a
pipe would block or never end), at most ``MAX_BYTES``, as strict UTF-8. ``loads(text, field)`` parses with
a ``yaml.SafeLoader`` (no Python tags) that refuses, before anything is built:

- nesting deeper than ``MAX_DEPTH`` (PyYAML's composer recurses: 3,000 levels end in a RecursionError);
- documents whose expanded size (every alias counted as the copy it stands for) exceeds ``MAX_NODES`` (the
  billion-laughs alias bomb: a few hundred bytes that expand to 10^9 nodes) and aliases to their own ancestor
  (a cycle that no validator can walk);
- duplicate keys in one mapping (YAML says they are an error; PyYAML silently keeps the last).

Every refusal is a ``ConfigError`` naming the field (``config``, ``base``, ``--set KEY``...), the file and
where in it, and what is allowed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from engine.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: the largest preset spec is a few KiB (PyYAML reads about 1 MiB in seconds)
MAX_DEPTH = 64  # nested sections and lists; a config needs about 6
MAX_NODES = 200_000  # scalars, lists and mappings after aliases are expanded


def read_text(path: str | Path, field: str = "config", what: str = "YAML file") -> str:
    """The text of a regular, bounded, UTF-8 file; a one-line ``ConfigError`` naming ``field`` otherwise."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise ConfigError.single(field, str(path), f"expected an existing {what} ({exc.strerror})") from None
    except ValueError as exc:  # a NUL byte or an unpaired surrogate (YAML's "\ud800"): no file can have that name
        held = "an unpaired surrogate" if isinstance(exc, UnicodeError) else "a NUL byte"
        raise ConfigError.single(field, str(path), f"expected an existing {what} (the path holds {held})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise ConfigError.single(field, str(path), f"expected a regular {what}, not {kind}")
    if st.st_size > MAX_BYTES:
        raise ConfigError.single(field, str(path), f"file of {st.st_size} bytes; allowed: at most {MAX_BYTES} bytes")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError.single(field, str(path), f"expected a readable {what} ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:  # grew while we looked
        raise ConfigError.single(field, str(path), f"allowed: at most {MAX_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError.single(field, str(path), f"not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                                 f"allowed: a UTF-8 {what}") from None


class _Refused(yaml.YAMLError):
    def __init__(self, problem: str, mark=None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class GuardedLoader(yaml.SafeLoader):
    """SafeLoader with depth, expansion and duplicate-key limits (see the module's docstring)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue
                if key in seen:
                    raise _Refused(f"duplicate key {key!r} (first on line {seen[key].line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _check_expansion(root: Node) -> None:
    """Count the nodes the document expands to (an alias counts as the whole of what it names) without
    expanding it; refuse cycles."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            children = _children(node)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_NODES:
                raise _Refused(f"expands to more than {MAX_NODES} values (aliases counted as copies)",
                               node.start_mark)
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in active:
            raise _Refused("an alias refers to a section that contains it (a cycle)", node.start_mark)
        active.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in active:
                raise _Refused("an alias refers to a section that contains it (a cycle)", child.start_mark)
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def loads(text: str, field: str = "config", where: str | None = "") -> Any:
    """Parse ``text`` with the guarded loader; a one-line ``ConfigError`` naming ``field`` (and ``where``: the
    file's name) on any YAML problem."""
    if len(text) > MAX_BYTES:
        raise ConfigError.single(field, f"{len(text)} characters", f"allowed: at most {MAX_BYTES}")
    loader = None
    try:
        loader = GuardedLoader(text)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f"line {mark.line + 1}" if mark is not None else ""
        label = " ".join(x for x in (where, at) if x) if where else text[:60]
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError.single(field, label, f"malformed YAML ({_one_line(problem)})") from None
    except RecursionError:  # belt and braces: the depth limit comes first
        raise ConfigError.single(field, where or text[:60], f"nesting too deep; allowed: at most {MAX_DEPTH} "
                                 "levels") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_file(path: str | Path, field: str = "config") -> Any:
    """``read_text`` + ``loads``: the document in a user's YAML file, whatever it holds."""
    return loads(read_text(path, field), field, Path(path).name)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
