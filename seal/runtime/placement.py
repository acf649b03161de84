"""Starting Ray for the pipeline's actors and finding where they run, from the `cluster` config
group (typed in seal/cluster_config.py): kept apart from what the actors do (their own groups).

On a laptop-size machine Ray starts locally with enough logical CPUs for the
configured actors (they share the cores; threads are pinned per actor). With
``address`` ("auto" or host:port) the pipeline joins an existing cluster and
spreads env actors across its nodes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal.cluster_config import ClusterConfig


def check_reachable(cfg: ClusterConfig) -> None:
    """Loopback sockets only serve actors on this machine: refuse early when
    the cluster has nodes elsewhere."""
    import ray

    if cfg.bind_host not in ("127.0.0.1", "localhost"):
        return
    here = ray.util.get_node_ip_address()
    others = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} - {here})
    if others:
        raise ValueError(
            f"the cluster has nodes at {', '.join(others)} but the replay stream binds to {cfg.bind_host}: "
            "use cluster=multinode or cluster.bind_host=0.0.0.0"
        )


def ray_token_source(environ: Mapping[str, str], home: Path) -> str | None:
    """Where Ray (2.60) would read its auth token from, as it looks: RAY_AUTH_TOKEN,
    then the file RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token; None: nowhere."""
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        path = Path(environ["RAY_AUTH_TOKEN_PATH"]).expanduser()
        return f"RAY_AUTH_TOKEN_PATH={path}" if path.is_file() and path.read_text().strip() else None
    default = home / ".ray" / "auth_token"
    return str(default) if default.is_file() and default.read_text().strip() else None


def ray_auth_env(cfg: ClusterConfig, environ: Mapping[str, str], home: Path | None = None) -> dict[str, str]:
    """The environment Ray's token authentication needs for this config, checked
    before anything starts (preflight and start_ray).

    ``token``: RAY_AUTH_MODE=token, and joining a cluster needs its token here
    (a local start makes one, ~/.ray/auth_token). A RAY_AUTH_MODE of another value
    in the environment is refused rather than silently overridden either way.
    ``disabled``: RAY_AUTH_MODE=disabled unless the environment sets it (a local
    run needs no token file; a user who exports RAY_AUTH_MODE=token keeps it)."""
    current = environ.get("RAY_AUTH_MODE")
    if cfg.ray_auth == "disabled":
        return {} if current else {"RAY_AUTH_MODE": "disabled"}
    if current is not None and current.lower() != "token":
        raise ValueError(
            f"cluster.ray_auth=token but RAY_AUTH_MODE={current} in the environment: "
            "unset it, or run with cluster.ray_auth=disabled"
        )
    if cfg.address and ray_token_source(environ, home or Path.home()) is None:
        raise ValueError(
            f"cluster.ray_auth=token joins the cluster at {cfg.address} with Ray's token authentication, "
            "but no token is here: copy the head node's ~/.ray/auth_token (made by `ray get-auth-token --generate`), "
            "or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (docs/main-job.md: On a multi-node Ray cluster)"
        )
    return {"RAY_AUTH_MODE": "token"}


def _apply_ray_auth(cfg: ClusterConfig) -> None:
    env = ray_auth_env(cfg, os.environ)
    os.environ.update(env)
    if env.get("RAY_AUTH_MODE") == "token":
        # Ray reads its config (the auth mode included) once, at import: reload it, as
        # Ray itself does when it turns token auth on (authentication_token_setup.py).
        try:
            from ray._raylet import Config  # type: ignore[attr-defined]  # not in Ray's stubs

            Config.initialize("")
        except (ImportError, AttributeError):  # another Ray: it reads the variable at init
            pass


def start_ray(cfg: ClusterConfig, learner_ranks: int = 1, replicas: int = 1) -> dict[str, Any]:
    """Start or join Ray; returns the cluster's resources. A local start holds ``learner_ranks``
    (learner.world_size) ranks and generator ``replicas``."""
    import ray

    if ray.is_initialized():  # a session the caller started (tests, benchmarks): its authentication is settled
        if cfg.ray_auth == "disabled":
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        return ray.cluster_resources()
    # Actors find the repo's packages through the installed (editable) package;
    # the driver's working directory does not matter.
    _apply_ray_auth(cfg)
    if cfg.address:
        ray.init(address=cfg.address, log_to_driver=cfg.actor_logs)
    else:
        # address="local": a new instance here, never a cluster someone else
        # started on this machine (`ray start`, a test's cluster).
        cfg.check_local_cpus()
        cfg.check_local_resources(learner_ranks=learner_ranks, replicas=replicas)
        ray.init(
            address="local",
            num_cpus=cfg.local_cpus(learner_ranks, replicas),
            include_dashboard=False,
            log_to_driver=cfg.actor_logs,
            object_store_memory=int(cfg.object_store_gb * 2**30),
        )
    return ray.cluster_resources()


def actor_nodes(handles: Mapping[str, Any], key: str = "IPAddress") -> dict[str, str]:
    """name -> the node each actor runs on, by ``key`` of its address (IPAddress, or NodeID);
    "?" where Ray does not say (not yet placed: the nil node id, or dead). From the GCS's actor table: no
    dashboard needed."""
    try:
        from ray._private import state
    except ImportError:
        return {name: "?" for name in handles}
    out = {}
    for name, handle in handles.items():
        try:
            info = state.actors(actor_id=handle._actor_id.hex())
            value = (info.get("Address") or {}).get(key) or "?"
            # An actor not placed yet has the nil node id (all f): no node (counted as one, it
            # hid the node chosen for it, and two replicas went to one node of two).
            out[name] = "?" if key == "NodeID" and set(value) == {"f"} else value
        except Exception:  # a private API: never let the record stop a run
            out[name] = "?"
    return out


def least_used_node(
    nodes: Sequence[Mapping[str, Any]], ask: Mapping[str, float], used: Mapping[str, int], prefer: str | None = None
) -> str | None:
    """The node for one more actor of a kind that should spread (generator replicas): among the
    alive nodes of ``ray.nodes()`` whose total resources can hold ``ask``, one that hosts the
    fewest of ``used`` (node id -> actors of that kind already there); on a tie ``prefer`` (the
    driver's node) if it is among them, else the first by node id. None when at most one node
    can hold it (nothing to spread over: Ray places it, and says so when nothing fits).

    Ray's own SPREAD is best-effort round-robin over an index every SPREAD request shares: two
    replicas could land on one node while another stood empty (seen in CI).
    A node must hold one more replica beside the ``used`` ones: Ray keeps a (soft) node-affinity
    request waiting on a node that exists but is full, for ever. ``nodes`` may carry what is left
    after a reservation (seal/runtime/layout_guard.py free_nodes: the learner's placement group)."""

    def holds(n: Mapping[str, Any], taken: int) -> bool:
        have = n.get("Resources") or {}
        return all(float(have.get(k, 0.0)) - taken * v >= v - 1e-9 for k, v in ask.items() if v > 0)

    capable = [n for n in nodes if n.get("Alive") and holds(n, 0)]
    able = sorted(n["NodeID"] for n in capable if holds(n, used.get(n["NodeID"], 0)))
    if len(capable) < 2 or not able:  # nothing to spread over, or every node full: Ray places (or queues) it
        return None
    fewest = min(used.get(node, 0) for node in able)
    candidates = [node for node in able if used.get(node, 0) == fewest]
    return prefer if prefer in candidates else candidates[0]
