"""``--set a.b=c`` overrides: parsed as one YAML scalar (or flow list), typed by the spec model.

Values with newlines or control characters are rejected here; everything that reaches a script
is quoted later (:mod:`jobs.render`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from jobs.errors import OverrideError
from jobs.yamlsrc import parse_value

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
# Any C0 control character (newline and tab included) or DEL.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


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
    try:
        value = parse_value(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise OverrideError(f"--set {text}: value: {problem} (quote it: key='value')") from None
    if isinstance(value, dict):
        raise OverrideError(
            f"--set {text}: value is a mapping; set each field on its own (--set {key}.x=...)"
        )
    return Override(text, tuple(key.split(".")), value)


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
