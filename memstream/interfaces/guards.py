"""What the HTTP API checks before it reads or writes on a key's behalf, beyond the
event model: the scope a read resolves to, system events, the injection gate on
client memories, and the stored rows a write names (``memstream.domain.access`` is
the rule; this is where the API answers it with 403, 409 or 422)."""

from __future__ import annotations

from pydantic import ValidationError

from memstream.banks import Principal
from memstream.domain.access import ReadScope, client_content_problem, system_claim
from memstream.domain.events import EventBase, MemoryAdded, MemoryLinked, Scope
from memstream.interfaces.errors import ApiError
from memstream.interfaces.service import MemoryService

__all__ = ["read_scope", "write_scope", "forbidden", "check_client_event", "check_owners"]


def read_scope(
    principal: Principal, team_id: str | None, user_id: str | None, agent_id: str | None = None
) -> ReadScope:
    """What a read may see (``AccessScope.read_scope``): the space it names within the
    key's bank, confined to the key's agent when the bank pins one."""
    access = principal.access
    if team_id is not None and team_id != access.team_id:
        raise forbidden(principal, f"team {team_id!r}")
    try:
        return access.read_scope(user_id, agent_id)
    except (PermissionError, ValidationError) as exc:
        raise _scope_error(principal, exc) from None


def write_scope(principal: Principal, team_id: str | None, user_id: str | None, agent_id: str | None) -> Scope:
    """The scope a shortcut write lands in (``AccessScope.resolve``): omitted parts
    default from the key's bank; anything outside it is a 403."""
    access = principal.access
    if team_id is not None and team_id != access.team_id:
        raise forbidden(principal, f"team {team_id!r}")
    try:
        return access.resolve(user_id, agent_id)
    except (PermissionError, ValidationError) as exc:
        raise _scope_error(principal, exc) from None


def _scope_error(principal: Principal, exc: PermissionError | ValidationError) -> ApiError:
    """A scope outside the key's bank answers 403; a malformed id 422."""
    if isinstance(exc, PermissionError):
        return forbidden(principal, str(exc))
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "scope"
    return ApiError(422, "validation_error", f"{where}: {err.get('msg', 'invalid')}")


def forbidden(principal: Principal, what: str) -> ApiError:
    return ApiError(
        403,
        "forbidden",
        f"this key's bank {principal.bank.name!r} covers {principal.access.describe()} only",
        {"bank": principal.bank.name, "requested": what},
    )


def check_client_event(event: EventBase) -> None:
    """Keys write client events only (403 ``system_event``), and a client text that
    tries to instruct the model that will read it (a memory, a decision, a link's
    reason: ``client_texts``) is refused (422 ``prompt_injection``)."""
    claim = system_claim(event)
    if claim is not None:
        raise ApiError(403, "system_event", f"{claim}; a key writes client events only", {"type": event.type})
    problem = client_content_problem(event)
    if problem is not None:
        raise ApiError(422, "prompt_injection", f"content refused by the quality gate: {problem}",
                       {"rule": "prompt_injection"})


async def check_owners(service: MemoryService, principal: Principal, event: EventBase) -> None:
    """The stored rows a client write names must be the caller's: a memory id owned by
    another agent is never written over (409), a link's ends must lie in the caller's
    scope (403) and belong to the link's agent (422: the projector would ignore it)."""
    if isinstance(event, MemoryAdded):
        owner = await service.memory_owner(event.scope, event.memory_id)
        if owner is not None and owner != event.scope.agent_id:
            raise ApiError(
                409, "memory_id_taken",
                f"memory id {event.memory_id!r} belongs to another agent of this space; choose another id",
                {"memory_id": event.memory_id},
            )
    elif isinstance(event, MemoryLinked):
        for end in (event.from_memory_id, event.to_memory_id):
            owner = await service.memory_owner(event.scope, end)
            if owner is None:
                continue
            if not principal.access.allows(event.scope.model_copy(update={"agent_id": owner})):
                raise ApiError(
                    403, "forbidden", f"memory {end!r} lies outside this key's scope; a link needs both ends in it",
                    {"bank": principal.bank.name, "memory_id": end},
                )
            if owner != event.scope.agent_id:
                raise ApiError(
                    422, "invalid_event",
                    f"memory {end!r} belongs to agent {owner!r}: a link's scope must name its memories' agent",
                )
