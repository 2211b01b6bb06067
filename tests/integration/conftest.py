"""Fixtures shared by the integration tests (the cluster itself: tests/conftest.py), and their
order: the tests marked ``long(SECONDS)`` (about what one takes on an idle machine) run first,
longest first, so that the workers (``make test``: ``--dist load``, which hands tests out in
this order) do not end waiting on one long test started last. Every test here is marked
``integration``: the unit half (``make unit``) does not even collect this directory. The whole
integration half runs on the other Slurm releases too (``make test``, scripts/test.sh); the
tests marked ``release_sensitive(WHY)`` are those that touch what differs between releases (WHY,
required, says what)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _expected_s(item: pytest.Item) -> float:
    mark = item.get_closest_marker("long")
    return float(mark.args[0]) if mark is not None and mark.args else 0.0


HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects what is not marked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        i.nodeid
        for i in items
        if i.path.is_relative_to(HERE) and i.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"not marked integration (neither half of make test would run it): {unmarked[0]}"
        )
    # release_sensitive(WHY): documentation of what differs between releases that the test
    # touches (make test runs the whole integration half on every release: scripts/test.sh)
    unexplained = [
        i.nodeid
        for i in items
        if any(
            not (m.args and isinstance(m.args[0], str) and m.args[0].strip())
            for m in i.iter_markers("release_sensitive")
        )
    ]
    if unexplained:
        raise pytest.UsageError(
            f"release_sensitive without its reason (what differs between releases): "
            f"{unexplained[0]}"
        )
    items.sort(key=_expected_s, reverse=True)  # stable: the others keep their order


@pytest.fixture
def env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The cluster's environment with this test's own run and state directories: runs, the
    run index and the state cache never meet another test's."""
    return {
        **slurm_env,
        "SLURM_TRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "SLURM_TRAIN_STATE_DIR": str(tmp_path / "state"),
    }
