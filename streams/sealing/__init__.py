"""Sealed records on the Kafka side: each subject's data key on the compacted key
topic (``keys``, its records checked by ``key_records``), sealing client records at
ingress (``sealer``) and opening them for a reader (``sealed_records``), re-sealing an
old log (``reseal``) and forgetting a subject by deleting its key (``forget``). The
cipher itself is :mod:`memstream.sealing`."""

__all__: list[str] = []
