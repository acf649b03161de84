"""Telling a generator replica Ray is restarting from one it has given up on (generator_fleet.py).

Ray answers a call to an actor it is restarting with ``ActorUnavailableError``, and a call to one
whose ``max_restarts`` are spent with ``ActorDiedError``, at once and every time (Ray 2.60;
tests/unit/seal/runtime/test_replica_deaths.py holds Ray to it). A call already in flight when
the process died gets ``ActorDiedError`` too, restartable or not, so one such answer proves
nothing; ``needed`` in a row, each sent after the previous one came back, do. Before this, the
fleet probed a replica that would never come back for ever, and the run waited with it.
"""

from __future__ import annotations

DEAD_PROBES = 3


class ReplicaGone(RuntimeError):
    """A generator replica Ray will not restart again: no restore can bring it back."""


class ReplicaDeaths:
    def __init__(self, max_restarts: int, needed: int = DEAD_PROBES) -> None:
        self.max_restarts, self.needed = max_restarts, needed
        self._died: dict[str, int] = {}  # replica -> probes in a row answered "dead"

    def answered(self, name: str) -> None:
        self._died.pop(name, None)

    def failed(self, name: str, died: bool, node: str | None = None) -> None:
        """A probe of ``name`` failed; ``died``: with ``ActorDiedError``. Raises ``ReplicaGone``
        once ``needed`` probes in a row found it dead."""
        if not died:  # restarting (or unreachable for a moment): it may come back
            self._died.pop(name, None)
            return
        self._died[name] = self._died.get(name, 0) + 1
        if self._died[name] >= self.needed:
            where = f" on node {node}" if node else ""
            raise ReplicaGone(
                f"generator replica {name}{where} is dead for good: Ray has spent its "
                f"cluster.max_restarts={self.max_restarts} restarts and answered {self.needed} probes in a row "
                "with ActorDiedError; the run stops here (resume it with resume=RUN_DIR, which starts the "
                "replicas afresh, or raise cluster.max_restarts)"
            )
