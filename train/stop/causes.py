"""Why a run failed: the user's code or config, the infrastructure, or unknown (torch-free).

A failure is sorted from what it left behind (the exception's one-line text, a command's exit
code or signal and the last lines of its stderr) by the first matching rule: the spec's own
``requeue.failure_rules`` first, then :data:`BUILTIN_RULES`. Each class has its own budget
(:data:`train.history.BUDGETS`) and its own treatment in :func:`train.stop.decision.decide`:

- ``user``: an error of the code or the config (ImportError, SyntaxError, a bad config, a
  non-finite loss the run was asked to guard against). A retry fails the same way: not retried
  (``requeue.max_user_failures``, default 0), the cause on one line.
- ``infra``: the machines, not the program (a collective time-out, a connection between ranks
  reset or closed, a device fault, a node lost, a rank killed from outside). Retried, in place
  first (``requeue.max_infra_failures``).
- ``unknown``: anything else; retried (``requeue.max_failures``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["BUILTIN_RULES", "FailureClass", "Rule", "classify", "rules_of"]

FailureClass = Literal["user", "infra", "unknown"]


@dataclass(frozen=True)
class Rule:
    """A failure whose text matches ``pattern`` is of class ``cause``."""

    pattern: re.Pattern[str]
    cause: FailureClass
    why: str


def _rule(pattern: str, cause: FailureClass, why: str) -> Rule:
    return Rule(re.compile(pattern), cause, why)


#: The built-in table, checked after the spec's rules; the first match wins.
BUILTIN_RULES: tuple[Rule, ...] = (
    # the user's code or config: the same error again at every retry
    _rule(r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|TabError|"
          r"NameError|UnboundLocalError)\b", "user", "an error in the code"),
    _rule(r"\b(ConfigError|SpecError|EntrypointError|OverrideError)\b|"
          r"\bunrecognized arguments\b|\bNo such file or directory: '[^']*\.(ya?ml|json)'",
          "user", "a bad config"),
    _rule(r"\bnon-finite loss\b|\bloss is (nan|inf)\b", "user", "a non-finite loss"),
    # the machines: the same run would get past it elsewhere, or later
    _rule(r"uncorrectable ECC error|ECC error encountered|GPU has fallen off the bus|"
          r"GPU is lost|Xid[ (:]|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|"
          r"NVLink error|CUDA error: (unspecified launch failure|an illegal instruction)",
          "infra", "a device fault"),
    _rule(r"[Cc]onnection (reset|closed|refused)( by peer)?|ECONNRESET|Broken pipe|"
          r"Connection timed out|No route to host|remote process exited|"
          r"NCCL error.*(unhandled system error|network error)",
          "infra", "a connection between ranks"),
    _rule(r"\b(DistBackendError|DistNetworkError)\b|[Tt]imed out\b|\btimeout\b.*\b(collective|"
          r"allreduce|all_reduce|barrier|broadcast|rendezvous|store)\b|"
          r"Watchdog caught collective operation timeout", "infra", "a collective time-out"),
    _rule(r"\bkilled by SIG(KILL|BUS|SEGV)\b|\bstep exited (137|135|139)\b",
          "infra", "a rank killed from outside"),
)  # fmt: skip


def rules_of(config_rules: Iterable[Any]) -> tuple[Rule, ...]:
    """The spec's ``requeue.failure_rules`` (objects with ``match`` and ``cause``) as rules,
    before the built-in ones."""
    own = tuple(
        _rule(str(r.match), r.cause, f"requeue.failure_rules: {r.match!r}") for r in config_rules
    )
    return own + BUILTIN_RULES


def classify(
    texts: Sequence[object], rules: Sequence[Rule] = BUILTIN_RULES
) -> tuple[FailureClass, str]:
    """(class, why) of a failure from its texts (strings, or lists of stderr lines); unknown
    when no rule matches."""
    lines: list[str] = []
    for text in texts:
        if isinstance(text, str):
            lines.append(text)
        elif isinstance(text, list | tuple):
            lines.extend(t for t in text if isinstance(t, str))
    blob = "\n".join(lines)[-20000:]
    for rule in rules:
        if rule.pattern.search(blob):
            return rule.cause, rule.why
    return "unknown", "no rule matched"
