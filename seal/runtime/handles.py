"""The Ray actor handles the driver calls, typed by the remote methods it uses.

A Ray handle is dynamic (``handle.method.remote(...)`` returns an ObjectRef), so mypy sees ``Any``
through it: a misspelt method name surfaces only when the call runs. These protocols name each
method the driver calls on an actor; tests/unit/seal/runtime/test_handles.py holds them to the
actor classes, so a method renamed on one side fails there, not mid-run. A new actor's handle is
cast to its protocol where it is made (Ray's stubs type it ActorHandle[cls]).
"""

from __future__ import annotations

from typing import Any, Protocol, cast


def kill(handle: object, no_restart: bool) -> None:
    """``ray.kill`` for a typed handle."""
    import ray

    ray.kill(cast(Any, handle), no_restart=no_restart)


class RemoteMethod(Protocol):
    """One method of an actor handle: ``.remote(...)`` submits the call and returns its ObjectRef."""

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


class CoordinatorHandle(Protocol):
    """actors/coordinator/service.py CoordinatorService."""

    register_env_actor: RemoteMethod
    unregister_env_actor: RemoteMethod
    record: RemoteMethod  # -> int (tag summaries taken)
    interface: RemoteMethod  # -> InterfaceUpdate
    step_weights: RemoteMethod  # -> dict[str, float]
    end_round: RemoteMethod  # -> RoundEnd
    end_epoch: RemoteMethod
    state: RemoteMethod  # -> CoordinatorState


class EnvActorHandle(Protocol):
    """actors/env_actor.py EnvActor."""

    set_interface: RemoteMethod  # -> int
    run_group: RemoteMethod  # -> GroupReport
    close: RemoteMethod  # -> int (trajectories still sent)
    pid: RemoteMethod  # -> int
    node_id: RemoteMethod  # -> str


class ReplicaHandle(Protocol):
    """A generator replica: actors/generation/server.py GeneratorServer or
    actors/generation/async_vllm_engine.py AsyncVllmGenerator (the same method names)."""

    generate: RemoteMethod  # -> list[GenerationOutput]
    update_weights: RemoteMethod  # -> float (seconds)
    join_weight_group: RemoteMethod  # -> list[int] (the ranks its workers took)
    update_weights_from_group: RemoteMethod  # -> float
    prompt_logprobs: RemoteMethod  # -> list[float] (the weight canary)
    dtype: RemoteMethod  # -> str
    max_model_len: RemoteMethod  # -> int
    stats: RemoteMethod  # -> ReplicaStats (actors/generation/replica_counters.py)
    pid: RemoteMethod  # -> int
    awaiting_weights: RemoteMethod  # -> bool
