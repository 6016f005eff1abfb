"""What a chaos run sends: its plan, valid traffic across tenants and agents, hostile
records of every kind in :data:`BAD_KINDS`, and an LLM that fails on purpose."""

from __future__ import annotations

import json
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.bench.openai_fake import Reply as ChatReply
from memstream.codec.wire import encode_event
from memstream.domain.events import EventBase, MemoryAdded, MessageObserved, Scope
from memstream.streams.topics import Topics

BAD_KINDS: tuple[str, ...] = (
    "random_bytes",
    "truncated_json",
    "wrong_types",
    "missing_scope",
    "oversized_content",
    "unknown_type",
    "control_chars",
    "hostile_header",
    "duplicate_header",
    "forged_system",
)


@dataclass(frozen=True)
class ChaosPlan:
    """What to break and how much traffic to push through it."""

    events: int = 100_000
    turn_share: float = 0.2
    """Share of the valid events that are conversation turns (the rest are memories)."""
    worker_kills: int = 20
    broker_restarts: int = 3
    bad_inputs: int = 10_000
    tenants: int = 50
    agents: int = 3
    """Agents per tenant, all of one user: the searches pinned to one agent check the
    agent boundary inside a memory space too."""
    searches: int = 10_000
    llm_failure_rate: float = 0.3
    produce_seconds: float = 300.0
    """Production is paced over this window, so faults land while traffic flows."""
    settle_timeout_s: float = 900.0
    seed: int = 7

    @classmethod
    def full(cls) -> "ChaosPlan":
        return cls()

    @classmethod
    def quick(cls) -> "ChaosPlan":
        """10,000 events with every fault kind, in a few minutes."""
        return cls(
            events=10_000,
            worker_kills=6,
            broker_restarts=1,
            bad_inputs=1_000,
            searches=2_000,
            produce_seconds=90.0,
            settle_timeout_s=600.0,
        )

    def __post_init__(self) -> None:
        if self.events < 1 or self.tenants < 1 or self.agents < 1:
            raise ValueError("events, tenants and agents must be positive")
        if not 0.0 <= self.turn_share <= 1.0 or not 0.0 <= self.llm_failure_rate < 1.0:
            raise ValueError("turn_share must be in [0, 1] and llm_failure_rate in [0, 1)")


# ------------------------------------------------------------------------------ traffic
_VOCAB = (
    "apple budget camera dentist engine forest garden harbor invoice jacket kettle ladder "
    "market notebook orange pencil quarter rocket saddle ticket umbrella violin window "
    "yogurt zebra anchor bridge candle desert eagle falcon glacier hammer island jungle "
    "kayak lantern meadow needle oyster piano quiz river sunset tunnel valley wagon "
    "concert recipe holiday meeting project deadline report tennis guitar painting"
).split()


def tenant_scope(i: int, agent: int = 0) -> Scope:
    """Tenant ``i``'s memory space (every tenant its own team: the strongest isolation),
    written by its agent ``agent`` (agents share the tenant's one user)."""
    return Scope(team_id=f"chaos-t{i:02d}", user_id="main", agent_id=f"a{agent}")


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(words))


_T0 = datetime(2025, 1, 6, 9, 0, tzinfo=timezone.utc)


def make_valid_events(plan: ChaosPlan, rng: random.Random, run_id: str) -> list[EventBase]:
    """The valid traffic: memories and turns spread over the tenants (seeded).

    Each memory names its tenant in its text; each turn is an ordinary sentence that
    passes the quality gate, in sessions of about 30 turns."""
    events: list[EventBase] = []
    sessions = [0] * plan.tenants
    turns_in_session = [0] * plan.tenants
    for j in range(plan.events):
        t = rng.randrange(plan.tenants)
        agent = rng.randrange(plan.agents)
        scope = tenant_scope(t, agent)
        when = _T0 + timedelta(minutes=j)
        if rng.random() < plan.turn_share:
            if turns_in_session[t] >= 30:
                sessions[t] += 1
                turns_in_session[t] = 0
            turns_in_session[t] += 1
            speaker = "Ana" if j % 2 else "Ben"
            events.append(
                MessageObserved(
                    scope=scope,
                    message_id=f"{run_id}-turn-{j}",
                    role="user",
                    speaker=speaker,
                    content=f"I planned the {_sentence(rng, 2)} with the {_sentence(rng, 3)} on day {j}.",
                    occurred_at=when,
                    recorded_at=when,
                    session_id=f"s{sessions[t]}",
                    producer="memstream-bench-chaos",
                )
            )
        else:
            events.append(
                MemoryAdded(
                    scope=scope,
                    memory_id=f"{run_id}-mem-{j}",
                    content=f"Tenant {t:02d} agent a{agent} note {j}: {_sentence(rng, rng.randint(4, 12))}",
                    occurred_at=when,
                    recorded_at=when,
                    producer="memstream-bench-chaos",
                )
            )
    return events


@dataclass(frozen=True)
class BadRecord:
    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def make_bad_records(n: int, rng: random.Random, topics: Topics, tenants: int) -> list[BadRecord]:
    """``n`` malformed records, the kinds of :data:`BAD_KINDS` in turn, on both
    source topics (a bad turn must not stop the extractor either)."""
    out: list[BadRecord] = []
    for i in range(n):
        kind = BAD_KINDS[i % len(BAD_KINDS)]
        scope = tenant_scope(rng.randrange(tenants))
        turn = i % 2 == 0
        topic = topics.messages if turn else topics.events
        if turn:
            good: EventBase = MessageObserved(
                scope=scope, message_id=f"bad-{i}", content=f"bad input {i} {_sentence(rng, 4)}"
            )
        else:
            good = MemoryAdded(scope=scope, memory_id=f"bad-{i}", content=f"bad input {i} {_sentence(rng, 4)}")
        record = encode_event(good)
        body: dict[str, Any] = json.loads(record.value)
        value: bytes | None
        if kind == "random_bytes":
            value = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
        elif kind == "truncated_json":
            value = record.value[: rng.randint(1, len(record.value) - 2)]
        elif kind == "wrong_types":
            field_name, wrong = rng.choice([("content", 12345), ("occurred_at", 1700000000), ("scope", "acme")])
            body[field_name] = wrong
            value = json.dumps(body).encode()
        elif kind == "missing_scope":
            body.pop("scope", None)
            value = json.dumps(body).encode()
        elif kind == "oversized_content":
            limit = 32_000 if turn else 8_000
            body["content"] = "x" * (limit + 1 + rng.randint(0, 1000))
            value = json.dumps(body).encode()
        elif kind == "unknown_type":
            body["type"] = rng.choice(["MemoryTeleported", "memoryadded", "Event", ""])
            value = json.dumps(body).encode()
        elif kind == "hostile_header":  # a reader's marker with bad hex and an invalid body (once a stall)
            value = record.value[: len(record.value) // 2]
            out.append(BadRecord(kind, topic, record.key, value, (("memstream-opened", b"zz"), ("x-junk", b"\xff\xfe"))))
            continue
        elif kind == "duplicate_header":
            value = record.value
            out.append(BadRecord(kind, topic, record.key, value, (*record.headers, ("memstream-type", b"\xff"))))
            continue
        elif kind == "forged_system":  # claims the extractor, without the worker's signature
            body["producer"] = "memstream-extractor"
            value = json.dumps(body).encode()
        elif kind == "control_chars":
            text = str(body["content"])
            cut = rng.randint(0, len(text))
            body["content"] = text[:cut] + rng.choice(["\x00", "\x07", "\x1b[31m", "\x08"]) + text[cut:]
            value = json.dumps(body).encode()
        else:  # pragma: no cover - BAD_KINDS is exhaustive
            raise AssertionError(kind)
        out.append(BadRecord(kind, topic, record.key, value))
    return out


# ------------------------------------------------------------------------------ flaky LLM
_NEW_TURNS = re.compile(r"NEW TURNS[^\n]*\n(.*?)(?:\n\s*\n|\Z)", re.S)
_TURN_LINE = re.compile(r"^\[(t\d+)\][^|]*\|\s*(?:\w+)(?: ([^:]+))?: (.*)$")
_JUDGE_ITEM = re.compile(r"^N(\d+) ", re.M)


class FlakyLLM:
    """A scripted extraction model that fails ``rate`` of its calls.

    Failures, in turn: a delay longer than the client's timeout, an HTTP 500, a garbage
    body, a dropped connection, an answer that is not JSON. Successful extraction
    answers make one memory per new turn, citing it; judgment answers store every new
    memory. Thread-safe (the HTTP server answers from several threads)."""

    FAILURES = ("timeout", "http_500", "garbage_body", "dropped", "not_json")

    def __init__(self, rate: float, seed: int, timeout_s: float) -> None:
        self.rate = rate
        self.timeout_s = timeout_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.failures: Counter[str] = Counter()
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> ChatReply:
        with self._lock:
            self.calls += 1
            fail = self._rng.random() < self.rate
            kind = self.FAILURES[self.failures.total() % len(self.FAILURES)] if fail else None
            if kind:
                self.failures[kind] += 1
        if kind == "timeout":
            return ChatReply(content="{}", delay=self.timeout_s + 1.0)
        if kind == "http_500":
            return ChatReply(status=500)
        if kind == "garbage_body":
            return ChatReply(raw=b"\x00\xff<html>upstream error")
        if kind == "dropped":
            return ChatReply(drop=True)
        if kind == "not_json":
            return ChatReply(content="Sure! Here are the memories you asked for: none, sorry.")
        prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages") or ())
        if "NEW MEMORIES AND THEIR CANDIDATES" in prompt:
            numbers = sorted({int(n) for n in _JUDGE_ITEM.findall(prompt)})
            decisions = [{"new": n, "action": "store", "links": [], "reason": "new information"} for n in numbers]
            return ChatReply(content=json.dumps({"decisions": decisions}))
        match = _NEW_TURNS.search(prompt)
        memories: list[dict[str, Any]] = []
        for line in (match.group(1) if match else "").splitlines():
            m = _TURN_LINE.match(line.strip())
            if not m:
                continue
            alias, speaker, text = m.group(1), (m.group(2) or "The user").strip(), m.group(3).strip()
            memories.append(
                {
                    "content": f"{speaker} said: {text}"[:2000],
                    "type": "episodic",
                    "priority": 50,
                    "source_ids": [alias],
                    "timestamp": None,
                    "timestamp_start": None,
                    "timestamp_end": None,
                    "entities": [{"name": speaker, "kind": "person"}],
                }
            )
        scenes = [{"title": "chat", "message_ids": [m["source_ids"][0] for m in memories], "memories": memories}]
        return ChatReply(content=json.dumps({"scenes": scenes if memories else []}))
