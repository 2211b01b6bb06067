"""Errors raised by the jobs package.

    JobsError                     [1] base: anything `python -m jobs` reports as one line
    ├── InputError                [2] the user's input is wrong; fixing it fixes the problem
    │   ├── PreflightError        [2] the spec does not fit the live cluster
    │   │                             (partition, MaxTime, nodes, gres)
    │   ├── RunNotFoundError      [2] no recorded run or job matches what was asked for
    │   ├── RunDirBusyError       [2] the run directory belongs to a run that is not over
    │   └── UsageError            [2] command-line flags that do not go together
    └── SubmitError               [1] submission or a local launch failed after validation

    SpecError                     [2] the YAML spec is invalid: syntax, unknown keys, types, values,
    │                                 inconsistent combinations (one line per problem:
    │                                 ``file:line:column: field.path: problem (hint)``)
    └── OverrideError             [2] a ``--set key=value`` is malformed or names no field
        (both from :mod:`train.errors`: the one spec loader, :mod:`train.spec.load`, is shared
        with ``python -m train --config``; re-exported here)

[2]: the class derives from :class:`cluster.errors.BadInputError`, the one bad-input signal of
every package; ``main()`` exits 2 for it, 1 for any other error. The CLI also catches
:class:`cluster.errors.ClusterError` (exit 1) so a Slurm failure is one line too.
"""

from __future__ import annotations

from cluster import BadInputError
from train.errors import OverrideError, SpecError

__all__ = [
    "InputError",
    "JobsError",
    "OverrideError",
    "PreflightError",
    "RunDirBusyError",
    "RunNotFoundError",
    "SpecError",
    "SubmitError",
    "UsageError",
]


class JobsError(Exception):
    """Base class of every error raised by :mod:`jobs`."""


class InputError(JobsError, BadInputError):
    """Bad input: the spec, an override, a flag or a name does not make sense."""


class PreflightError(InputError):
    """The spec asks for something the cluster cannot give (names the limit and the fix)."""


class RunNotFoundError(InputError):
    """No run directory or job id matches."""


class RunDirBusyError(InputError):
    """The run directory belongs to a live or pending run (or that cannot be proven otherwise)."""


class UsageError(InputError):
    """Command-line arguments that contradict each other."""


class SubmitError(JobsError):
    """Submitting (or starting a local run) failed."""
