"""The training interface state Omega (docs/design.md, the training interface).

A versioned, serializable value: which components are on and which
guidelines are active. Every trajectory carries its ``version``. The default
value (everything off) is the raw benchmark interface used for evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

GUIDELINE_KINDS: tuple[str, ...] = ("cautious_call", "active_respond", "state_aware", "scope", "format")
# Names accepted on the command line for the three components.
COMPONENTS: dict[str, str] = {
    "lite": "schema_lite",
    "feedback": "error_feedback",
    "guidelines": "guidelines",
    "examples": "worked_examples",
}


@dataclass(frozen=True)
class InterfaceState:
    version: int = 0
    # phi_schema "observation_lite"
    schema_lite: bool = False
    schema_show_types: bool = False
    schema_drop_optional: bool = False
    # phi_err "tool feedback"
    error_feedback: bool = False
    # phi_cap "capability guidelines"
    guidelines: bool = False
    # Worked tool-call exchanges shown as earlier chat turns (interface/examples.py):
    # they teach the call format only, never a task's answer.
    worked_examples: bool = False
    active_guidelines: tuple[str, ...] = ()
    # Optional per-category guidelines (category -> kinds); falls back to the global list.
    category_guidelines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise lists (from YAML or JSON) so equal states compare equal.
        object.__setattr__(self, "active_guidelines", tuple(self.active_guidelines))
        object.__setattr__(
            self, "category_guidelines", {k: tuple(v) for k, v in dict(self.category_guidelines).items()}
        )
        for kind in (*self.active_guidelines, *(k for ks in self.category_guidelines.values() for k in ks)):
            if kind not in GUIDELINE_KINDS:
                raise ValueError(f"unknown guideline kind {kind!r}; expected one of {GUIDELINE_KINDS}")
        if self.version < 0:
            raise ValueError("interface version must be >= 0")

    @property
    def is_raw(self) -> bool:
        return not (
            self.schema_lite or self.error_feedback or self.worked_examples or (self.guidelines and self._any_guideline)
        )

    @property
    def _any_guideline(self) -> bool:
        return bool(self.active_guidelines) or any(self.category_guidelines.values())

    def guidelines_for(self, category: str | None) -> tuple[str, ...]:
        if not self.guidelines:
            return ()
        if category is not None and category in self.category_guidelines:
            return tuple(self.category_guidelines[category])
        return self.active_guidelines

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["active_guidelines"] = list(self.active_guidelines)
        d["category_guidelines"] = {k: list(v) for k, v in self.category_guidelines.items()}
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InterfaceState:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown interface fields {sorted(unknown)}")
        d = dict(data)
        d["active_guidelines"] = tuple(d.get("active_guidelines", ()))
        d["category_guidelines"] = {k: tuple(v) for k, v in d.get("category_guidelines", {}).items()}
        return cls(**d)

    def with_components(self, names: str | list[str]) -> InterfaceState:
        """Switch components on by their short names: lite, feedback, guidelines."""
        items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
        changes: dict[str, Any] = {}
        for name in items:
            if name not in COMPONENTS:
                raise ValueError(f"unknown interface component {name!r}; expected some of {sorted(COMPONENTS)}")
            changes[COMPONENTS[name]] = True
        return replace(self, **changes)

    def bumped(self, **changes: Any) -> InterfaceState:
        """A new version with the changes; the same value if nothing changes."""
        new = replace(self, **changes)
        return self if new == self else replace(new, version=self.version + 1)


RAW_INTERFACE = InterfaceState()
