"""What a user sees of a hang and a node quarantine: ``jobs status`` (RunHistory.summary) and
``--follow`` (describe_event) name the stuck ranks, their nodes and the nodes kept off."""

from __future__ import annotations

from pathlib import Path

from jobs.follow import describe_event
from train.history import RunHistory


def _hang_run(tmp_path: Path, excluded: bool) -> RunHistory:
    h = RunHistory(tmp_path)
    h.append("start", step=0, restart_count=0, job_id="7")
    h.append("hang", step=57, restart_count=0, job_id="7", ranks=[1], nodes=["n2"])
    h.append("requeue", step=57, restart_count=0, job_id="7", via="scontrol")
    if excluded:
        h.append("quarantine", step=57, nodes=["n2"], reason="hang at step 57")
    else:
        h.append("quarantine", step=57, nodes=[], reason="hang at step 57", skipped="too few")
    h.append("resume", step=50, restart_count=1, job_id="7")
    return h


def test_status_names_the_hang_and_the_excluded_node(tmp_path: Path) -> None:
    summary = _hang_run(tmp_path, excluded=True).summary()
    assert "hung 1x" in summary
    assert "n2 excluded after hang at step 57" in summary
    assert summary.endswith("resumed at step 50")


def test_status_says_nothing_was_excluded_when_quarantine_was_skipped(tmp_path: Path) -> None:
    d = _hang_run(tmp_path, excluded=False).to_dict()
    assert d["hangs"] == 1 and d["quarantined"] == []


def test_follow_shows_hang_and_quarantine_as_lines(tmp_path: Path) -> None:
    events = _hang_run(tmp_path, excluded=True).events()
    lines = [describe_event(e, tmp_path) for e in events]
    assert "hang at step 57: rank(s) 1 on n2 made no progress" in lines
    assert "n2 excluded after hang at step 57" in lines


def test_a_node_failure_is_shown_in_status_and_follow(tmp_path: Path) -> None:
    h = RunHistory(tmp_path)
    h.append("start", step=0, restart_count=0, job_id="7")
    h.append("node_fail", step=19, restart_count=0, job_id="7", nodes=["n2"], states={"n2": "DOWN"})
    h.append("quarantine", step=19, nodes=["n2"], reason="node failure at step 19")
    summary = h.summary()
    assert "node failure 1x (n2)" in summary
    assert "n2 excluded after node failure at step 19" in summary
    lines = [describe_event(e, tmp_path) for e in h.events()]
    assert "node failure at step 19: Slurm failed n2 and requeued the job" in lines
