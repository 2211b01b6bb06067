"""``sbatch --help`` of each Slurm release (recorded from the local clusters of 22.05, 24.11 and
26.05: ``SLURM_CONF=... sbatch --help`` and ``/var/cache/slurm-train/slurm-R/bin/sbatch
--help``), parsed, and the hand-kept option list of jobs.sbatchopts checked against them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import SlurmParseError
from cluster.parse import parse_sbatch_help
from jobs.sbatchopts import HELP_UNLISTED, SBATCH_LONG_OPTIONS

DATA = Path(__file__).parent / "data"
RELEASES = ("22.05", "24.11", "26.05")


def _options(release: str) -> frozenset[str]:
    return parse_sbatch_help((DATA / f"sbatch_help_{release}.txt").read_text())


@pytest.mark.parametrize("release", RELEASES)
def test_every_option_a_release_lists_is_in_the_hand_kept_list(release: str) -> None:
    options = _options(release)
    assert {"account", "array", "gres", "gpus-per-node", "extra-node-info", "help"} <= options
    assert options <= SBATCH_LONG_OPTIONS, sorted(options - SBATCH_LONG_OPTIONS)
    # what the help leaves out is really left out (else it belongs to the parsed list)
    assert not HELP_UNLISTED & options


def test_later_releases_add_options() -> None:
    assert "tres-per-task" not in _options("22.05")
    assert "tres-per-task" in _options("24.11")
    assert "spread-segments" in _options("26.05") - _options("24.11")


def test_text_that_is_no_help_is_refused_in_one_line() -> None:
    with pytest.raises(SlurmParseError, match="no option list"):
        parse_sbatch_help("sbatch: fatal: Could not establish a configuration source\n")
