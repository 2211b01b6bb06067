"""Whether the job hangs, and whom to blame: a pure function of what the node watchers saw.

:func:`judge` takes one :class:`NodeView` per node (its watcher's last summary, and whether that
watcher published again while the deciding watcher waited) and returns a :class:`Verdict`. The
rules (the protocol around them is in :mod:`train.hang.heartbeat`):

- a node whose watcher stayed silent froze with its ranks (a kernel or file-system stall, a
  driver hang): a hang, and that node is the suspect;
- a rank whose process is stopped (state ``T``) past the timeout: a hang, its node the suspect;
  and once the job hangs for any reason, a stopped process is the suspect even when its own last
  beat is a moment younger than the timeout (it beat, then froze, while its peer already waited
  in the next collective: the peer passes its allowance first);
- a command's job hangs when none of its ranks that ever wrote wrote anything for the timeout;
- a training job hangs when a rank is silent past its allowance while no rank is busy within
  its own (that rank may be what the others wait for: an evaluation, a save of rank 0 alone);
  the suspects are then the ranks that have not reached the step their peers wait at (a rank
  in ``train`` after step N is in step N+1; in a busy phase after step N, between the two);
  the ranks further on wait in a collective for them and are their victims;
- when no rank is behind, no node stopped and every watcher answered, the evidence names no
  one: no node is excluded (never a healthy one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeView", "RankView", "Verdict", "judge", "node_view"]


@dataclass(frozen=True)
class RankView:
    """One rank as its node's watcher last saw it."""

    rank: int
    node: str
    step: int
    phase: str
    idle_s: float
    allowed_s: float
    timeout_s: float
    state: str | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "node": self.node, "step": self.step, "phase": self.phase,
            "idle_s": round(self.idle_s, 1), "allowed_s": round(self.allowed_s, 1),
            "state": self.state, "stopped": self.state == "T",
        }  # fmt: skip


@dataclass(frozen=True)
class NodeView:
    """A node's summary; ``alive``: its watcher published again while the decider waited;
    ``ended``: its ranks finished on their own."""

    node: str
    ranks: tuple[RankView, ...]
    alive: bool = True
    ended: bool = False


@dataclass(frozen=True)
class Verdict:
    hang: bool
    ranks: tuple[int, ...] = ()  # the suspects
    nodes: tuple[str, ...] = ()  # their nodes: the ones to keep the job off
    evidence: dict[str, str] = field(default_factory=dict)  # node -> why
    stalled: tuple[int, ...] = ()  # ranks past their allowance
    why: str = ""


def node_view(data: Mapping[str, Any], *, alive: bool) -> NodeView | None:
    """A node's published summary as a :class:`NodeView` (None when damaged or foreign)."""
    node = data.get("node")
    ranks = data.get("ranks")
    if not isinstance(node, str) or not isinstance(ranks, list):
        return None
    views = []
    for r in ranks:
        try:
            views.append(
                RankView(
                    rank=int(r["rank"]), node=node, step=int(r["step"]), phase=str(r["phase"]),
                    idle_s=float(r["idle_s"]), allowed_s=float(r["allowed_s"]),
                    timeout_s=float(r["timeout_s"]),
                    state=r.get("state") if isinstance(r.get("state"), str) else None,
                    pid=r.get("pid") if isinstance(r.get("pid"), int) else None,
                )
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue
    return NodeView(node, tuple(views), alive=alive, ended=bool(data.get("ended")))


def _position(r: RankView) -> float:
    # after step N: in ``train`` the rank works on (or waits in) step N+1; in a busy phase, or
    # waiting at its end (``wait``), it is between N and N+1; before its first step (-1) it is
    # behind everyone who stepped
    return r.step + (1.0 if r.phase == "train" else 0.5)


def judge(nodes: Sequence[NodeView], *, command: bool = False) -> Verdict:
    """The verdict on what the node watchers saw (see the module docstring)."""
    silent = sorted(n.node for n in nodes if not n.alive and not n.ended)
    live = [r for n in nodes if n.alive and not n.ended for r in n.ranks]
    stalled = tuple(sorted(r.rank for r in live if r.idle_s > r.allowed_s))
    if command:
        written = [r for r in live if r.phase != "start"]
        stopped = [r for r in live if r.state == "T"]
        quiet = all(r.idle_s > r.timeout_s for r in written)
        hang = quiet and bool(written or silent)
        stalled = tuple(sorted(r.rank for r in written if r.idle_s > r.timeout_s))
    else:
        frozen = [r for r in live if r.state == "T"]
        busy = [  # working on its own within its allowance (waiting for peers is no work)
            r
            for r in live
            if r.phase not in ("train", "wait") and r.state != "T" and r.idle_s <= r.allowed_s
        ]
        hang = bool(silent) or any(r.idle_s > r.timeout_s for r in frozen)
        hang = hang or (bool(stalled) and not busy)
        stopped = frozen if hang else []
    if not hang:
        return Verdict(False, stalled=stalled, why="ranks still progress or are busy")
    evidence: dict[str, str] = {}
    if stopped:
        # A stopped process is the strongest evidence: a watcher that merely answered late
        # (a loaded machine) must not put a healthy node beside it. A node frozen whole by a
        # signal stops its ranks too, so it is named here as well.
        for r in stopped:
            evidence.setdefault(r.node, f"rank {r.rank}'s process is stopped (state T)")
        ranks = tuple(sorted({r.rank for r in stopped}))
    elif silent:
        evidence = {n: "its watcher is silent: the node froze with its ranks" for n in silent}
        ranks = tuple(sorted({r.rank for n in nodes if n.node in silent for r in n.ranks}))
    if evidence:
        return Verdict(True, ranks, tuple(sorted(evidence)), evidence, stalled, "evidence")
    if not command and live:
        low, high = min(map(_position, live)), max(map(_position, live))
        if low < high:
            behind = [r for r in live if _position(r) == low]
            ahead = max(r.step for r in live)
            for r in behind:
                evidence.setdefault(
                    r.node,
                    f"rank {r.rank} is behind (step {r.step}, {r.phase}) while its peers "
                    f"wait at step {ahead + 1}",
                )
            ranks = tuple(sorted(r.rank for r in behind))
            return Verdict(True, ranks, tuple(sorted(evidence)), evidence, stalled, "behind")
    return Verdict(
        True,
        stalled=stalled,
        why="no evidence names a node: every watcher answered, no process is stopped and no "
        "rank is behind its peers",
    )
