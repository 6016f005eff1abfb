"""The HTTP API's request and response bodies (the shapes ``docs/openapi.json``
documents)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.domain.events import MAX_MEMORY_CHARS, MAX_MESSAGE_CHARS

__all__ = [
    "ScopeIn",
    "EntityIn",
    "MemoryIn",
    "MessageIn",
    "MessagesIn",
    "DecisionIn",
    "Accepted",
    "MemoryAccepted",
    "DecisionAccepted",
    "MessagesAccepted",
    "SearchOut",
    "Health",
]


class ScopeIn(BaseModel):
    """A scope in a shortcut request. Omitted parts default from the key's bank."""

    model_config = ConfigDict(extra="forbid")

    team_id: str | None = None
    user_id: str | None = None
    agent_id: str | None = None


class EntityIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str = "other"


class MemoryIn(BaseModel):
    """``POST /v1/memories``: one memory, written as a ``MemoryAdded`` event."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(max_length=MAX_MEMORY_CHARS, description="The memory: one self-contained statement.")
    memory_id: str | None = Field(default=None, description="Your id for the memory; generated when omitted.")
    memory_type: str = Field(default="episodic", description="persona, episodic, instruction, work_fact, work_task, work_method or work_artifact.")
    priority: int = Field(default=50, ge=0, le=100)
    scene: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    source_message_ids: list[str] = Field(default_factory=list)
    entities: list[EntityIn] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    timestamp: datetime | None = Field(default=None, description="When the remembered thing happened (ISO 8601 with offset).")
    timestamp_start: datetime | None = None
    timestamp_end: datetime | None = None
    occurred_at: datetime | None = None
    scope: ScopeIn | None = None


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(max_length=MAX_MESSAGE_CHARS)
    role: Literal["user", "assistant", "system", "tool"] = "user"
    message_id: str | None = Field(default=None, description="Generated when omitted.")
    speaker: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class MessagesIn(BaseModel):
    """``POST /v1/messages``: conversation turns (L0) for the extractor, in order."""

    model_config = ConfigDict(extra="forbid")

    messages: list[MessageIn] = Field(min_length=1, max_length=500)
    session_id: str | None = None
    scope: ScopeIn | None = None


class DecisionIn(BaseModel):
    """``POST /v1/decisions``: a decision whose outcome is not known yet."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(description="What the decision is about, e.g. a ticker.")
    rating: str = Field(description="buy, overweight, hold, underweight or sell.")
    decision_text: str = Field(max_length=MAX_MEMORY_CHARS)
    horizon_days: int = Field(default=5, ge=1, le=3650, description="Trading days until the outcome is judged.")
    deadline: datetime | None = Field(default=None, description="Expiry without an outcome; defaults from the horizon.")
    decision_id: str | None = None
    occurred_at: datetime | None = None
    session_id: str | None = None
    scope: ScopeIn | None = None


class Accepted(BaseModel):
    """A write Kafka acknowledged."""

    event_id: str
    position: str = Field(description="topic:partition:offset; pass as min_position to read your write.")


class MemoryAccepted(Accepted):
    memory_id: str
    duplicate: bool = Field(
        default=False,
        description="True (status 200): the caller's scope already holds this content, written without a memory_id; "
        "memory_id, event_id and position are the stored memory's and nothing was written. Pass your own memory_id to "
        "write a deliberate repeat.",
    )


class DecisionAccepted(Accepted):
    decision_id: str
    deadline: datetime


class MessagesAccepted(BaseModel):
    events: list[Accepted]
    position: str = Field(description="Position of the last turn (all turns of one space share a partition).")


class SearchOut(BaseModel):
    results: list[dict[str, Any]]
    scope: dict[str, str]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    kafka: bool
    store: bool
    version: str
