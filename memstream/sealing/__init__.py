"""Crypto-shredding: every personal field of the log is sealed under a key per data
subject (a memory space: team and user), and forgetting the subject destroys its key.

This package is the pure part (AES-GCM from ``cryptography``, no Kafka, no settings):
the master key and its wrapper (``master``), the keyring of data keys (``keyring``) and
the sealed record format (``envelope``). ``memstream.streams.sealing.keys`` follows the
compacted key topic on Kafka; docs/security.md lists what is sealed.
"""

from memstream.sealing.envelope import (
    SEALED_MAGIC,
    SealedHeader,
    TamperedRecord,
    UnreadableRecord,
    is_sealed,
    open_sealed,
    seal,
    sealed_header,
    sealed_kid,
)
from memstream.sealing.keyring import DataKey, Keyring, KeyRecordError, Subject, key_record_key
from memstream.sealing.master import (
    AesGcmKeyWrapper,
    KeyWrapper,
    MasterKeyError,
    decode_master_key,
    new_master_key,
    read_master_key_file,
    write_master_key_file,
)

__all__ = [
    "SEALED_MAGIC",
    "SealedHeader",
    "TamperedRecord",
    "UnreadableRecord",
    "is_sealed",
    "open_sealed",
    "seal",
    "sealed_header",
    "sealed_kid",
    "DataKey",
    "Keyring",
    "KeyRecordError",
    "Subject",
    "key_record_key",
    "AesGcmKeyWrapper",
    "KeyWrapper",
    "MasterKeyError",
    "decode_master_key",
    "new_master_key",
    "read_master_key_file",
    "write_master_key_file",
]
