"""The driver's typed actor handles (seal/runtime/handles.py) name methods the actor classes have:
a method renamed on the actor fails here, not when the run first calls it."""

from __future__ import annotations

import pytest

from actors.coordinator.service import CoordinatorService
from actors.env_actor import EnvActor
from actors.generation.async_vllm_engine import AsyncVllmGenerator
from actors.generation.server import GeneratorServer
from seal.runtime.handles import CoordinatorHandle, EnvActorHandle, ReplicaHandle


@pytest.mark.parametrize(
    "protocol, actor",
    [
        (CoordinatorHandle, CoordinatorService),
        (EnvActorHandle, EnvActor),
        (ReplicaHandle, GeneratorServer),
        (ReplicaHandle, AsyncVllmGenerator),
    ],
)
def test_every_remote_method_of_a_handle_is_a_method_of_its_actor(protocol, actor):
    names = list(protocol.__annotations__)
    assert names  # the protocol names some
    missing = [n for n in names if not callable(getattr(actor, n, None))]
    assert not missing, f"{actor.__name__} has no {missing}"
