"""Spec I/O shared by ``python -m jobs`` and ``python -m train --config`` (torch-free).

One place reads a spec, for both commands:

    read_spec_file   the file: regular files only (checked before any read, never blocking on a
                     FIFO or a device), at most MAX_BYTES, UTF-8 (a bad byte at its line:column)
    load_yaml        the YAML, with positions (:mod:`train.spec.yamlsafe`: rules and limits)
    parse_override   ``--set a.b=c``: the value read with the same YAML rules
    load_source      all three, plus control characters refused anywhere in the data
    where            ``file:line:column`` (or ``--set k=v``) of a field

and :mod:`train.spec.messages` turns a pydantic ValidationError into one line per problem,
``file:line:column: field.path: problem (hint)``. Same file, same overrides: same data, same
lines, whichever command reads it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from train.errors import OverrideError, SpecError
from train.spec.yamlsafe import (
    CONTROL_RE,
    Path_,
    Source,
    decode,
    dotted,
    load_yaml,
    parse_value,
    resolve_plain,
)

__all__ = [
    "MAX_BYTES",
    "Override",
    "apply_overrides",
    "control_characters",
    "dump_spec",
    "load_source",
    "parse_override",
    "read_spec_file",
    "set_path",
    "set_text",
    "where",
]

MAX_BYTES = 1 << 20


# -- the file -----------------------------------------------------------------------------------
def read_spec_file(path: str | Path) -> str:
    """The text of a spec file: a regular file of at most :data:`MAX_BYTES` bytes of UTF-8.

    Opened non-blocking and checked with ``fstat`` before any read, so a FIFO, a device
    (``/dev/zero``), a directory or a socket is refused at once instead of hanging or filling
    memory. Raises :class:`SpecError` (one line).
    """
    name = str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO's other end): not a file
            problem = f"{_kind(name)} (give a YAML file)"
            raise SpecError([f"{name}: cannot read the spec: {problem}"]) from None
        raise SpecError([f"{name}: cannot read the spec: {exc.strerror or exc}"]) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecError([f"{name}: cannot read the spec: {_kind(mode)} (give a YAML file)"])
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise SpecError([f"{name}: cannot read the spec: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise SpecError(
            [f"{name}: the spec is larger than {MAX_BYTES >> 20} MiB (a spec is a few KiB)"]
        )
    return decode(b"".join(chunks), name)


def _kind(what: str | int) -> str:
    if isinstance(what, str):
        try:
            what = os.stat(what).st_mode
        except OSError:
            return "not a regular file"
    for test, text in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(what):
            return f"{text}, not a regular file"
    return "not a regular file"


# -- --set overrides ----------------------------------------------------------------------------
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$", re.ASCII)


@dataclass(frozen=True)
class Override:
    """One parsed ``--set``: where it came from, the field path and the typed value."""

    text: str
    path: tuple[str, ...]
    value: Any

    @property
    def origin(self) -> str:
        return f"--set {self.text}"


def parse_override(text: str) -> Override:
    """Parse ``key.path=value``; the value is YAML (``1`` is an int, ``'1'`` a string)."""
    if CONTROL_RE.search(text):
        raise OverrideError(
            f"--set {text!r}: contains a newline or control character (give one line of text)"
        )
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY_RE.match(key):
        raise OverrideError(f"--set {text}: expected KEY.PATH=VALUE, e.g. train.max_steps=20")
    if not raw.strip():
        raise OverrideError(
            f"--set {text}: empty value (write {key}=null for no value, {key}=\"''\" for empty "
            "text, or leave the --set out for the spec's value)"
        )
    path = tuple(key.split("."))
    value = parse_value(raw, f"--set {text}", path)
    if isinstance(value, dict):
        raise OverrideError(
            f"--set {text}: value is a mapping; set each field on its own (--set {key}.x=...)"
        )
    return Override(text, path, value)


def set_path(
    data: Mapping[str, Any], path: tuple[str, ...], value: Any, origin: str
) -> dict[str, Any]:
    """A copy of ``data`` with ``path`` set to ``value`` (only the dicts on the path are copied)."""
    out = dict(data)
    node = out
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
        elif not isinstance(child, Mapping):
            where = ".".join(path[: i + 1])
            raise OverrideError(
                f"{origin}: {where} is a value, not a section (set {where}=... instead)"
            )
        child = dict(child)
        node[part] = child
        node = child
    node[path[-1]] = value
    return out


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """``data`` with every override applied in order."""
    out = dict(data)
    for ov in overrides:
        out = set_path(out, ov.path, ov.value, ov.origin)
    return out


def load_source(
    text: str, filename: str, overrides: Sequence[str] = ()
) -> tuple[Source, tuple[Override, ...], dict[str, Any]]:
    """The YAML, the parsed ``--set``s and the data with them applied, control characters
    refused. A top level that is not a mapping (an empty file too) is an error."""
    source = load_yaml(text, filename)
    if not isinstance(source.data, dict):
        raise SpecError(
            [
                f"{source.where(())}: (top level): the spec must be a mapping (name:, resources:, "
                "train: ...; see examples/cifar.yaml)"
            ]
        )
    parsed = tuple(parse_override(o) for o in overrides)
    data = apply_overrides(source.data, parsed)
    lines = control_characters(data, source, parsed)
    if lines:
        raise SpecError(lines)
    return source, parsed, data


def where(path: Path_, is_key: bool, source: Source, parsed: Sequence[Override]) -> str:
    """``file:line:column`` of a field (``--set k=v`` when an override set it)."""
    for ov in reversed(parsed):
        if tuple(path[: len(ov.path)]) == ov.path or ov.path[: len(path)] == tuple(path):
            return ov.origin
    if not is_key and path and path not in source.value_marks:
        # A missing field or a cross-field rule: point at the field's key, else its section.
        return source.where(path, key=True)
    return source.where(path, key=is_key)


def control_characters(data: Any, source: Source, parsed: Sequence[Override]) -> list[str]:
    """One line per text value holding a newline or control character (never in a script)."""
    found: list[str] = []
    stack: list[tuple[Any, Path_]] = [(data, ())]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if CONTROL_RE.search(node):
                found.append(
                    f"{where(path, False, source, parsed)}: {dotted(path)}: contains a newline or "
                    "control character (values must be one line of printable text)"
                )
        elif isinstance(node, Mapping | list) and id(node) not in seen:
            seen.add(id(node))  # an alias shares its value: check it once
            items = node.items() if isinstance(node, Mapping) else enumerate(node)
            stack.extend((v, (*path, k)) for k, v in reversed(list(items)))
    return found


# -- writing specs that read back the same -------------------------------------------------------
_TAGS = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}
_DumperBase: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class SpecDumper(_DumperBase):
    """``yaml.safe_dump`` whose quoting follows this loader's rules, not YAML 1.1's.

    The emitter writes a string plain only when the loader resolves that plain text to the same
    string: ``y``, ``0o17``, ``1.0e3`` are quoted (PyYAML's own rules would leave them plain, and
    :func:`load_yaml` would refuse or retype them).
    """

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            if value == "<<":  # a merge key to the loader (refused there): quote it
                return "tag:yaml.org,2002:merge"
            try:
                read = resolve_plain(value)
            except Exception:  # refused when plain: the emitter must quote it
                return "tag:yaml.org,2002:binary"
            return f"tag:yaml.org,2002:{_TAGS.get(type(read), 'str')}"
        return super().resolve(kind, value, implicit)


def dump_spec(data: Mapping[str, Any]) -> str:
    """YAML text of spec data that :func:`load_source` reads back as the same data."""
    text: str = yaml.dump(data, Dumper=SpecDumper, sort_keys=False, default_flow_style=False)
    return text


def set_text(value: Any) -> str:
    """The ``VALUE`` of ``--set key=VALUE`` that :func:`parse_override` reads back as ``value``."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)  # 1e-05 is text to the loader (as in YAML 1.1): write 1.0e-05
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    if isinstance(value, list):
        return "[" + ", ".join(set_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)
