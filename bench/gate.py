"""``memstream bench gate``: the injection gate's catch and false-positive rates.

Runs the prompt-injection rule (``memstream.domain.gate.quality.injection_reason``, the
rule every turn and every client-written memory passes) over the corpus in
``memstream.bench.gate_corpus``: the share of attacks caught and the share of benign
texts refused, with the misses and false positives listed. Pure and quick: no broker.
"""

from __future__ import annotations

from typing import Any

from memstream.bench.gate_corpus import ATTACKS, BENIGN
from memstream.domain.gate import injection_reason

__all__ = ["run", "rates"]


def rates() -> dict[str, Any]:
    """The figures, and which texts the gate got wrong."""
    missed = [t for t in ATTACKS if injection_reason(t) is None]
    refused = [t for t in BENIGN if injection_reason(t) is not None]
    return {
        "attacks": len(ATTACKS),
        "benign": len(BENIGN),
        "catch_rate": round(1 - len(missed) / len(ATTACKS), 4),
        "false_positive_rate": round(len(refused) / len(BENIGN), 4),
        "missed": missed,
        "false_positives": refused,
    }


def run() -> dict[str, Any]:
    result = rates()
    print(f"injection gate: {result['attacks']} attacks, {result['benign']} benign texts")
    print(f"  caught {result['catch_rate']:.1%}, false positives {result['false_positive_rate']:.1%}")
    for text in result["missed"]:
        print(f"  missed:         {text!r}")
    for text in result["false_positives"]:
        print(f"  false positive: {text!r}")
    return result
