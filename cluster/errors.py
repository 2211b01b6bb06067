"""Errors raised by the cluster package, and the one marker of bad input for every package.

BadInputError                marker: the user's input is wrong; every CLI prints one line and
                             exits 2 (jobs InputError, train ConfigError/EnvError/DataError/
                             EntrypointError, the spec loader's SpecError derive from it)

ClusterError                 base: anything that went wrong talking to or running Slurm
├── SlurmNotFoundError       a Slurm command is not installed / not on PATH
├── SlurmCommandError        a Slurm command ran and failed (carries cmd, exit code, stderr)
│   └── SlurmTimeoutError    a Slurm command did not answer within its timeout
├── JobWaitTimeoutError      a job did not reach the awaited state in time
├── SlurmParseError          a Slurm command answered something we could not parse
├── HostlistError            a malformed hostlist expression
├── SlurmTimeError           a malformed Slurm time string
└── LocalClusterError        the local dev cluster could not be brought up / down
"""

from __future__ import annotations

from collections.abc import Sequence


class BadInputError(Exception):
    """Marker base: bad input (a spec, an override, a flag, a name); fixing it fixes the problem.

    Lives here, in the lowest layer (stdlib only), so ``cluster``, ``train`` and ``jobs`` errors
    can all derive from it and each ``main()`` maps it to exit 2 with ``isinstance``.
    """


class ClusterError(Exception):
    """Base class of every error raised by :mod:`cluster`."""


class SlurmNotFoundError(ClusterError):
    """A Slurm command is missing."""

    def __init__(self, command: str) -> None:
        super().__init__(
            f"{command}: not found on PATH (install Slurm, or run `python -m cluster up` "
            "which installs and starts a local cluster)"
        )
        self.command = command


class SlurmCommandError(ClusterError):
    """A Slurm command exited non-zero."""

    def __init__(self, cmd: Sequence[str], returncode: int, stderr: str) -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr.strip()
        last = self.stderr.splitlines()[-1] if self.stderr else "(no stderr)"
        super().__init__(f"{self.cmd[0]} exited {returncode}: {last}")


class SlurmTimeoutError(SlurmCommandError):
    """A Slurm command did not answer in time (controller down or overloaded)."""

    def __init__(self, cmd: Sequence[str], timeout: float) -> None:
        super().__init__(cmd, -1, f"no answer within {timeout:g}s (is slurmctld running?)")
        self.timeout = timeout


class JobWaitTimeoutError(ClusterError):
    """A job did not reach the state waited for within the time allowed."""

    def __init__(self, job_id: str, last_state: str, timeout: float) -> None:
        super().__init__(f"job {job_id} still {last_state} after {timeout:g}s")
        self.job_id = job_id
        self.last_state = last_state


class SlurmParseError(ClusterError):
    """Output of a Slurm command did not have the expected shape."""


class HostlistError(ClusterError, ValueError):
    """A hostlist expression such as ``n[1-2`` is malformed."""


class SlurmTimeError(ClusterError, ValueError):
    """A Slurm time string such as ``1-25:00`` is malformed."""


class LocalClusterError(ClusterError):
    """The local development cluster failed (names the daemon and shows its log tail)."""
