"""The values the gateway answers with, as frozen dataclasses."""

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union

#: Statuses after which nothing more happens to an operation.
TERMINAL_STATUSES = frozenset({"succeeded", "failed_final"})


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Action:
    """An operation as the gateway reports it (never its payload).

    ``terminal`` is true once nothing more will happen (``succeeded`` or
    ``failed_final``); ``result`` is the provider's saved answer, if any.
    """

    key: str
    action_type: str
    status: str
    terminal: bool
    attempt: int
    result: Any
    provider_operation_id: Optional[str]
    error_code: Optional[str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Action":
        """Build an Action from the gateway's JSON object (``KeyError`` /
        ``TypeError`` / ``ValueError`` when it is not one)."""
        status = str(data["status"])
        terminal = data.get("terminal")
        return cls(
            key=str(data["key"]),
            action_type=str(data.get("action_type") or ""),
            status=status,
            terminal=bool(terminal) if terminal is not None else status in TERMINAL_STATUSES,
            attempt=int(data.get("attempt") or 0),
            result=data.get("result"),
            provider_operation_id=_opt_str(data.get("provider_operation_id")),
            error_code=_opt_str(data.get("error_code")),
        )


@dataclass(frozen=True)
class Enqueued:
    """New: recorded (``status`` is ``planned``) and published; it will run once.

    ``links`` holds the gateway's relative URLs, ``self`` and ``wait``.
    """

    key: str
    status: str
    links: Dict[str, str]


@dataclass(frozen=True)
class Duplicate:
    """Requested before: nothing new happens. This is where the first request stands,
    with its saved result (``action`` is the whole operation)."""

    key: str
    status: str
    result: Any
    provider_operation_id: Optional[str]
    error_code: Optional[str]
    action: Action


@dataclass(frozen=True)
class Conflict:
    """The same business identity was requested before with a different payload:
    refused, nothing ran. To act again on purpose, increase ``revision``."""

    key: str
    message: str


#: What :meth:`oncely.Client.enqueue` returns.
EnqueueResult = Union[Enqueued, Duplicate, Conflict]


@dataclass(frozen=True)
class ActionType:
    """An action type the token may enqueue: its MCP ``tool`` name, a description and
    the JSON Schema its payload must satisfy (``{}`` when none is declared)."""

    name: str
    tool: str
    description: str
    payload_schema: Dict[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ActionType":
        """Build an ActionType from one entry of ``GET /v1/action-types``."""
        schema = data.get("payload_schema")
        return cls(
            name=str(data["name"]),
            tool=str(data.get("tool") or ""),
            description=str(data.get("description") or ""),
            payload_schema=dict(schema) if isinstance(schema, Mapping) else {},
        )
