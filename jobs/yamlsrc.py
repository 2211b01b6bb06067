"""YAML loading with ``yaml.safe_load`` semantics plus the line/column of every key and value.

Errors in a spec are reported as ``file:line:column: field.path: problem (hint)``; this module
keeps the positions (1-based) so :mod:`jobs.spec` can point at the exact place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from jobs.errors import SpecError

Path_ = tuple[str | int, ...]

# The C parser is several times faster and gives the same nodes and marks; fall back when
# PyYAML was built without libyaml.
_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecLoader(_Base):
    """``yaml.SafeLoader`` without YAML 1.1 base-60 numbers.

    YAML 1.1 reads ``time: 1:00:00`` as the integer 3600 (which Slurm would take as 3600
    minutes); YAML 1.2 dropped that rule, and so do we: such values stay strings.
    """


# PyYAML's int and float patterns minus their base-60 alternatives (same order, same tags).
_INT = re.compile(
    r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$""",
    re.X,
)
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_REPLACE = {"tag:yaml.org,2002:int": _INT, "tag:yaml.org,2002:float": _FLOAT}
SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, _REPLACE.get(tag, rx)) for tag, rx in resolvers]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}


def parse_value(text: str) -> Any:
    """One ``--set`` value, read with the same rules as the spec file."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SpecLoader is a SafeLoader


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


def load_yaml(text: str, filename: str) -> Source:
    """Parse one YAML document like ``yaml.safe_load`` and record node positions.

    Raises :class:`SpecError` (one line, with the position) on a syntax error.
    """
    loader = SpecLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else f"{filename}:1:1"
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise SpecError(
            [f"{where}: yaml: {problem or 'syntax error'} (fix the YAML syntax)"]
        ) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise SpecError([f"{filename}:1:1: yaml: {first} (fix the YAML syntax)"]) from None
    finally:
        loader.dispose()
    values: dict[Path_, tuple[int, int]] = {}
    keys: dict[Path_, tuple[int, int]] = {}
    if node is not None:
        _walk(node, (), values, keys)
    return Source(filename, text, data, values, keys)


def _walk(
    node: yaml.Node,
    path: Path_,
    values: dict[Path_, tuple[int, int]],
    keys: dict[Path_, tuple[int, int]],
) -> None:
    values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            sub = (*path, str(key_node.value))
            keys[sub] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, sub, values, keys)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), values, keys)
