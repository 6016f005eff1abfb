"""The sealed record format and the keyring (no Kafka: the key records are passed by hand)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from memstream.sealing import (
    AesGcmKeyWrapper,
    Keyring,
    MasterKeyError,
    SealedHeader,
    Subject,
    TamperedRecord,
    UnreadableRecord,
    is_sealed,
    new_master_key,
    open_sealed,
    read_master_key_file,
    seal,
    sealed_header,
    write_master_key_file,
)

ALICE = Subject("acme", "alice")
BOB = Subject("acme", "bob")


def _header(event_id: str = "e-1", subject: Subject = ALICE) -> SealedHeader:
    return SealedHeader(event_id, "MemoryAdded", 2, subject.team_id, subject.user_id, "default", "2026-01-01T00:00:00Z")


def test_seal_round_trip_keeps_header_plain_and_body_secret() -> None:
    ring = Keyring(AesGcmKeyWrapper(new_master_key()))
    key, _, _ = ring.new_key(ALICE)
    body = b'{"content":"canary-7f3a lives in Lyon"}'
    sealed = seal(body, _header(), key)
    assert is_sealed(sealed) and not is_sealed(body)
    assert b"canary-7f3a" not in sealed and b"Lyon" not in sealed
    assert sealed_header(sealed) == _header()
    assert open_sealed(sealed, ring) == body


def test_changed_header_or_moved_body_does_not_open() -> None:
    ring = Keyring(AesGcmKeyWrapper(new_master_key()))
    key, _, _ = ring.new_key(ALICE)
    sealed = seal(b'{"x":1}', _header("e-1"), key)
    other = seal(b'{"x":1}', _header("e-2"), key)
    moved_scope = sealed.replace(b'"alice"', b'"alicf"')
    with pytest.raises(TamperedRecord):
        open_sealed(moved_scope, ring)
    # e-2's ciphertext under e-1's header: bound to its own event id
    head_end = len(sealed) - len(b'{"x":1}') - 16 - 12
    spliced = sealed[:head_end] + other[len(other) - (len(sealed) - head_end) :]
    with pytest.raises(TamperedRecord):
        open_sealed(spliced, ring)


def test_keys_follow_records_and_tombstones_across_nodes() -> None:
    master = new_master_key()
    writer, reader = Keyring(AesGcmKeyWrapper(master)), Keyring(AesGcmKeyWrapper(master))
    key, record_key, value = writer.new_key(ALICE)
    reader.apply(record_key, value)
    sealed = seal(b"{}", _header(), key)
    assert open_sealed(sealed, reader) == b"{}"
    assert reader.subjects("acme") == [ALICE]
    reader.apply(record_key, None)
    with pytest.raises(UnreadableRecord) as caught:
        open_sealed(sealed, reader)
    assert caught.value.forgotten
    assert reader.subjects("acme") == []


def test_lowest_key_id_wins_so_nodes_converge() -> None:
    master = new_master_key()
    a, b = Keyring(AesGcmKeyWrapper(master)), Keyring(AesGcmKeyWrapper(master))
    ka, rka, va = a.new_key(ALICE)
    kb, rkb, vb = b.new_key(ALICE)
    a.apply(rkb, vb)
    b.apply(rka, va)
    assert a.key_for(ALICE).kid == b.key_for(ALICE).kid == min(ka.kid, kb.kid)  # type: ignore[union-attr]
    # both keys stay: what either sealed opens everywhere
    assert open_sealed(seal(b"1", _header(), ka), b) == b"1"


def test_team_subjects_and_record_keys() -> None:
    ring = Keyring(AesGcmKeyWrapper(new_master_key()))
    for s in (ALICE, BOB, Subject("other", "alice")):
        ring.new_key(s)
    assert ring.subjects("acme") == [ALICE, BOB]
    assert ring.subjects("acme", "bob") == [BOB]
    assert [json.loads(k)[:2] for k in ring.record_keys(BOB)] == [["acme", "bob"]]


def test_a_key_wrapped_by_another_master_key_is_a_clear_error() -> None:
    _, record_key, value = Keyring(AesGcmKeyWrapper(new_master_key())).new_key(ALICE)
    with pytest.raises(MasterKeyError, match="restore the original master key"):
        Keyring(AesGcmKeyWrapper(new_master_key())).apply(record_key, value)


def test_a_wrapped_key_moved_to_another_subject_does_not_unwrap() -> None:
    master = new_master_key()
    _, _, value = Keyring(AesGcmKeyWrapper(master)).new_key(ALICE)
    _, bob_key, _ = Keyring(AesGcmKeyWrapper(master)).new_key(BOB)
    with pytest.raises(MasterKeyError, match="does not open"):
        Keyring(AesGcmKeyWrapper(master)).apply(bob_key, value)


def test_keyed_hash_depends_on_the_subject_key() -> None:
    ring = Keyring(AesGcmKeyWrapper(new_master_key()))
    a, _, _ = ring.new_key(ALICE)
    b, _, _ = ring.new_key(BOB)
    assert a.keyed_hash("likes tea") == a.keyed_hash("likes tea") != b.keyed_hash("likes tea")


def test_master_key_file_is_private_and_first_writer_wins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "home" / "master.key"
    assert read_master_key_file(path) is None
    first = write_master_key_file(path, new_master_key())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert write_master_key_file(path, new_master_key()) == first == read_master_key_file(path)
    path.write_text("not base64!\n")
    with pytest.raises(MasterKeyError, match="not a master key"):
        read_master_key_file(path)
