"""What may be remembered: the quality gate over turns and the injection check
over what clients write (``quality``), over text with its disguises taken off
(``normalise``)."""

from __future__ import annotations

from memstream.domain.gate.quality import (
    BASE64_BLOB_MIN_CHARS,
    GateResult,
    GateRule,
    INJECTION_PATTERNS,
    NOISE_PATTERNS,
    gate,
    injection_reason,
)
from memstream.domain.gate.normalise import (
    CONFUSABLES,
    fold_characters,
    fold_for_rules,
)

__all__ = [
    "BASE64_BLOB_MIN_CHARS",
    "CONFUSABLES",
    "GateResult",
    "GateRule",
    "INJECTION_PATTERNS",
    "NOISE_PATTERNS",
    "fold_characters",
    "fold_for_rules",
    "gate",
    "injection_reason",
]
