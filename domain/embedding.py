"""The embedding wire codec: little-endian float32, base64 (standard alphabet, padded).

Carrying vectors inside events lets a replay rebuild the vector table without calling
an embedding model again. The round trip is exact for float32 values.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence

__all__ = ["EmbeddingCodecError", "encode_vector", "decode_vector"]


class EmbeddingCodecError(ValueError):
    """A payload that is not base64 of exactly ``dim`` little-endian float32 values."""


def encode_vector(values: Sequence[float]) -> str:
    if len(values) == 0:
        raise EmbeddingCodecError("embedding is empty")
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def decode_vector(data: str, dim: int) -> list[float]:
    if dim <= 0:
        raise EmbeddingCodecError(f"embedding dimension must be positive, got {dim}")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise EmbeddingCodecError("embedding data is not valid base64") from None
    if len(raw) != dim * 4:
        raise EmbeddingCodecError(
            f"embedding data holds {len(raw)} bytes; dimension {dim} needs {dim * 4}"
        )
    return list(struct.unpack(f"<{dim}f", raw))
