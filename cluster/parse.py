"""Pure parsers for Slurm command output. Each takes text, returns typed records.

Tested on recorded outputs in ``tests/unit/cluster``; nothing here runs a command.
"""

from __future__ import annotations

import re
import time

from cluster.errors import HostlistError, SlurmParseError, SlurmTimeError
from cluster.hostlist import expand_hostlist, expand_ranges
from cluster.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    ClusterLimits,
    ClusterState,
    JobAttempt,
    JobInfo,
    Node,
    Partition,
)
from cluster.timefmt import parse_slurm_time

# A key=value token starts where a word of letters/digits/underscores/slashes is followed by "=".
_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value with spaces`` (scontrol --oneliner) into a dict.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``): a value runs until the next ``Key=``.
    """
    matches = list(_KEY_RE.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def parse_user_id(value: str) -> tuple[str, int] | None:
    """scontrol's ``UserId=trainee(1001)`` value to ``("trainee", 1001)``; None if it is not that
    (a name Slurm could not resolve shows as the number alone: ``(1001)``, name ``""``)."""
    m = re.fullmatch(r"\s*([^()\s]*)\((\d+)\)\s*", value)
    return (m.group(1), int(m.group(2))) if m else None


def parse_gres(text: str) -> dict[str, int]:
    """``gpu:2``, ``gpu:a100:4(S:0-1),shard:8`` or ``(null)`` to ``{"gpu": 2}`` (types summed)."""
    out: dict[str, int] = {}
    text = text.strip()
    if not text or text in {"(null)", "N/A", "None"}:
        return out
    for item in re.split(r",(?![^()]*\))", text):
        item = re.sub(r"\(.*?\)", "", item).strip()
        if not item:
            continue
        fields = item.split(":")
        name = fields[0]
        count = 1
        if len(fields) > 1 and fields[-1].isdigit():
            count = int(fields[-1])
        out[name] = out.get(name, 0) + count
    return out


def _int(value: str, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_partitions(text: str, nodes: list[Node] | None = None) -> list[Partition]:
    """``scontrol show partition --oneliner`` output to partitions.

    ``nodes`` (from :func:`parse_nodes`) fills in the gres each node of the partition offers
    (the minimum over its nodes, which is what a ``--gres=gpu:N`` per-node request can rely on).
    """
    by_name = {n.name: n for n in nodes or []}
    parts: list[Partition] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("PartitionName="):
            continue
        kv = parse_key_values(line)
        try:
            node_names = tuple(expand_hostlist(kv.get("Nodes", "")))
            max_time = parse_slurm_time(kv.get("MaxTime", "UNLIMITED"))
        except (HostlistError, SlurmTimeError) as exc:
            raise SlurmParseError(f"partition {kv.get('PartitionName')}: {exc}") from exc
        gres: dict[str, int] = {}
        members = [by_name[n] for n in node_names if n in by_name]
        if members:
            names = set.intersection(*(set(n.gres) for n in members))
            gres = {g: min(n.gres[g] for n in members) for g in sorted(names)}
        parts.append(
            Partition(
                name=kv["PartitionName"],
                default=kv.get("Default", "NO").upper() == "YES",
                max_time_s=max_time,
                nodes=node_names,
                state=kv.get("State", "UNKNOWN"),
                preempt_mode=kv.get("PreemptMode", "OFF"),
                priority_tier=_int(kv.get("PriorityTier", "1"), 1),
                total_cpus=_int(kv.get("TotalCPUs", "0")),
                gres_per_node=gres,
                grace_time_s=_int(kv["GraceTime"]) if kv.get("GraceTime", "").isdigit() else None,
            )
        )
    return parts


def parse_nodes(text: str) -> list[Node]:
    """``scontrol show node --oneliner`` output to nodes."""
    nodes: list[Node] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        kv = parse_key_values(line)
        parts = kv.get("Partitions", "")
        nodes.append(
            Node(
                name=kv["NodeName"],
                # whole: IDLE+DRAIN and ALLOCATED+FAIL take no new work (Node.usable)
                state=kv.get("State", "UNKNOWN"),
                cpus=_int(kv.get("CPUTot", "0")),
                gres=parse_gres(kv.get("Gres", "")),
                partitions=tuple(p for p in parts.split(",") if p),
            )
        )
    return nodes


#: ``sinfo -h -a -N -o SINFO_FORMAT``: one line per (node, partition), all the preflight needs.
SINFO_FORMAT = "%R|%P|%a|%l|%N|%c|%G|%T"


def parse_sinfo(text: str) -> ClusterState:
    """``sinfo -h -a -N -o SINFO_FORMAT`` to partitions and nodes (one command for both).

    ``%P`` marks the default partition with ``*``; ``%a`` is up/down/drain/inactive; ``%l`` is
    the partition's MaxTime (``infinite``); ``%T`` the node's long state (``idle``, ``down*``).
    """
    nodes: dict[str, Node] = {}
    members: dict[str, list[str]] = {}
    heads: dict[str, tuple[bool, str, str]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 8:
            continue
        part, marked, avail, limit, name, cpus, gres, state = (f.strip() for f in fields)
        heads.setdefault(part, (marked.endswith("*"), avail, limit))
        members.setdefault(part, [])
        if name and name not in members[part]:
            members[part].append(name)
        old = nodes.get(name)
        nodes[name] = Node(
            name=name,
            state=state.upper(),
            cpus=_int(cpus),
            gres=parse_gres(gres),
            partitions=(*(old.partitions if old else ()), part),
        )
    parts: list[Partition] = []
    for part, (default, avail, limit) in heads.items():
        try:
            max_time = parse_slurm_time("UNLIMITED" if limit.lower() == "infinite" else limit)
        except SlurmTimeError as exc:
            raise SlurmParseError(f"partition {part}: {exc}") from exc
        group = [nodes[n] for n in members[part]]
        names = set.intersection(*(set(n.gres) for n in group)) if group else set()
        parts.append(
            Partition(
                name=part,
                default=default,
                max_time_s=max_time,
                nodes=tuple(members[part]),
                state=avail.upper(),
                preempt_mode="",
                priority_tier=0,
                total_cpus=sum(n.cpus for n in group),
                gres_per_node={g: min(n.gres[g] for n in group) for g in sorted(names)},
            )
        )
    return ClusterState(tuple(parts), tuple(nodes.values()))


def parse_config_values(text: str) -> dict[str, str]:
    """``scontrol show config``: every ``Key = value`` line as a dict."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def parse_config_limits(text: str) -> ClusterLimits:
    """``scontrol show config``: the limits any user may read (MaxArraySize, MaxJobCount) and
    the restart levers of 25.11+ (expedited requeue allowed, ``requeue_delay``), AuthInfo's
    ``cred_expire`` (the hold of a requeue without ``requeue_delay``) and the release
    (SLURM_VERSION)."""
    values = parse_config_values(text)
    defaults = ClusterLimits()
    ctld = _options(values.get("SlurmctldParameters", ""))
    sched = _options(values.get("SchedulerParameters", ""))
    delay = sched.get("requeue_delay", "")
    # the credential's lifetime: AuthInfo's (CredType's on some releases) cred_expire
    expire = _options(values.get("AuthInfo", "")).get("cred_expire", "") or _options(
        values.get("CredType", "")
    ).get("cred_expire", "")
    # a newly eligible job waits at most for the next pass: backfill's (if on) or the main one
    passes = [_int(sched.get("sched_interval", ""), 60)]
    if "backfill" in values.get("SchedulerType", "sched/backfill"):
        passes.append(_int(sched.get("bf_interval", ""), 30))
    return ClusterLimits(
        max_array_size=_int(values.get("MaxArraySize", ""), defaults.max_array_size),
        max_job_count=_int(values.get("MaxJobCount", ""), defaults.max_job_count),
        expedited_requeue="enable_expedited_requeue" in ctld,
        requeue_delay_s=int(delay) if delay.isdigit() else None,
        cred_expire_s=int(expire) if expire.isdigit() else None,
        slurm_version=(values.get("SLURM_VERSION", "").split() or [""])[0],
        successor_wait_s=min(passes),
    )


def _options(text: str) -> dict[str, str]:
    """``a,b=1,c`` (SlurmctldParameters, SchedulerParameters) to ``{"a": "", "b": "1", ...}``;
    ``(null)`` is none."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key and key != "(null)":
            out[key] = value.strip()
    return out


def parse_slurm_user_uid(text: str) -> int | None:
    """``scontrol show config``: the uid of SlurmUser (``SlurmUser = slurm(64030)``), or None."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmUser":
            uid = value.strip().rpartition("(")[2].rstrip(")")
            return int(uid) if uid.isdigit() else None
    return None


def parse_admin_level(text: str) -> str:
    """``sacctmgr -n -P show user NAME format=AdminLevel``: ``None``, ``Operator`` or
    ``Administrator`` ("" when the user is not in the accounting database)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


_HELP_OPTION_RE = re.compile(r"^\s*(?:-[A-Za-z],?\s+)?--([a-z][a-z0-9-]*)", re.ASCII | re.MULTILINE)


def parse_sbatch_help(text: str) -> frozenset[str]:
    """``sbatch --help``: the long options it lists (each at the start of its line, after an
    optional short one: ``  -A, --account=name``, ``  -B  --extra-node-info=...``). The help
    leaves some out (``--open-mode``, ``--hint``, ...): absence here is no proof of absence."""
    options = frozenset(_HELP_OPTION_RE.findall(text))
    if "help" not in options:
        raise SlurmParseError(f"sbatch --help printed no option list ({text.strip()[:80]!r})")
    return options


def parse_sbatch_job_id(text: str) -> str:
    """``sbatch --parsable`` prints ``<jobid>`` or ``<jobid>;<cluster>``."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = line.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmParseError(f"sbatch --parsable printed {text.strip()!r}, expected a job id")
    return job_id


def _base_state(state: str) -> str:
    # sacct: "CANCELLED by 0"; squeue may print "RUNNING"; strip decorations.
    return state.strip().split(" ", 1)[0].rstrip("+").upper() or "UNKNOWN"


#: Every job state the tool knows (an empty State reads UNKNOWN: accounting's placeholder).
KNOWN_STATES = TERMINAL_STATES | ACTIVE_STATES | {"UNKNOWN"}


def _known_state(command: str, state: str, job_id: str) -> str:
    """The base state of ``state``, or a :class:`SlurmParseError` that names the command's
    field: a Slurm release that prints a state the tool does not know is one line, never a
    wrong guess about whether the job is over."""
    base = _base_state(state)
    if base not in KNOWN_STATES:
        raise SlurmParseError(
            f"{command} field State: unknown job state {state.strip()!r} (job {job_id}); "
            "this Slurm release prints a state slurm-train does not know"
        )
    return base


def _fields(command: str, line: str, names: tuple[str, ...]) -> list[str]:
    """``line`` split at ``|``; too few fields is an error naming the first missing one."""
    fields = line.split("|")
    if len(fields) < len(names):
        raise SlurmParseError(
            f"{command} field {names[len(fields)]}: missing ({len(fields)} fields, expected "
            f"{len(names)}: {'|'.join(names)}): {line!r}"
        )
    return fields


def _exit_code(text: str) -> tuple[int | None, int | None]:
    if ":" not in text:
        return (_int(text) if text.strip().isdigit() else None), None
    code, sig = text.split(":", 1)
    return (_int(code) if code.isdigit() else None), (_int(sig) if sig.isdigit() else None)


_ARRAY_PENDING_RE = re.compile(r"^(\d+)_\[([^\]]+)\]$")


def _expand_array_id(job_id: str) -> list[str]:
    """``123_[0-3%2]`` (pending array tasks, one row) to ``123_0`` ... ``123_3``."""
    m = _ARRAY_PENDING_RE.match(job_id)
    if not m:
        return [job_id]
    base, spec = m.groups()
    spec = spec.split("%", 1)[0]
    try:
        return [f"{base}_{int(i)}" for i in expand_ranges(spec)]
    except HostlistError as exc:
        raise SlurmParseError(f"bad array task range in job id {job_id!r}") from exc


SACCT_FIELDS = (
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Elapsed",
    "NodeList",
    "Partition",
    "Reason",
)


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """``sacct -X -n -P -o <SACCT_FIELDS>`` output to job records keyed by job id.

    With ``-X`` there is one line per job (or array task); a requeued job's newest record wins
    (later lines replace earlier ones, which matches sacct's chronological order).
    """
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _fields("sacct", line, SACCT_FIELDS)
        job_id, name, state, exit_code, elapsed, nodelist, partition, reason = fields[:8]
        base = _known_state("sacct", state, job_id)
        code, sig = _exit_code(exit_code)
        try:
            elapsed_s = parse_slurm_time(elapsed) if elapsed else None
        except SlurmTimeError:
            elapsed_s = None
        for jid in _expand_array_id(job_id):
            jobs[jid] = JobInfo(
                job_id=jid,
                state=base,
                exit_code=code,
                signal=sig,
                reason="" if reason in {"None", ""} else reason,
                nodelist="" if nodelist in {"None assigned", "(null)"} else nodelist,
                elapsed_s=elapsed_s,
                partition=partition,
                name=name,
                source="sacct",
            )
    return jobs


# sacct -D: every attempt of a job with Slurm's own times (what the goodput ledger reads)
SACCT_TIME_FIELDS = ("JobID", "State", "Submit", "Eligible", "Start", "End")
#: Asked after them where the release has it (24.11+: each run of a requeued job its own).
SACCT_SLUID_FIELD = "SLUID"


def _sacct_timestamp(text: str) -> float | None:
    """``2026-11-25T02:49:33`` (the controller's local time) -> epoch seconds; None for
    ``Unknown``/``None``/anything else."""
    try:
        return float(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


def parse_sacct_attempts(text: str) -> list[JobAttempt]:
    """``sacct -D -X -n -P -o <SACCT_TIME_FIELDS>[,SLUID]`` output to attempts, in sacct's
    order (oldest first). A line with too few fields is skipped, not fatal: the ledger that
    reads these calls what it cannot place unaccounted."""
    out: list[JobAttempt] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(SACCT_TIME_FIELDS) or not fields[0].strip():
            continue
        job_id, state, submit, eligible, start, end = fields[:6]
        out.append(
            JobAttempt(
                job_id=job_id.strip(),
                state=_base_state(state),
                submit=_sacct_timestamp(submit),
                eligible=_sacct_timestamp(eligible),
                start=_sacct_timestamp(start),
                end=_sacct_timestamp(end),
                sluid=_sluid(fields[6]) if len(fields) > 6 else "",
            )
        )
    return out


def _sluid(text: str) -> str:
    """A SLUID as sacct prints it (``s1WNM8F9N7NW00``); "" for none (an empty field, a
    placeholder, anything not a single alphanumeric word)."""
    text = text.strip()
    return text if text.isalnum() and text.lower() not in ("none", "unknown") else ""


# squeue --Format: a field without a width is never truncated; "exit_code" is the raw wait
# status (code << 8 | signal), which the short -o format cannot print.
SQUEUE_FIELDS = ("JobArrayID", "Name", "State", "Reason", "NodeList", "Partition", "TimeUsed",
                 "exit_code")  # fmt: skip
# Asked for too, last (older recordings lack them): how often Slurm restarted (requeued) the
# job; when it starts (a pending job's expected start: the end of a BeginTime hold).
SQUEUE_OPTIONAL = ("RestartCnt", "StartTime")
SQUEUE_FORMAT = ",".join(f"{f}:|" for f in (*SQUEUE_FIELDS, *SQUEUE_OPTIONAL))


def _wait_status(text: str) -> tuple[int | None, int | None]:
    """squeue's exit_code: the raw wait status (``768``: exit 3) up to 23.x, ``CODE:SIGNAL``
    (``3:0``) from 24.11 (recorded: tests/unit/cluster/data/<release>/squeue.txt)."""
    text = text.strip()
    if ":" in text:
        code, sig = _exit_code(text)
        return code, sig or None
    if not text.isdigit():
        return None, None
    status = int(text)
    return status >> 8, (status & 0x7F) or None


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """``squeue -h -O <SQUEUE_FORMAT>`` output (``|`` after each field) to job records."""
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _fields("squeue", line, SQUEUE_FIELDS)
        job_id, name, state, reason, nodelist, partition, elapsed, status = (
            f.strip() for f in fields[: len(SQUEUE_FIELDS)]
        )
        extra = [f.strip() for f in fields[len(SQUEUE_FIELDS) :]]
        restarts = int(extra[0]) if extra and extra[0].isdigit() else None
        start_at = _sacct_timestamp(extra[1]) if len(extra) > 1 and extra[1][:1].isdigit() else None
        try:
            elapsed_s = parse_slurm_time(elapsed) if elapsed and elapsed != "INVALID" else None
        except SlurmTimeError:
            elapsed_s = None
        base = _known_state("squeue", state, job_id)
        code, sig = _wait_status(status) if base in TERMINAL_STATES else (None, None)
        for jid in _expand_array_id(job_id):
            jobs[jid] = JobInfo(
                job_id=jid,
                state=base,
                exit_code=code,
                signal=sig,
                reason="" if reason == "None" else reason,
                nodelist=nodelist,
                elapsed_s=elapsed_s,
                partition=partition,
                name=name,
                source="squeue",
                restarts=restarts,
                start_at=start_at if base == "PENDING" else None,
            )
    return jobs
