"""Errors raised by the jobs package.

    JobsError                     [1] base: anything `python -m jobs` reports as one line
    ├── InputError                [2] the user's input is wrong; fixing it fixes the problem
    │   ├── SpecError             [2] the YAML spec is invalid: syntax, unknown keys, types, values,
    │   │                             inconsistent combinations (carries one line per problem:
    │   │                             ``file:line:column: field.path: problem (hint)``)
    │   ├── OverrideError         [2] a ``--set key=value`` is malformed or names no field
    │   ├── PreflightError        [2] the spec does not fit the live cluster
    │   │                             (partition, MaxTime, nodes, gres)
    │   ├── RunNotFoundError      [2] no recorded run or job matches what was asked for
    │   └── UsageError            [2] command-line flags that do not go together
    └── SubmitError               [1] submission or a local launch failed after validation

``exit_code`` ([n] above) is what the command line returns. The CLI also catches
:class:`cluster.errors.ClusterError` (exit 1) so a Slurm failure is one line too.
"""

from __future__ import annotations

from collections.abc import Sequence


class JobsError(Exception):
    """Base class of every error raised by :mod:`jobs`."""

    exit_code: int = 1


class InputError(JobsError):
    """Bad input: the spec, an override, a flag or a name does not make sense."""

    exit_code = 2


class SpecError(InputError):
    """One or more problems in a spec; ``str()`` is one line per problem."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


class OverrideError(InputError):
    """A ``--set key=value`` that cannot be applied."""


class PreflightError(InputError):
    """The spec asks for something the cluster cannot give (names the limit and the fix)."""


class RunNotFoundError(InputError):
    """No run directory or job id matches."""


class UsageError(InputError):
    """Command-line arguments that contradict each other."""


class SubmitError(JobsError):
    """Submitting (or starting a local run) failed."""
