"""``launch.sbatch_args``: extra ``#SBATCH`` options, checked before they reach a script.

sbatch accepts any unique prefix of a long option (``--arr`` is ``--array``), so every key is
resolved against sbatch's full list of long options first: those of Slurm 22.05 (``man
sbatch``) and those later releases add (24.11, 26.05: their ``sbatch --help``, recorded in
tests/unit/cluster/data). Then:

- an option jobs sets itself (array, output, error, requeue, signal, job name, ...) is refused,
- an option that a spec field says (``--nodes`` is ``resources.nodes``) is refused naming the
  field, so one value cannot be given twice or contradict the other,
- a value must fit the option: a flag takes ``true``, an option with an argument a value
  (one line: control characters are refused by the loader; the renderers quote it for
  sbatch); known formats are checked (``--time-min`` a Slurm time, ``--mail-type`` Slurm's
  event names, counts are integers).

Against the release the preflight talks to (:func:`release_problems`, from that cluster's
``sbatch --help``, cached per cluster by :func:`jobs.preflight.sbatch_options`): an option that
release does not have is refused, and so is a prefix that is ambiguous there (``--spread`` is
``--spread-job`` on 22.05 but two options on 26.05). ``sbatch --help`` leaves some options out
(:data:`HELP_UNLISTED`): those are taken as present.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cluster import SlurmTimeError, parse_slurm_time
from jobs.slurmmap import FIELD_OF_OPTION

__all__ = [
    "HELP_UNLISTED",
    "SBATCH_LONG_OPTIONS",
    "check_sbatch_arg",
    "release_problems",
    "resolve_option",
]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Every long option of sbatch (Slurm 22.05: `man sbatch` and `sbatch --help`).
_BASE_OPTIONS = _words(
    """
    account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
    constraint container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node
    gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
    mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
    ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output
    overcommit oversubscribe parsable partition power prefer priority profile propagate qos
    quiet reboot requeue reservation signal sockets-per-node spread-job switches test-only
    thread-spec threads-per-core time time-min tmp uid usage use-min-nodes verbose version
    wait wait-all-nodes wckey wrap
    """
)
# Added by later releases (sbatch --help of 24.11 and 26.05): taken by their full name only, so
# that a prefix keeps the meaning it has on 22.05 (the preflight refuses one that is ambiguous
# on the cluster's own release).
SBATCH_LONG_OPTIONS = _BASE_OPTIONS | _words(
    """
    container-id container-type oom-kill-step resv-ports spread-segments tres-bind
    tres-per-task
    """
)
# Options sbatch takes that its --help does not list (22.05's --help against `man sbatch`).
HELP_UNLISTED = _words(
    """
    acctg-freq batch hint kill-on-invalid-dep mem-bind network ntasks-per-gpu open-mode prefer
    test-only wait-all-nodes
    """
)
# Options without an argument, and those whose argument is optional (both accept `true`).
_FLAGS = _words(
    """
    contiguous hold ignore-pbs overcommit oversubscribe parsable quiet reboot requeue
    no-requeue spread-job test-only use-min-nodes verbose wait help usage version
    spread-segments
    """
)
_OPTIONAL_ARG = _words(
    "exclusive export get-user-env nice no-kill propagate wrap oom-kill-step resv-ports"
)
# Set by jobs (or they change what sbatch prints, which jobs reads).
RESERVED = _words(
    """
    array output error input requeue no-requeue signal open-mode job-name wrap parsable wait
    test-only help usage version quiet verbose
    """
)
# Options a spec field already says: give the field instead (from THE table, jobs.slurmmap).
SPEC_FIELDS = FIELD_OF_OPTION
_INTEGER = _words(
    """
    cores-per-socket delay-boot mincpus nice ntasks-per-core ntasks-per-gpu
    ntasks-per-socket priority sockets-per-node thread-spec threads-per-core core-spec
    """
)
_MAIL_TYPES = _words(
    """
    NONE BEGIN END FAIL REQUEUE ALL INVALID_DEPEND STAGE_OUT TIME_LIMIT TIME_LIMIT_90
    TIME_LIMIT_80 TIME_LIMIT_50 ARRAY_TASKS
    """
)
_KEY_RE = re.compile(r"^[a-z][a-z0-9-]*$", re.ASCII)
_INT_RE = re.compile(r"^-?[0-9]{1,9}$", re.ASCII)


def resolve_option(key: str) -> str:
    """The long option sbatch reads ``--key`` as (exact, else the one it is a prefix of).

    Raises ValueError for a name that is no option or is the prefix of several.
    """
    if not _KEY_RE.match(key):
        raise ValueError(f"{key!r} is not an sbatch option name (e.g. mail-type)")
    if key in SBATCH_LONG_OPTIONS:
        return key
    matches = sorted(o for o in _BASE_OPTIONS if o.startswith(key))
    if not matches:
        raise ValueError(f"--{key} is not an sbatch option (see man sbatch)")
    if len(matches) > 1:
        shown = ", ".join(f"--{m}" for m in matches[:6]) + (", ..." if len(matches) > 6 else "")
        raise ValueError(f"--{key} is ambiguous for sbatch ({shown}); write the full name")
    return matches[0]


def check_sbatch_arg(key: str, value: str | int | bool) -> str:
    """The resolved option name of one ``launch.sbatch_args`` entry; ValueError when refused."""
    option = resolve_option(key)
    named = f"--{key}" if option == key else f"--{key} (sbatch reads it as --{option})"
    if option in SPEC_FIELDS and option not in RESERVED:
        raise ValueError(f"{named} is the spec field {SPEC_FIELDS[option]}: set that instead")
    if option in RESERVED:
        field = SPEC_FIELDS.get(option)
        extra = f" (use {field})" if field else ""
        raise ValueError(f"{named} is set by jobs itself and cannot be overridden{extra}")
    if value is False:
        return option  # left out of the script
    if value is True:
        if option in _FLAGS or option in _OPTIONAL_ARG:
            return option
        raise ValueError(f"{named} needs a value (write {key}: VALUE)")
    if option in _FLAGS:
        raise ValueError(f"{named} takes no value (write {key}: true)")
    text = str(value)
    if not text.strip():
        raise ValueError(f"{named} needs a value (write {key}: VALUE, or leave it out)")
    if option in _INTEGER and not _INT_RE.match(text):
        raise ValueError(f"{named}: {text!r} is not an integer")
    if option == "time-min":
        try:
            parse_slurm_time(text)
        except SlurmTimeError as exc:
            raise ValueError(f"{named}: {exc}") from None
    if option == "mail-type":
        bad = [t for t in text.split(",") if t.upper() not in _MAIL_TYPES]
        if bad:
            raise ValueError(
                f"{named}: {bad[0]!r} is not a mail type ({', '.join(sorted(_MAIL_TYPES))})"
            )
    return option


def release_problems(
    sbatch_args: Iterable[str], written: Iterable[str], live: frozenset[str]
) -> list[tuple[str | None, str]]:
    """What the ``sbatch`` whose ``--help`` lists ``live`` would not take: ``(key, problem)``
    for a ``launch.sbatch_args`` key, ``(None, problem)`` for an option jobs writes itself
    (``written``). Empty when all is well."""
    known = live | HELP_UNLISTED
    problems: list[tuple[str | None, str]] = []
    for key in sbatch_args:
        option = resolve_option(key)
        if key != option:
            matches = sorted(o for o in known if o.startswith(key))
            if len(matches) > 1:
                shown = ", ".join(f"--{m}" for m in matches[:6])
                problems.append(
                    (key, f"--{key} is ambiguous for this cluster's sbatch ({shown}); "
                     "write the full name")
                )  # fmt: skip
                continue
        if option not in known:
            problems.append(
                (key, f"--{option} is not an option of this cluster's sbatch (its --help does "
                 "not list it: another Slurm release); remove it")
            )  # fmt: skip
    for option in dict.fromkeys(written):
        if option not in known:
            problems.append(
                (None, f"jobs writes --{option} but this cluster's sbatch does not list it in "
                 "its --help (a Slurm release jobs does not know); please report it")
            )  # fmt: skip
    return problems
