"""The training interface's state as the control plane carries it (replay/control_messages.py
InterfaceStateMessage): the same fields as env_pool's InterfaceState, which replay cannot import,
and a round trip through msgpack (what the wire uses) and JSON (rounds.jsonl) that changes nothing."""

from __future__ import annotations

import dataclasses
import json

import msgpack
import pytest

from env_pool.interface.state import InterfaceState
from replay.control_messages import InterfaceStateMessage, InterfaceUpdate, RoundEnd

STATE = InterfaceState(
    version=3,
    schema_lite=True,
    guidelines=True,
    active_guidelines=("cautious_call", "scope"),
    category_guidelines={"tools": ("format",)},
)


def test_the_message_has_the_interface_states_fields():
    assert [f.name for f in dataclasses.fields(InterfaceStateMessage)] == [
        f.name for f in dataclasses.fields(InterfaceState)
    ]


def test_a_state_survives_msgpack_and_json_and_reads_back_as_the_same_state():
    message = InterfaceStateMessage.from_dict(STATE.to_dict())
    through_msgpack = InterfaceStateMessage.from_dict(msgpack.unpackb(msgpack.packb(message.to_dict())))
    through_json = InterfaceStateMessage.from_dict(json.loads(json.dumps(message.to_dict())))
    assert through_msgpack == message == through_json  # lists back to tuples
    assert InterfaceState.from_dict(through_msgpack.to_dict()) == STATE
    update = InterfaceUpdate(3, message)
    end = RoundEnd(3, STATE.active_guidelines, 0, message)
    assert update.state.active_guidelines == end.state.active_guidelines == ("cautious_call", "scope")


def test_a_field_missing_or_unknown_is_refused_by_name():
    fields = STATE.to_dict()
    with pytest.raises(ValueError, match="worked_examples"):
        InterfaceStateMessage.from_dict({k: v for k, v in fields.items() if k != "worked_examples"})
    with pytest.raises(ValueError, match="colour"):
        InterfaceStateMessage.from_dict({**fields, "colour": "blue"})
