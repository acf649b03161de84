"""Which network interface a process's collectives leave from.

Gloo (the learner group on CPU, the CPU weight broadcast) picks its interface by resolving the
hostname unless GLOO_SOCKET_IFNAME names one. Where the hostname resolves to 127.0.0.1 (common:
/etc/hosts maps it so; and in the two-host test's namespaces) every rank then advertises the
loopback, and a rank on another node fails to connect ("Connection refused, remote=[127.0.0.1]").
The address a rank must be reached at is its node's IP in the Ray cluster, so the interface is
the one that holds that IP. Shared by the learner (learner/rank_shards.py) and the generators'
weight receivers (weights/broadcast_group.py).
"""

from __future__ import annotations

import os

import psutil  # Ray's own dependency


def interface_with(ip: str) -> str | None:
    """The name of the interface that holds ``ip`` (None: no interface here holds it)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return None


_CHOSEN: dict[str, str] = {}  # what use_interface_of set, so a later call may choose again


def use_interface_of(ip: str | None) -> str | None:
    """Point gloo at the interface holding ``ip`` (this process's node IP), unless the user set
    GLOO_SOCKET_IFNAME or ``ip`` is the loopback (a single-machine group, where it works as is).
    Returns the interface chosen (None: left to gloo)."""
    current = os.environ.get("GLOO_SOCKET_IFNAME")
    if current and current != _CHOSEN.get("GLOO_SOCKET_IFNAME"):
        return None  # the user's choice stands
    if not ip or ip.startswith("127."):
        return None
    name = interface_with(ip)
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = _CHOSEN["GLOO_SOCKET_IFNAME"] = name
    return name


def use_node_interface() -> str | None:
    """``use_interface_of`` this Ray worker's node IP (a no-op outside Ray)."""
    try:
        import ray

        ip = ray.util.get_node_ip_address() if ray.is_initialized() else None
    except ImportError:
        ip = None
    return use_interface_of(ip)
