"""The values the gateway answers with, as frozen dataclasses."""

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, Mapping, Optional, Union

#: Statuses after which nothing more happens to an operation: ``succeeded``,
#: ``failed_final``, and the never-sent ``rejected``, ``cancelled``, ``expired``.
TERMINAL_STATUSES = frozenset({"succeeded", "failed_final", "rejected", "cancelled", "expired"})

#: An RFC 3339 time: date, ``T`` (or a space), time, optional fraction, ``Z`` or an offset.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})"
)


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def parse_time(value: str) -> datetime:
    """An RFC 3339 time (``2026-12-08T09:00:00.000Z``) as a timezone-aware datetime
    (``ValueError`` when it is not one). Any fraction is cut to microseconds; Python 3.9's
    ``fromisoformat`` takes neither ``Z`` nor every fraction length."""
    m = _RFC3339.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    date, clock, fraction, offset = m.groups()
    text = f"{date}T{clock}"
    if fraction:
        text += "." + (fraction + "000000")[:6]
    text += "+00:00" if offset in ("Z", "z") else offset
    return datetime.fromisoformat(text)


def _opt_time(value: Any) -> Optional[datetime]:
    return None if value is None else parse_time(str(value))


def format_time(value: Union[datetime, str]) -> str:
    """A ``not_before`` / ``expires_at`` argument as the gateway takes it: a
    timezone-aware datetime as RFC 3339 in UTC; a string as it is (the gateway checks
    it). A naive datetime is a ``ValueError``: the instant it means is unknown."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ValueError(
                "a naive datetime names no instant: give it a timezone "
                "(datetime.now(timezone.utc) + timedelta(...))"
            )
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, str):
        if not value:
            raise ValueError("a time must not be empty")
        return value
    raise TypeError(
        "a time is a timezone-aware datetime or an RFC 3339 string, "
        f"not {type(value).__name__}"
    )


@dataclass(frozen=True)
class Action:
    """An operation as the gateway reports it (never its payload).

    ``status`` is one of ``planned``, ``deferred`` (scheduled, or throttled),
    ``awaiting_approval`` (held by an approval rule), ``executing``,
    ``failed_retryable``, ``unknown``, ``succeeded``, ``failed_final``, ``rejected``,
    ``cancelled``, ``expired``. ``terminal`` is true once nothing more will happen (the
    last five, :data:`TERMINAL_STATUSES`); ``result`` is the provider's saved answer, if
    any.

    When an approval rule holds (or held) it: ``held_by_rule`` names the rule,
    ``approvals_needed`` how many different people must approve, ``approval_deadline``
    when it ends ``rejected`` (``approval_timed_out``) if undecided. ``not_before`` and
    ``expires_at`` are the times it was asked for with. The times are timezone-aware
    datetimes; the fields are ``None`` when the gateway does not report them.
    """

    key: str
    action_type: str
    status: str
    terminal: bool
    attempt: int
    result: Any
    provider_operation_id: Optional[str]
    error_code: Optional[str]
    held_by_rule: Optional[str] = None
    approvals_needed: Optional[int] = None
    approval_deadline: Optional[datetime] = None
    not_before: Optional[datetime] = None
    expires_at: Optional[datetime] = None

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
            held_by_rule=_opt_str(data.get("held_by_rule")),
            approvals_needed=_opt_int(data.get("approvals_needed")),
            approval_deadline=_opt_time(data.get("approval_deadline")),
            not_before=_opt_time(data.get("not_before")),
            expires_at=_opt_time(data.get("expires_at")),
        )


@dataclass(frozen=True)
class Enqueued:
    """New: recorded; it will run once. ``status`` is ``planned`` (published),
    ``awaiting_approval`` (held by an approval rule until people approve it) or
    ``deferred`` (scheduled by ``not_before``).

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
class Cancelled:
    """What :meth:`oncely.Client.cancel` returns: cancelled, it will never be sent
    (also when it already was cancelled). ``action`` is the operation now (status
    ``cancelled``)."""

    key: str
    action: Action

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Cancelled":
        """Build a Cancelled from the gateway's ``{"outcome": "cancelled", "action"}``."""
        if data.get("outcome") != "cancelled":
            raise ValueError(f"unexpected outcome {data.get('outcome')!r}")
        action = Action.from_json(data["action"])
        return cls(key=action.key, action=action)


@dataclass(frozen=True)
class Decision:
    """What :meth:`oncely.Client.approve` and :meth:`oncely.Client.reject` return.

    ``outcome`` is ``approved`` (due for a worker now, or at its ``not_before``),
    ``approval_recorded`` (four eyes: ``more_approvals_needed`` more people must
    approve) or ``rejected`` (never sent); ``action`` is the operation now.
    """

    outcome: str
    key: str
    more_approvals_needed: Optional[int]
    action: Action

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Decision":
        """Build a Decision from the gateway's answer to an approval or a rejection."""
        outcome = str(data["outcome"])
        if outcome not in ("approved", "approval_recorded", "rejected"):
            raise ValueError(f"unexpected outcome {outcome!r}")
        action = Action.from_json(data["action"])
        return cls(
            outcome=outcome,
            key=action.key,
            more_approvals_needed=_opt_int(data.get("more_approvals_needed")),
            action=action,
        )


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
