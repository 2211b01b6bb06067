"""What jobs writes for train reads back as the same values: the resolved spec files
(train.spec.load.dump_spec) and the --set values of the sbatch templates
(train.spec.load.set_text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.load import load_text
from jobs.submit import _resolved_text
from train.spec.config import load_run_config
from train.spec.load import dump_spec, load_source, parse_override, set_text

# Text a spec may hold: no control characters or line separators (refused by the loader), no
# lone surrogates.
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=12)
TRICKY = "y n yes On 0o17 0x1f 010 1_000 1:00 1e3 1.0e3 .inf ~ null true - #c ' \" [x] &a *a <<"
# a key hypothesis found: `<<` written plain is a merge key to the loader
MERGE_KEY = {"<<": None, "a": {"<<": "<<"}}
SCALARS = (
    TEXT
    | st.sampled_from([*TRICKY.split(), "", " x", "x ", "- a", "a: b"])
    | st.integers(-(10**18) + 1, 10**18 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(TEXT, VALUES, max_size=5))
def test_dumped_specs_read_back_the_same(data: dict[str, Any]) -> None:
    _, _, back = load_source(dump_spec(data), "resolved.yaml")
    assert back == data


def test_a_merge_key_lookalike_reads_back_the_same() -> None:
    assert load_source(dump_spec(MERGE_KEY), "resolved.yaml")[2] == MERGE_KEY


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(SCALARS | st.lists(SCALARS, max_size=4))
def test_set_values_read_back_the_same(value: Any) -> None:
    assert parse_override(f"k={set_text(value)}").value == value


def test_resolved_spec_of_tricky_values_reaches_train_unchanged(tmp_path: Path) -> None:
    text = (
        "name: demo\n"
        "environment:\n  variables: {A: 'y', B: '0o17', C: '1.0e3', D: 'off'}\n"
        "entrypoint:\n  command: [echo, 'n', '010', '1:00', '1e3']\n"
    )
    task = load_text(text, "spec.yaml").tasks[0]
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(_resolved_text(task))
    again = load_text(resolved.read_text(), str(resolved)).spec
    assert again == task.spec
    assert load_run_config(resolved).entrypoint == task.spec.entrypoint


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(TEXT, VALUES, max_size=5))
def test_an_array_task_writes_its_config_so_that_it_reads_back_the_same(
    tmp_path_factory: Any, data: dict[str, Any]
) -> None:
    """Issue 29: array tasks wrote their config with a plain YAML dump ("y", "0o17" came back
    as YAML 1.1 values and every task exited 2); they use the one loader-aware writer."""
    import json

    from jobs.launch import TrainLaunch

    config = tmp_path_factory.mktemp("task") / "resolved.yaml"
    TrainLaunch(str(config), str(config.parent), resolved=json.dumps(data)).materialize()
    _, _, back = load_source(config.read_text(encoding="utf-8"), str(config))
    assert back == data


def test_every_spec_file_is_written_by_the_one_writer() -> None:
    """No YAML writer but train.spec.load.dump_spec in the product (the loader reads back only
    what its own writer quotes for it)."""
    import ast

    repo = Path(__file__).resolve().parents[3]
    found = []
    for package in ("jobs", "train", "cluster"):
        for path in sorted((repo / package).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            if rel == "train/spec/load.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "yaml"
                    and node.attr in ("dump", "safe_dump", "dump_all", "safe_dump_all")
                ):
                    found.append(f"{rel}:{node.lineno}: yaml.{node.attr}")
    assert found == []
