"""Helpers the console tests share: a logged-in console client per bank (cookies as
a browser keeps them), the operator's, and one space's data written through the API."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from memstream.interfaces.console.session import CSRF_COOKIE, ensure_operator_token

from tests.interfaces.iface_stack import Stack

__all__ = ["login", "operator_login", "csrf_of", "Written", "write_story"]


def csrf_of(client: httpx.Client) -> str:
    return str(client.cookies.get(CSRF_COOKIE, path="/console"))


def _login(stack: Stack, credential: str) -> httpx.Client:
    client = httpx.Client(base_url=stack.base_url, timeout=60, follow_redirects=False)
    assert client.get("/console/login").status_code == 200
    resp = client.post("/console/login", data={"credential": credential, "csrf": csrf_of(client)})
    assert resp.status_code == 303, resp.text
    return client


def login(stack: Stack, bank: str) -> httpx.Client:
    """A console session of ``bank``'s key (redirected to the spaces page)."""
    return _login(stack, stack.keys[bank])


def operator_login(stack: Stack) -> httpx.Client:
    token = ensure_operator_token(stack.settings).read_text().strip()
    client = _login(stack, token)
    return client


@dataclass(frozen=True)
class Written:
    mark: str
    memory_id: str
    old_id: str
    turn_id: str
    subject: str
    positions: list[str]
    waiting: str
    """The subject of the decision that stays pending."""

    @property
    def secrets(self) -> tuple[str, ...]:
        """What only the owner's pages may show: the texts written and the subject."""
        return (f"Lisbon {self.mark}", f"Porto {self.mark}", f"{self.mark} we talked", f"decided {self.mark}", self.subject,
                f"waiting {self.mark}", self.waiting, f"p-{self.mark}")


def write_story(stack: Stack, bank: str) -> Written:
    """Through the API with ``bank``'s key: a conversation turn, a memory citing it, an
    older memory the new one supersedes, a decision its outcome settles, and one that
    stays pending with a partial outcome; returns once the view holds the memories."""
    mark = uuid.uuid4().hex[:10]
    h = stack.headers(bank)
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        session = f"s-{mark}"
        turns = [{"content": f"before {mark} we talked about boats", "message_id": f"pre-{mark}", "role": "user"},
                 {"content": f"I moved to Lisbon {mark}", "message_id": f"m-{mark}", "role": "user"},
                 {"content": f"noted, Lisbon {mark}", "message_id": f"post-{mark}", "role": "assistant"}]
        positions: list[str] = []
        for i, t in enumerate(turns):
            r = c.post("/v1/messages", headers=h, json={
                "session_id": session, "messages": [{**t, "occurred_at": f"2026-01-0{i + 1}T10:00:00Z"}]})
            assert r.status_code == 202, r.text
            positions += [e["position"] for e in r.json()["events"]]
        old = _post(c, "/v1/memories", h, {"content": f"lives in Porto {mark}", "memory_id": f"old-{mark}"})
        new = _post(c, "/v1/memories", h, {"content": f"lives in Lisbon {mark}", "memory_id": f"new-{mark}",
                                          "source_message_ids": [f"m-{mark}"], "session_id": session})
        link = _post(c, "/v1/events", h, {"type": "MemoryLinked", "schema_version": 1, "from_memory_id": new["memory_id"],
                                         "to_memory_id": old["memory_id"], "relation": "supersedes", "reason": f"moved {mark}"})
        subject = f"SUBJ{mark[:6].upper()}"
        decision = _post(c, "/v1/decisions", h, {"subject": subject, "rating": "buy", "horizon_days": 1,
                                                 "decision_text": f"decided {mark}"})
        # its outcome: the reflector settles the decision and writes a lesson to the view
        _post(c, "/v1/events", h, {"type": "OutcomeObserved", "schema_version": 1, "outcome_id": f"o-{mark}",
                                   "subject": subject, "raw_return": 0.05, "alpha": 0.05, "horizon_days": 1,
                                   "decision_id": decision["decision_id"]})
        # and one still pending: its only outcome covers 3 of its 10 horizon days
        waiting = f"WAIT{mark[:6].upper()}"
        pending = _post(c, "/v1/decisions", h, {"subject": waiting, "rating": "sell", "horizon_days": 10,
                                                "decision_text": f"waiting {mark}"})
        _post(c, "/v1/events", h, {"type": "OutcomeObserved", "schema_version": 1, "outcome_id": f"p-{mark}",
                                   "subject": waiting, "raw_return": -0.01, "horizon_days": 3,
                                   "decision_id": pending["decision_id"]})
        positions += [old["position"], new["position"], link["position"]]
        r = c.get(f"/v1/memories/{new['memory_id']}", headers=h, params={"min_position": positions, "wait_s": 20})
        assert r.status_code == 200, r.text
    return Written(mark, new["memory_id"], old["memory_id"], f"m-{mark}", subject, positions, waiting)


def _post(c: httpx.Client, path: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(path, headers=headers, json=body)
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def text_of(html: str) -> str:
    """The visible text of a page, roughly (tags dropped), for 'never shows' checks."""
    return re.sub(r"<[^>]+>", " ", html)
