from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union


@dataclass(frozen=True)
class Action:
    """An operation as the gateway reports it (never its payload)."""

    key: str
    action_type: str
    status: str
    terminal: bool
    attempt: int
    result: Optional[Any] = None
    provider_operation_id: Optional[str] = None
    error_code: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Action":
        return cls(
            key=str(d["key"]),
            action_type=str(d.get("action_type", "")),
            status=str(d["status"]),
            terminal=bool(d.get("terminal", False)),
            attempt=int(d.get("attempt", 0)),
            result=d.get("result"),
            provider_operation_id=d.get("provider_operation_id"),
            error_code=d.get("error_code"),
        )


@dataclass(frozen=True)
class Enqueued:
    """New: recorded and published; it will run once."""

    key: str
    status: str
    links: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Duplicate:
    """Requested before: nothing new happens; this is where it stands."""

    key: str
    status: str
    result: Optional[Any]
    provider_operation_id: Optional[str]
    error_code: Optional[str]
    action: Action


@dataclass(frozen=True)
class Conflict:
    """The same identity was requested with a different payload: refused, nothing ran."""

    key: str
    message: str


EnqueueResult = Union[Enqueued, Duplicate, Conflict]


@dataclass(frozen=True)
class ActionType:
    """A configured action type and the JSON Schema of its payload."""

    name: str
    tool: str
    description: str
    payload_schema: Dict[str, Any]
