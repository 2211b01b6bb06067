"""Why a run failed: the user's code or config, the infrastructure, or unknown (torch-free).

A failure is sorted from what it left behind (the exception's one-line text, a command's exit
code or signal and the last lines of its stderr), LINE BY LINE (never one blob: a pattern cannot
span two lines, and each line is judged on its own), by tiers, the first tier with a matching
line deciding:

1. infrastructure evidence (:data:`EVIDENCE`): a device fault, a node's broken driver or missing
   system library (``ImportError: libcuda.so.1``), the run's environment missing on the node
   (``No module named 'torch'``: a package the environment installs, its file system not
   mounted there). These name the node (it is excluded at the requeue). A harmless warning
   elsewhere in the output cannot outvote them;
2. the spec's own ``requeue.failure_rules``, in their order;
3. the user's code or config (:data:`USER`): an exception line (the type at the start of a line
   or after ``: ``, followed by ``:`` or the end, as a traceback ends) of ImportError,
   SyntaxError, NameError..., a bad config, a non-finite loss, running out of memory (the
   same run asks for the same memory again);
4. the symptoms a failure causes on the OTHER ranks (:data:`CASCADE`): a connection between
   ranks closed or reset, a collective timed out. They are infrastructure only when nothing
   else explains the failure: a rank that lost its peer is the root's victim, not a second
   cause.

A rank killed by a signal with no other evidence (SIGKILL: the user's own OOM kill, or an
administrator's) is ``unknown``: retried within ``requeue.max_failures``, never as
infrastructure. The rule that fired and the line it matched are the failure's ``why``
(recorded in the failure event as ``cause``, shown by ``jobs status``).

:func:`root_report` picks the root of a multi-rank failure: the rank that failed first (by
time); the others' failures are its cascade. :func:`signature` and :func:`repeated_failure` tell
a deterministic crash (the same exception type, message and location at consecutive starts with
no checkpoint progress), which a retry would repeat. :func:`exception_line` is the line a
person needs (the last ``...Error:``/``...Exception`` line of the traceback, whole).

Each class has its own budget (:data:`train.history.BUDGETS`) and its own treatment in
:func:`train.stop.decision.decide`:

- ``user``: not retried (``requeue.max_user_failures``, default 0), the cause on one line.
- ``infra``: retried, in place first (``requeue.max_infra_failures``).
- ``unknown``: anything else; retried (``requeue.max_failures``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BUILTIN_RULES",
    "CASCADE",
    "EVIDENCE",
    "USER",
    "Cause",
    "FailureClass",
    "Rule",
    "classify",
    "decide_cause",
    "exception_line",
    "repeated_failure",
    "root_report",
    "rules_of",
    "signature",
]

FailureClass = Literal["user", "infra", "unknown"]

# the tiers, in the order they decide
_EVIDENCE, _SPEC, _USER, _CASCADE = range(4)


@dataclass(frozen=True)
class Rule:
    """A failure with a line matching ``pattern`` is of class ``cause``; ``name`` says which
    rule fired, ``node`` that the evidence names this node (excluded at the requeue)."""

    pattern: re.Pattern[str]
    cause: FailureClass
    why: str
    name: str = ""
    tier: int = _SPEC
    node: bool = False


@dataclass(frozen=True)
class Cause:
    """The decision: the class, why (the rule and the line it matched), whether it names the
    node the failure happened on."""

    cls: FailureClass
    why: str
    rule: str = ""
    line: str = ""
    node: bool = False
    cascade: bool = False  # only the symptoms of a peer's failure (connection closed...)


def _rule(
    name: str, tier: int, pattern: str, cause: FailureClass, why: str, node: bool = False
) -> Rule:
    return Rule(re.compile(pattern), cause, why, name, tier, node)


# an exception line: its type at the start of the line (after a "[rank1]:" prefix) or after
# ": " (our "command exited 1: ..."), followed by ":" or the end of the line
_EXC = r"(?:^|:\s)\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?"
_END = r"(?::|\s*$)"
# packages an environment installs for training: missing on one node, the environment's file
# system is missing there (a user's typo in their own module names something else)
_ENV_PACKAGES = (
    r"torch|torchvision|torchaudio|numpy|triton|lightning|pytorch_lightning|transformers|"
    r"deepspeed|apex|accelerate|datasets|jax|tensorflow|yaml|pydantic|submitit|train|jobs"
)

#: Infrastructure evidence: checked first, whatever else the output holds.
EVIDENCE: tuple[Rule, ...] = (
    _rule("device_fault", _EVIDENCE,
          r"uncorrectable ECC error|ECC error encountered|GPU has fallen off the bus|"
          r"GPU is lost|Xid[ (:]|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|"
          r"NVLink error|CUDA error: (unspecified launch failure|an illegal instruction)",
          "infra", "a device fault", node=True),
    _rule("node_driver", _EVIDENCE,
          r"lib(cuda|nvidia-ml|nccl|cudart|cublas|cudnn)[\w.-]*\.so[\d.]*\b.*(cannot open|"
          r"No such file)|ImportError: lib(cuda|nvidia|nccl)[\w.-]*\.so|"
          r"CUDA driver version is insufficient|NVIDIA driver on your system is too old|"
          r"Found no NVIDIA driver|no CUDA-capable device is detected|"
          r"CUDA_ERROR_(NO_DEVICE|NOT_INITIALIZED|SYSTEM_DRIVER_MISMATCH)",
          "infra", "the node's GPU driver or system libraries", node=True),
    _rule("environment_missing", _EVIDENCE,
          rf"No module named '?({_ENV_PACKAGES})(\.[\w.]+)?'?\s*$|"
          r"(python[\d.]*|bash|srun): (No such file or directory|command not found)|"
          r"Stale file handle|Transport endpoint is not connected",
          "infra", "the run's environment missing on the node (its file system not mounted?)",
          node=True),
)  # fmt: skip

#: The user's code or config: a retry fails the same way.
USER: tuple[Rule, ...] = (
    _rule("code_error", _USER,
          _EXC + r"(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|TabError|"
          r"NameError|UnboundLocalError)" + _END, "user", "an error in the code"),
    _rule("bad_config", _USER,
          _EXC + r"(ConfigError|SpecError|EntrypointError|OverrideError)" + _END +
          r"|\bunrecognized arguments\b|\bNo such file or directory: '[^']*\.(ya?ml|json)'",
          "user", "a bad config"),
    _rule("non_finite_loss", _USER, r"\bnon-finite loss\b|\bloss is (nan|inf)\b", "user",
          "a non-finite loss"),
    _rule("out_of_memory", _USER,
          r"CUDA out of memory|OutOfMemoryError|\boom[-_]kill\b|Out of memory: Killed process|"
          r"\bOUT_OF_MEMORY\b", "user", "out of memory (the same run needs the same memory)"),
)  # fmt: skip

#: What a failure causes on the other ranks: infrastructure only when nothing else explains it.
CASCADE: tuple[Rule, ...] = (
    _rule("connection", _CASCADE,
          r"[Cc]onnection (reset|closed|refused)( by peer)?|ECONNRESET|Broken pipe|"
          r"Connection timed out|No route to host|remote process exited|"
          r"NCCL error.*(unhandled system error|network error)",
          "infra", "a connection between ranks"),
    _rule("collective_timeout", _CASCADE,
          r"\b(DistBackendError|DistNetworkError)\b|[Tt]imed out\b|\btimeout\b.*\b(collective|"
          r"allreduce|all_reduce|barrier|broadcast|rendezvous|store)\b|"
          r"Watchdog caught collective operation timeout", "infra", "a collective time-out"),
    _rule("save_peer", _CASCADE,
          r"\bcheckpoint step-\d+: ranks \[[\d, ]+\] did not finish writing\b",
          "infra", "a rank that stopped writing its part of a checkpoint"),
)  # fmt: skip

#: The built-in table (the spec's rules go between :data:`EVIDENCE` and :data:`USER`).
BUILTIN_RULES: tuple[Rule, ...] = EVIDENCE + USER + CASCADE


def rules_of(config_rules: Iterable[Any]) -> tuple[Rule, ...]:
    """The spec's ``requeue.failure_rules`` (objects with ``match`` and ``cause``) as rules,
    with the built-in ones (decided in tiers: evidence, the spec's, code, cascade)."""
    own = tuple(
        _rule(f"requeue.failure_rules[{i}]", _SPEC, str(r.match), r.cause,
              f"requeue.failure_rules: {r.match!r}")
        for i, r in enumerate(config_rules)
    )  # fmt: skip
    return EVIDENCE + own + USER + CASCADE


def _lines(texts: Sequence[object]) -> list[str]:
    lines: list[str] = []
    for text in texts:
        if isinstance(text, str):
            lines.extend(text.splitlines())
        elif isinstance(text, list | tuple):
            for t in text:
                if isinstance(t, str):
                    lines.extend(t.splitlines())
    return [ln[:2000] for ln in lines[-400:]]


def decide_cause(texts: Sequence[object], rules: Sequence[Rule] = BUILTIN_RULES) -> Cause:
    """The cause of a failure from its texts (strings, or lists of stderr lines), per line, by
    tiers (module docstring); within a tier, rules in their order, each over every line."""
    lines = _lines(texts)
    for tier in sorted({r.tier for r in rules}):
        for rule in (r for r in rules if r.tier == tier):
            for line in lines:
                if rule.pattern.search(line):
                    shown = line.strip()
                    shown = shown if len(shown) <= 160 else shown[:157] + "..."
                    why = f"{rule.why} (rule {rule.name}: {shown})" if rule.name else rule.why
                    return Cause(rule.cause, why, rule.name, line.strip(), rule.node,
                                 rule.tier == _CASCADE)  # fmt: skip
    return Cause("unknown", "no rule matched")


def classify(
    texts: Sequence[object], rules: Sequence[Rule] = BUILTIN_RULES
) -> tuple[FailureClass, str]:
    """(class, why) of a failure from its texts; unknown when no rule matches."""
    cause = decide_cause(texts, rules)
    return cause.cls, cause.why


# -- the line a person needs, and a deterministic crash -----------------------------------------

_EXCEPTION_LINE = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|"
    r"Interrupt|Fault))(?::\s|:$|$)"
)
_LOCATION = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "([^"]+)", line (\d+), in (\S+)')


def exception_line(lines: Sequence[object]) -> str | None:
    """The last exception line of a traceback in ``lines`` (``_pickle.UnpicklingError: Weights
    only load failed...``), whole, or None."""
    found = None
    for line in _lines(lines):
        if _EXCEPTION_LINE.match(line):
            found = line.strip()
    return found


def signature(lines: Sequence[object]) -> str | None:
    """A failure's signature: its exception line (type and message, addresses and numbers
    that change from run to run blanked) and the location of the frame that raised it (the
    last ``File "...", line N, in f`` before it); None without an exception line."""
    at: str | None = None
    exc: str | None = None
    exc_at: str | None = None
    for line in _lines(lines):
        loc = _LOCATION.match(line)
        if loc:
            at = f"{loc.group(1).rsplit('/', 1)[-1]}:{loc.group(2)}:{loc.group(3)}"
        elif _EXCEPTION_LINE.match(line):
            exc, exc_at = line.strip(), at
    if exc is None:
        return None
    exc = re.sub(r"0x[0-9a-fA-F]+|\b\d{4,}\b", "#", exc)[:300]
    return f"{exc} @ {exc_at}" if exc_at else exc


def root_report(
    reports: Sequence[Mapping[str, Any]], rules: Sequence[Rule] = BUILTIN_RULES
) -> Mapping[str, Any] | None:
    """The root of a failure of several ranks, from their reports (``rank``; ``time``: when its
    process ended; ``error`` and ``stderr_tail``): the first by time whose own output is more
    than a peer's death (:data:`CASCADE`: connection closed, a collective timed out), else
    the first by time. The rest are its cascade. None without a report with a finite time."""
    timed = [
        r for r in reports
        if isinstance(r, Mapping) and isinstance(r.get("time"), int | float)
        and not isinstance(r.get("time"), bool) and r["time"] == r["time"]
    ]  # fmt: skip
    if not timed:
        return None
    timed.sort(key=lambda r: (float(r["time"]), str(r.get("rank"))))
    for r in timed:
        if not decide_cause((r.get("error"), r.get("stderr_tail")), rules).cascade:
            return r
    return timed[0]


def _from(event: Mapping[str, Any]) -> tuple[object, object]:
    """Where a start/resume event's attempt started: its step and checkpoint path."""
    return event.get("step"), event.get("path")


def repeated_failure(events: Sequence[Mapping[str, Any]], sig: str | None) -> int:
    """How many consecutive attempts before this one (its newest ``start``/``resume`` event)
    started from the same checkpoint as it did (the same step and path, or both from scratch)
    and ended with this same failure (``sig``): 0 when the one before differs in either (a
    checkpoint saved meanwhile makes the next start resume from it)."""
    if sig is None:
        return 0
    attempts: list[tuple[tuple[object, object], str | None]] = []  # (began, failure signature)
    for e in events:
        if not isinstance(e, Mapping):
            continue
        kind = e.get("event")
        if kind in ("start", "resume"):
            attempts.append((_from(e), None))
        elif kind == "failure" and attempts and attempts[-1][1] is None:
            texts = (e.get("error"), e.get("stderr_tail"))
            own = e.get("signature")
            attempts[-1] = (attempts[-1][0], own if isinstance(own, str) else signature(texts))
    if not attempts:
        return 0
    began = attempts[-1][0]
    same = 0
    for start, failed in reversed(attempts[:-1]):
        if start != began or failed != sig:
            break
        same += 1
    return same
