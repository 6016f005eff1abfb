"""The record codec: any bytes in, an event, a dead letter with a one-line reason, or
a counted skip out; never an exception. And every reader of the log goes through it."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from memstream.codec.wire import encode_event
from memstream.domain.events import MemoryAdded, Scope, SubjectForgotten
from memstream.domain.log import PositionedEvent
from memstream.sealing import AesGcmKeyWrapper, Keyring, SealedHeader, Subject, seal
from memstream.sealing.keyring import KID_BYTES
from memstream.streams.dead_letters.publisher import DeadLetter, _opened_kid
from memstream.streams.sealing.key_records import forget_order
from memstream.streams.records.batches import RawRecord, decode_batch
from memstream.streams.records.codec import read_record, screen
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.trust.worker_identity import signed_headers

ROOT = Path(__file__).resolve().parents[3]
KEY = b"k" * 32
GOOD = encode_event(MemoryAdded(scope=Scope(team_id="acme", user_id="alice"), memory_id="m1", content="Ana likes tea"))

_names = st.sampled_from(
    ["memstream-type", "memstream-schema-version", "content-type", "memstream-worker", "memstream-opened", "memstream-unopened", "x"]
) | st.text(max_size=20)
_headers = st.lists(st.tuples(_names, st.none() | st.binary(max_size=40) | st.sampled_from([b"zz", b"MemoryAdded", b"2"])), max_size=8)
_values = st.none() | st.binary(max_size=200) | st.just(GOOD.value) | st.builds(lambda b: GOOD.value[: len(b)], st.binary(max_size=80))


def _ring() -> Keyring:
    return Keyring(AesGcmKeyWrapper(b"m" * 32))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.none() | st.binary(max_size=40), value=_values, headers=_headers, sealed=st.booleans())
def test_any_record_ends_as_an_event_a_dead_letter_or_a_skip(key, value, headers, sealed) -> None:  # type: ignore[no-untyped-def]
    if sealed and value is not None:  # under a key nobody holds, or mangled
        ring = _ring()
        data_key, _, _ = ring.new_key(Subject("acme", "alice"))
        value = seal(value, SealedHeader("e", "MemoryAdded", 2, "acme", "alice", "default").encode(), data_key)
    opener = RecordOpener(_ring(), worker_key=KEY)
    item = read_record(opener, "t.events", 0, 7, key, value, headers, trusted=lambda v, h: False)
    assert item is None or isinstance(item, (PositionedEvent, DeadLetter))
    if isinstance(item, DeadLetter):
        assert item.reason.strip() and "\n" not in item.reason
    batch = decode_batch([RawRecord("t.events", 0, 7, key, value, tuple(headers))], worker_key=KEY)
    assert len(batch.events) + len(batch.dead) <= 1 and batch.next_offsets == {("t.events", 0): 8}


def test_a_reader_marker_from_kafka_is_refused_before_opening() -> None:
    for name in ("memstream-opened", "memstream-unopened"):
        item = read_record(None, "t.events", 0, 1, b"globex/bob", b"{", [(name, b"zz")])
        assert isinstance(item, DeadLetter) and name in item.reason
    batch = decode_batch([RawRecord("t.events", 0, 1, b"k", None, (("memstream-unopened", b""),))])
    assert len(batch.dead) == 1  # not silently skipped as a forgotten record
    assert screen(b"k", [("memstream-type", b"MemoryAdded"), ("memstream-type", b"MemoryAdded")])
    assert screen(b"k", list(GOOD.headers)) is None


def test_a_dead_letter_naming_a_malformed_key_id_is_kept_as_it_is() -> None:
    assert _opened_kid([("memstream-opened", b"zz")]) is None
    assert _opened_kid([("memstream-opened", b"\xff")]) is None
    assert _opened_kid([("memstream-opened", b"ab" * KID_BYTES), ("memstream-opened", b"ab" * KID_BYTES)]) is None
    assert _opened_kid([("memstream-opened", b"ab" * KID_BYTES)]) == bytes.fromhex("ab" * KID_BYTES)


def test_only_a_signed_forget_orders_keys_dropped() -> None:
    event = SubjectForgotten(scope=Scope(team_id="acme", user_id="alice"), whole_team=False, key_ids=("ab" * KID_BYTES,))
    rec = encode_event(event)
    assert forget_order(rec.value, rec.headers, KEY) is None
    assert forget_order(rec.value, rec.headers, None) is None
    signed = signed_headers(KEY, rec.value, rec.headers)
    subject, kids = forget_order(rec.value, signed, KEY)  # type: ignore[misc]
    assert (subject.user_id, kids) == ("alice", [bytes.fromhex("ab" * KID_BYTES)])
    assert forget_order(rec.value, signed, b"o" * 32) is None  # another worker's key


# --- every consumer reads through the codec -----------------------------------------

CONSUMERS = {
    "streams/consumer.py": "read_record",  # the SDK consumer
    "streams/projector_feed.py": "screen",  # projector and replay: screened, then decode_batch
    "streams/records/batches.py": "decode_or_dead_letter",
    "memstream/services/extraction/service.py": "read_record",
    "memstream/services/reflection/agent.py": "read_record",
    "streams/sealing/sealer.py": "screen",
    "memstream/cli/events.py": "read_record",  # the CLI tail
    "streams/sealing/keys.py": "forget_order",  # the keys reader
}
CODEC = {"streams/records/codec.py", "streams/sealing/key_records.py", "streams/sealing/sealed_records.py", "streams/dead_letters/publisher.py"}
LOW_LEVEL = {"open_sealed", "decode_record", "forget_kids", "forgotten_keys", "key_record_signed"}
ALLOWED = {
    ("memstream/cli/events.py", "decode_record"),  # `memstream produce` validating stdin, not reading Kafka
    ("streams/sealing/reseal.py", "open_sealed"),
    ("streams/dead_letters/reader.py", "open_sealed"),  # a dead letter's sealed reason and value, shown to the operator, never decoded
    ("streams/sealing/keys.py", "forget_kids"),
    ("memstream/services/reflection/sealing.py", "open_sealed"),  # the reflector's own sealed table fields (AEAD), not log records  # the keyring's effect, on forget_order's verified answer only  # re-sealing under a new key: opens to seal again, reads no event
}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def test_every_consumer_reads_through_the_codec_and_nothing_else_calls_its_steps() -> None:
    for rel, entry in CONSUMERS.items():
        assert entry in _calls(ROOT / rel), f"{rel} does not read through the codec ({entry})"
    for folder in ("streams", "memstream", "projections", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if rel in CODEC or "/broker/" in rel:
                continue
            bypass = {n for n in _calls(path) & LOW_LEVEL if (rel, n) not in ALLOWED}
            opens = rel not in CODEC and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "open"
                and "opener" in ast.unparse(n.func.value).lower()
                for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            )
            assert not bypass, f"{rel} calls the codec's low-level steps {sorted(bypass)}: read through streams.record_codec"
            if opens and rel not in {"streams/projector_feed.py", "bench/chaos.py"}:  # feed: open after screen, per batch
                raise AssertionError(f"{rel} opens sealed records itself: read through streams.record_codec")
