"""Which generator replica serves a group: sticky per group, least-loaded for new ones.

A GRPO group's n rollouts share their prompt, and every later turn of an
episode extends its own earlier prefix: sending all of a group's requests to
one replica lets that replica's prefix cache serve them (the env actor that
plays the group sends them all to the replica named in its job). New groups
go to the replica with the fewest outstanding tokens: the token budget of the
groups routed to it and not yet done (n x (prompt room + new tokens) is not
known ahead; the driver passes what it estimates), so a replica that drew
long groups gets fewer new ones.

Pure bookkeeping, no Ray: the driver calls it at dispatch and when a group ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReplicaLoad:
    outstanding_tokens: int = 0
    groups: int = 0  # in flight now
    routed: int = 0  # over the run


@dataclass
class ReplicaRouter:
    replicas: list[str]
    load: dict[str, ReplicaLoad] = field(default_factory=dict)
    _where: dict[str, tuple[str, int]] = field(default_factory=dict)  # group id -> (replica, tokens)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError("a router needs at least one replica")
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replica names repeat: {self.replicas}")
        self.replicas = list(self.replicas)
        for name in self.replicas:
            self.load.setdefault(name, ReplicaLoad())

    def route(self, group_id: str, tokens: int) -> str:
        """The replica for ``group_id``: the one it already has, else the least loaded (ties: fewest routed, then order)."""
        if group_id in self._where:
            return self._where[group_id][0]
        if not self.replicas:
            raise RuntimeError("no generator replica is serving (all were taken out of the router)")
        name = min(
            self.replicas, key=lambda r: (self.load[r].outstanding_tokens, self.load[r].routed, self.replicas.index(r))
        )
        load = self.load[name]
        load.outstanding_tokens += int(tokens)
        load.groups += 1
        load.routed += 1
        self._where[group_id] = (name, int(tokens))
        return name

    def release(self, group_id: str) -> None:
        """The group is done (sent, filtered or lost): its tokens leave the replica's load."""
        where = self._where.pop(group_id, None)
        if where is None:
            return
        name, tokens = where
        if name in self.load:
            self.load[name].outstanding_tokens -= tokens
            self.load[name].groups -= 1

    def remove(self, name: str) -> list[str]:
        """Take a replica out (failed, or retiring); returns the groups that were on it."""
        if name in self.replicas:
            self.replicas.remove(name)
        return [g for g, (r, _) in self._where.items() if r == name]

    def add(self, name: str) -> None:
        """A replica (new, or back with the current weights) takes groups again."""
        if name not in self.replicas:
            self.replicas.append(name)
        self.load.setdefault(name, ReplicaLoad())

    def groups_on(self, name: str) -> list[str]:
        return [g for g, (r, _) in self._where.items() if r == name]
