"""YAML for specs: one document, the YAML 1.2 core schema, the position of every key and value.

A spec means what a reader of the file sees, or it is refused (one line, with its position):

- Plain scalars: ``true``/``false``, ``null``/``~``, decimal integers, floats with a dot
  (``0.1``, ``1.0e-3``); ``1:00:00``, ``2024-01-01`` and ``1e-3`` stay text (as in YAML 1.2).
  Quoted scalars are always text, keys are always text.
- Refused, with a hint to write the number or quote the text: what YAML 1.1 reads differently
  (``010``, ``0o17``, ``0x1f``, ``1_000``, ``yes``/``no``/``on``/``off``/``y``/``n``), integers
  of more than :data:`MAX_INT_DIGITS` digits and floats that overflow.
- Refused: duplicate keys (both positions named), merge keys (``<<``), tags other than
  ``!!str``/``!!map``/``!!seq``, non-text keys, keys with control characters, plain keys YAML
  reads as booleans (``yes:``, ``On:``, ``true:``; quoted they are text), more than one
  document, nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_NODES` values once
  aliases are expanded (a billion laughs stops after a few thousand), an alias to an anchor
  that is not closed yet (a recursive alias), characters YAML forbids (NUL, ...), C1 controls
  and Unicode line breaks (U+0085, U+2028, U+2029) anywhere, escaped ones included.

Events come from libyaml's parser (a state machine: no recursion, however deep the input) and
are assembled here without recursion either; nothing is ever expanded past the limits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from train.errors import OverrideError, SpecError

__all__ = [
    "CONTROL_RE",
    "MAX_DEPTH",
    "MAX_NODES",
    "Path_",
    "Source",
    "check_characters",
    "decode",
    "dotted",
    "load_yaml",
    "parse_value",
    "resolve_plain",
]

MAX_DEPTH = 32
MAX_NODES = 20_000
MAX_INT_DIGITS = 18

Path_ = tuple[str | int, ...]

# Any C0 or C1 control character (newline, tab and NEL U+0085 included), DEL, and the Unicode
# line and paragraph separators (U+2028, U+2029; some readers break lines there): never inside
# a value or key.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Characters YAML does not allow in a stream at all (tab, LF, CR are allowed), and the Unicode
# line breaks (NEL U+0085, U+2028, U+2029): YAML 1.1 breaks lines there, YAML 1.2 does not, so
# a spec holding one means different things to different readers (and positions shift).
_NOT_YAML = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]"
)
_LINE_BREAKS = "\x85\u2028\u2029"
_NOT_YAML_ASCII = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_YAML11_BOOL = re.compile(r"^(?:y|n|yes|no|on|off)$", re.IGNORECASE | re.ASCII)
_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$", re.ASCII)
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$", re.ASCII)
_PREFIXED = re.compile(r"^[-+]?0(?:[oO][0-7_]+|[xX][0-9a-fA-F_]+|[bB][01_]+)$", re.ASCII)
_UNDERSCORE = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$", re.ASCII
)
_FLOAT = re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$", re.ASCII)
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")
_STR_TAGS = (None, "!", "tag:yaml.org,2002:str")

# The C parser gives the same events and marks several times faster; the Python one otherwise.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Source:
    """A loaded YAML document: the data, the text it came from and where each field is."""

    filename: str
    text: str
    data: Any
    value_marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Path_, *, key: bool = False) -> str:
        """``file:line:column`` of ``path`` (its key with ``key=True``) or of its nearest parent."""
        marks = self.key_marks if key else self.value_marks
        probe = tuple(path)
        while probe:
            if probe in marks:
                line, col = marks[probe]
                return f"{self.filename}:{line}:{col}"
            # An unknown key's parent mapping is the best place to point at otherwise.
            if not key and probe in self.key_marks:
                line, col = self.key_marks[probe]
                return f"{self.filename}:{line}:{col}"
            probe = probe[:-1]
        line, col = marks.get((), (1, 1))
        return f"{self.filename}:{line}:{col}"


def dotted(path: Iterable[str | int]) -> str:
    """``train.optimizer.lr``, ``launch.srun_args[0]``: a field path as the user writes it."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def decode(data: bytes, filename: str) -> str:
    """UTF-8 text; a bad byte or a character YAML forbids (NUL...) is reported where it is."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        col = len(data[line_start : exc.start].decode("utf-8", "replace")) + 1
        byte = data[exc.start]
        raise SpecError(
            [f"{filename}:{line}:{col}: not UTF-8: byte 0x{byte:02x} (save the file as UTF-8)"]
        ) from None
    check_characters(text, filename)
    return text


def check_characters(text: str, filename: str) -> None:
    """Refuse a character YAML does not allow (NUL, other controls) at its line and column."""
    # The full class is ten times slower to scan; most specs are ASCII.
    bad = (_NOT_YAML_ASCII if text.isascii() else _NOT_YAML).search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        col = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        code = f"U+{ord(bad.group()):04X}"
        if bad.group() in _LINE_BREAKS:
            raise SpecError(
                [
                    f"{filename}:{line}:{col}: Unicode line break {code} is not allowed in a spec "
                    "(end lines with a plain newline; keep values on one line)"
                ]
            )
        what = "a NUL byte" if bad.group() == "\x00" else f"control character {code}"
        raise SpecError([f"{filename}:{line}:{col}: {what} is not allowed in YAML (remove it)"])


# -- YAML ---------------------------------------------------------------------------------------
class _Refused(Exception):
    """A scalar or structure refused by the rules above (problem and hint, one line)."""


def resolve_plain(text: str) -> Any:
    """The value of a plain (unquoted) scalar under the rules in the module docstring."""
    if _NULL.match(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _YAML11_BOOL.match(text):
        raise _Refused(
            f"ambiguous value {text} (YAML 1.1 reads it as a boolean): write true or false, "
            f"or quote it: '{text}'"
        )
    if _INT.match(text):
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            raise _Refused(f"number too large: {text[:24]}... (at most {MAX_INT_DIGITS} digits)")
        return int(text)
    if _LEADING_ZERO.match(text) and "_" not in text:
        decimal = text.lstrip("+-").lstrip("0") or "0"
        raise _Refused(
            f"ambiguous number {text} (YAML 1.1 reads a leading 0 as octal): write {decimal}, "
            f"or quote it: '{text}'"
        )
    if _PREFIXED.match(text):
        raise _Refused(
            f"ambiguous number {text} (YAML 1.1 and 1.2 read 0x/0o/0b numbers differently): "
            f"write it in decimal, or quote it: '{text}'"
        )
    if "_" in text and _UNDERSCORE.match(text):
        raise _Refused(
            f"ambiguous number {text} (YAML 1.1 drops the _, YAML 1.2 reads text): write "
            f"{text.replace('_', '')}, or quote it: '{text}'"
        )
    if _FLOAT.match(text):
        value = float(text)
        if math.isinf(value):
            raise _Refused(f"number out of range: {text[:24]} (write a smaller number)")
        return value
    if _INF.match(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.match(text):
        return math.nan
    return text


class _Frame:
    __slots__ = ("anchor", "container", "key", "path", "seen", "size")

    def __init__(self, container: Any, path: Path_, anchor: str | None) -> None:
        self.container = container
        self.path = path
        self.anchor = anchor
        self.key: str | None = None
        self.seen: dict[str, tuple[int, int]] = {}
        self.size = 1


def _tag(tag: str | None) -> str:
    return str(tag).replace("tag:yaml.org,2002:", "!!")


def _pos(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


class _Builder:
    """Data and positions from a YAML event stream, with the limits of the module docstring."""

    def __init__(self, label: str, base: Path_ = ()) -> None:
        self.label = label
        self.base = base
        self.values: dict[Path_, tuple[int, int]] = {}
        self.keys: dict[Path_, tuple[int, int]] = {}
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.nodes = 0

    def fail(self, mark: Any, path: Path_, problem: str) -> SpecError:
        line, col = _pos(mark)
        where = f"{self.label}:{line}:{col}" if not self.label.startswith("--set") else self.label
        full = (*self.base, *path)
        name = dotted(full) if len(full) <= 8 else dotted(full[:8]) + "..."
        return SpecError([f"{where}: {name or '(top level)'}: {problem}"])

    def build(self, events: Iterator[yaml.Event]) -> Any:
        stack: list[_Frame] = []
        root: Any = None
        documents = 0
        for ev in events:
            if isinstance(ev, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self.fail(ev.start_mark, (), "more than one YAML document (keep one)")
            if not isinstance(ev, yaml.NodeEvent | yaml.CollectionEndEvent):
                continue
            top = stack[-1] if stack else None
            if isinstance(ev, yaml.CollectionEndEvent):
                frame = stack.pop()
                if frame.anchor is not None:
                    self.anchors[frame.anchor] = (frame.container, frame.size)
                root = self._attach(stack, frame.container, frame.size, root)
                continue
            if top is not None and isinstance(top.container, dict) and top.key is None:
                self._key(ev, top)
                continue
            path = self._child_path(top)
            self.values[path] = _pos(ev.start_mark)
            self.nodes += 1
            if isinstance(ev, yaml.AliasEvent):
                value, size = self._alias(ev, path)
            elif isinstance(ev, yaml.ScalarEvent):
                value, size = self._scalar(ev, path), 1
                if ev.anchor is not None:
                    self.anchors[ev.anchor] = (value, 1)
            else:
                is_map = isinstance(ev, yaml.MappingStartEvent)
                allowed = (None, "!", f"tag:yaml.org,2002:{'map' if is_map else 'seq'}")
                tag = getattr(ev, "tag", None)
                if tag not in allowed:
                    problem = f"tag {_tag(tag)} is not allowed (remove it)"
                    raise self.fail(ev.start_mark, path, problem)
                if len(stack) >= MAX_DEPTH:
                    raise self.fail(
                        ev.start_mark, path, f"nested deeper than {MAX_DEPTH} levels (flatten it)"
                    )
                stack.append(_Frame({} if is_map else [], path, ev.anchor))
                self._count(ev.start_mark, path)
                continue
            self._count(ev.start_mark, path)
            root = self._attach(stack, value, size, root)
        return root

    def _count(self, mark: Any, path: Path_) -> None:
        if self.nodes > MAX_NODES:
            raise self.fail(
                mark,
                path,
                f"more than {MAX_NODES} values once aliases are expanded (write it out smaller)",
            )

    def _child_path(self, top: _Frame | None) -> Path_:
        if top is None:
            return ()
        if isinstance(top.container, dict):
            assert top.key is not None
            return (*top.path, top.key)
        return (*top.path, len(top.container))

    def _key(self, ev: yaml.Event, top: _Frame) -> None:
        if not isinstance(ev, yaml.ScalarEvent) or ev.tag not in _STR_TAGS:
            raise self.fail(ev.start_mark, top.path, "a key must be plain text (write name: value)")
        key = ev.value
        if key == "<<" and not ev.style:
            raise self.fail(
                ev.start_mark, top.path, "merge keys (<<) are not supported (write the fields out)"
            )
        if not ev.style and (key in _BOOL or _YAML11_BOOL.match(key)):
            raise self.fail(
                ev.start_mark,
                (*top.path, key),
                f"ambiguous key {key} (YAML 1.1 reads it as a boolean, not as text): "
                f"quote it: '{key}'",
            )
        if CONTROL_RE.search(key):
            raise self.fail(
                ev.start_mark,
                top.path,
                f"key {key!r} contains a newline or control character (keys are one word)",
            )
        pos = _pos(ev.start_mark)
        if key in top.seen:
            first = top.seen[key]
            raise self.fail(
                ev.start_mark,
                (*top.path, key),
                f"duplicate key (also at line {first[0]}, column {first[1]}; keep one)",
            )
        top.seen[key] = pos
        top.key = key
        key_path = (*top.path, key)
        self.keys[key_path] = pos

    def _alias(self, ev: yaml.AliasEvent, path: Path_) -> tuple[Any, int]:
        if ev.anchor not in self.anchors:
            raise self.fail(
                ev.start_mark,
                path,
                f"alias *{ev.anchor} names no anchor defined before it (or refers to itself)",
            )
        value, size = self.anchors[ev.anchor]
        self.nodes += size - 1
        return value, size

    def _scalar(self, ev: yaml.ScalarEvent, path: Path_) -> Any:
        if ev.tag not in _STR_TAGS:
            raise self.fail(ev.start_mark, path, f"tag {_tag(ev.tag)} is not allowed (remove it)")
        if ev.style or ev.tag is not None or not ev.implicit[0]:  # quoted, block or !!str
            return ev.value
        try:
            return resolve_plain(ev.value)
        except _Refused as exc:
            raise self.fail(ev.start_mark, path, str(exc)) from None

    def _attach(self, stack: list[_Frame], value: Any, size: int, root: Any) -> Any:
        if not stack:
            return value
        top = stack[-1]
        if isinstance(top.container, dict):
            assert top.key is not None
            top.container[top.key] = value
            top.key = None
        else:
            top.container.append(value)
        top.size += size
        return root


def _events(text: str) -> Iterator[yaml.Event]:
    loader = _Loader(text)
    try:
        while loader.check_event():
            yield loader.get_event()
    finally:
        loader.dispose()


def _syntax(exc: yaml.YAMLError, label: str) -> SpecError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line, col = _pos(mark)
        where = f"{label}:{line}:{col}" if not label.startswith("--set") else label
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "syntax error"
    else:
        where = f"{label}:1:1" if not label.startswith("--set") else label
        problem = (str(exc).splitlines() or ["syntax error"])[0]
    return SpecError([f"{where}: yaml: {problem} (fix the YAML syntax)"])


def load_yaml(text: str, filename: str) -> Source:
    """Parse one YAML document under the rules above and record where each key and value is.

    Raises :class:`SpecError` (one line, with the position) on a syntax error or a refused value.
    """
    check_characters(text, filename)
    builder = _Builder(filename)
    try:
        data = builder.build(_events(text))
    except yaml.YAMLError as exc:
        raise _syntax(exc, filename) from None
    return Source(filename, text, data, builder.values, builder.keys)


def parse_value(text: str, origin: str, path: tuple[str, ...] = ()) -> Any:
    """One ``--set`` value, read with the same rules as the spec file."""
    builder = _Builder(origin, path)
    try:
        return builder.build(_events(text))
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise OverrideError(f"{origin}: value: {problem} (quote it: key='value')") from None
    except SpecError as exc:
        raise OverrideError(str(exc)) from None
