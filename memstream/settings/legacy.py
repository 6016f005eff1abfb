"""The flat setting names of earlier releases, kept working for one release.

:data:`RENAMED` is the one mapping table: old flat name -> ``group.field`` (``None``:
no longer a setting, a constant in the module that uses it). An old ``MEMSTREAM_*``
variable (environment, ``.env``, ``<home>/config.env``) still applies, with a
:class:`SettingDeprecationWarning` naming the new variable; an old name passed as a
keyword to ``Settings(...)`` or read as ``settings.<old>`` still works, so code and
tests written against the flat names keep running while they move over.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

__all__ = [
    "RENAMED",
    "REMOVED",
    "GROUPS",
    "SettingDeprecationWarning",
    "LegacyEnvSource",
    "env_name",
    "nest",
]

ENV_PREFIX = "MEMSTREAM_"

GROUPS = ("broker", "storage", "api", "worker", "extraction", "embeddings", "security")
"""The component groups, in the order the documentation lists them."""

RENAMED: dict[str, str | None] = {
    # broker: the Kafka cluster and how every client reaches it
    "bootstrap_servers": "broker.bootstrap_servers",
    "topic_prefix": "broker.topic_prefix",
    "partitions": "broker.partitions",
    "replication_factor": "broker.replication_factor",
    "broker_port": "broker.port",
    "broker_acl": "broker.acl",
    "kafka_security_protocol": "broker.security_protocol",
    "kafka_sasl_mechanism": "broker.sasl_mechanism",
    "kafka_username": "broker.username",
    "kafka_password": "broker.password",
    "kafka_password_file": "broker.password_file",
    "kafka_ssl_cafile": "broker.ssl_cafile",
    "controller_port": "broker.controller_port",
    "broker_heap": "broker.heap",
    "kafka_version": "broker.kafka_version",
    "broker_dir": "broker.dir",
    "kafka_cache_dir": "broker.kafka_cache_dir",
    "broker_start_timeout_s": "broker.start_timeout_s",
    "broker_auto_create_topics": "broker.auto_create_topics",
    "producer_linger_ms": None,
    "producer_max_batch_bytes": None,
    "producer_max_in_flight": None,
    "max_request_bytes": "broker.max_request_bytes",
    "max_inflated_batch_bytes": None,
    "broker_stop_timeout_s": None,
    "kafka_fetch_timeout_s": None,
    # storage
    "lance_dir": "storage.root",
    "storage_endpoint": "storage.endpoint",
    "storage_region": "storage.region",
    "sharded": "storage.sharded",
    "storage_access_key_id": "storage.access_key_id",
    "storage_secret_access_key": "storage.secret_access_key",
    "storage_session_token": "storage.session_token",
    "storage_allow_http": "storage.allow_http",
    "storage_lease_ttl_s": "storage.lease_ttl_s",
    "reader_grace_s": "storage.reader_grace_s",
    "vector_index_threshold": "storage.vector_index_threshold",
    "optimize_every_s": "storage.optimize_every_s",
    "compact_after_commits": None,
    "lance_metadata_cache_mb": None,
    "lance_index_cache_mb": None,
    "worker_lance_metadata_cache_mb": None,
    "search_cache_rows": None,
    "search_cache_vectors": None,
    # api
    "api_host": "api.host",
    "api_port": "api.port",
    "api_rate_per_s": "api.rate_per_s",
    "api_rate_burst": "api.rate_burst",
    "api_max_body_bytes": "api.max_body_bytes",
    "api_access_log": "api.access_log",
    "read_wait_max_s": "api.read_wait_max_s",
    "banks_file": "api.banks_file",
    "keys_file": "api.keys_file",
    "console": "api.console",
    "console_operator_token_file": "api.console_operator_token_file",
    # worker
    "app_id": "worker.app_id",
    "worker_instance": "worker.instance",
    "worker_session_timeout_s": "worker.session_timeout_s",
    "projector_batch_size": None,
    "projector_batch_seconds": "worker.projector_batch_seconds",
    "projector_linger_s": None,
    "projector_decode_process": None,
    "reflection_poll_seconds": "worker.reflection_poll_seconds",
    "outcome_prices_path": "worker.outcome_prices_path",
    "outcome_benchmark_symbol": "worker.outcome_benchmark_symbol",
    "worker_web_port": None,
    "projector_fast_path": None,
    "projector_linger_below": None,
    "gc_threshold": None,
    "release_memory_every_s": None,
    "malloc_mmap_threshold_kb": None,
    "table_store": None,
    # extraction (and the LLM it, judgment and reflection call)
    "llm_base_url": "extraction.llm_base_url",
    "llm_api_key": "extraction.llm_api_key",
    "llm_model": "extraction.llm_model",
    "llm_timeout_s": "extraction.llm_timeout_s",
    "llm_max_retries": "extraction.llm_max_retries",
    "llm_max_tokens": "extraction.llm_max_tokens",
    "llm_temperature": "extraction.llm_temperature",
    "extract_prompt": "extraction.prompt",
    "extract_declared_empty_fallback": "extraction.declared_empty_fallback",
    "extract_min_new_turns": "extraction.min_new_turns",
    "extract_idle_seconds": "extraction.idle_seconds",
    "extract_background_turns": "extraction.background_turns",
    "extract_max_new_turns": "extraction.max_new_turns",
    "extract_batch_turns": None,
    "extract_max_attempts": "extraction.max_attempts",
    "extract_retry_budget_s": "extraction.retry_budget_s",
    "extract_known_memories": None,
    "prompts_dir": "extraction.prompts_dir",
    "llm_mode_ttl_s": None,
    "dedup_candidates_k": None,
    "extract_max_memories": None,
    # embeddings
    "embedder": "embeddings.provider",
    "onnx_model": "embeddings.model",
    "embedding_model": "embeddings.model",
    "embedding_dim": "embeddings.dim",
    "embedding_base_url": "embeddings.base_url",
    "embedding_api_key": "embeddings.api_key",
    "rerank_url": "embeddings.rerank_url",
    "rerank_model": "embeddings.rerank_model",
    "rerank_api_key": "embeddings.rerank_api_key",
    "rerank_candidates": None,
    "rerank_timeout_s": None,
    "embedding_threads": None,
    "embedding_parallel_runs": None,
    # security
    "sealing": "security.sealing",
    "produce_via_ingress": "security.produce_via_ingress",
    "master_key": "security.master_key",
    "master_key_file": "security.master_key_file",
    "worker_key_file": "security.worker_key_file",
    "ingress_retention_ms": "broker.ingress_retention_ms",
    "keys_segment_ms": None,
}

REMOVED = (
    "broker.producer_linger_ms",
    "broker.producer_max_batch_bytes",
    "broker.producer_max_in_flight",
    "broker.max_inflated_batch_bytes",
    "broker.keys_segment_ms",
    "storage.compact_after_commits",
    "storage.lance_metadata_cache_mb",
    "storage.lance_index_cache_mb",
    "storage.worker_lance_metadata_cache_mb",
    "storage.search_cache_rows",
    "storage.search_cache_vectors",
    "worker.projector_batch_size",
    "worker.projector_linger_s",
    "extraction.batch_turns",
    "extraction.known_memories",
    "embeddings.rerank_candidates",
    "embeddings.rerank_timeout_s",
)
"""Grouped settings of the last release that became constants in the module that uses
them: their variables (``MEMSTREAM_BROKER_PRODUCER_LINGER_MS``) are ignored with a
warning too, not silently."""
RENAMED.update({path.replace(".", "_"): None for path in REMOVED})


class SettingDeprecationWarning(FutureWarning):
    """An old setting name was used (shown by default: it is meant for operators)."""


def env_name(path: str) -> str:
    """The variable of a setting: ``broker.port`` -> ``MEMSTREAM_BROKER_PORT``."""
    return ENV_PREFIX + path.replace(".", "_").upper()


def nest(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every old flat key moved into its group (``{"partitions": 6}`` ->
    ``{"broker": {"partitions": 6}}``); keys of removed settings are dropped. A value
    given under the new name wins over the same setting under an old one."""
    out: dict[str, Any] = {}
    moved: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key not in RENAMED:
            out[key] = value
            continue
        path = RENAMED[key]
        if path is not None:
            group, name = path.split(".", 1)
            moved.setdefault(group, {})[name] = value
    for group, values in moved.items():
        given = out.get(group)
        if given is None:
            out[group] = values
        elif isinstance(given, Mapping):
            out[group] = {**values, **given}
        else:  # a group model passed whole: the old keys update it
            out[group] = given.model_copy(update=values)
    return out


def _old_variables(files: Iterable[Path], environ: Mapping[str, str]) -> dict[str, str]:
    """Old flat names found in the dotenv ``files`` (later ones win) and the environment
    (wins over files), as ``{old_name: text}``; names the new scheme reads as they are
    (``MEMSTREAM_BROKER_PORT``) are not old."""
    found: dict[str, str] = {}
    sources: list[Mapping[str, str | None]] = [dotenv_values(f) for f in files if f.is_file()]
    for source in [*sources, environ]:
        for key, value in source.items():
            upper = key.upper()
            if value is None or not upper.startswith(ENV_PREFIX):
                continue
            old = upper[len(ENV_PREFIX):].lower()
            if old in RENAMED and (RENAMED[old] is None or env_name(RENAMED[old] or "") != upper):
                found[old] = value
    return found


class LegacyEnvSource(PydanticBaseSettingsSource):
    """Old ``MEMSTREAM_*`` variables, below every new-name source, each with a warning."""

    def __init__(self, settings_cls: type[BaseSettings], env_files: Any) -> None:
        super().__init__(settings_cls)
        if env_files is None:
            env_files = ()
        elif isinstance(env_files, (str, os.PathLike)):
            env_files = (env_files,)
        self._files = [Path(f) for f in env_files]

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        old = _old_variables(self._files, os.environ)
        for name in sorted(old):
            path = RENAMED[name]
            hint = f"use {env_name(path)}" if path else "it is no longer a setting and is ignored"
            warnings.warn(
                f"{ENV_PREFIX}{name.upper()} is deprecated: {hint}",
                SettingDeprecationWarning,
                stacklevel=2,
            )
        return nest(old)
