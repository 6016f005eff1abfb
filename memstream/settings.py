"""All configuration in one typed object, read from ``MEMSTREAM_*`` environment variables,
an optional ``.env`` file in the working directory and an optional ``config.env`` in
``MEMSTREAM_HOME`` (in that order of precedence). Nothing else in memstream reads the
environment; the way back, settings written as variables for a child process
(:func:`settings_env`, :func:`child_env`), lives here too, so the mapping exists once.

Every path setting ends up absolute: ``home`` against the working directory, every
other relative path under ``home``. So one set of variables (an MCP host's snippet
names only ``MEMSTREAM_HOME``) means the same files from any working directory.

Secrets (API keys) are ``SecretStr``: they never appear in reprs or logs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "Settings",
    "ObjectRoot",
    "OBJECT_SCHEMES",
    "get_settings",
    "load_settings",
    "settings_env",
    "child_env",
    "parse_log_level",
    "ENV_PREFIX",
    "LOCAL_WORKER_PRINCIPAL",
    "CONFIG_FILE",
    "HOME_RELATIVE_PATHS",
    "READER_GRACE_S",
    "LANCE_INDEX_CACHE_MB",
    "LANCE_METADATA_CACHE_MB",
    "SEARCH_CACHE_ROWS",
    "SEARCH_CACHE_VECTORS",
]

ENV_PREFIX = "MEMSTREAM_"
CONFIG_FILE = "config.env"
"""``MEMSTREAM_*`` lines read from ``<home>/config.env`` by every command, whatever its
working directory (the environment and a ``.env`` file win over it)."""
HOME_RELATIVE_PATHS = (
    "lance_dir",
    "broker_dir",
    "kafka_cache_dir",
    "prompts_dir",
    "outcome_prices_path",
    "banks_file",
    "keys_file",
    "master_key_file",
    "console_operator_token_file",
    "kafka_password_file",
    "kafka_ssl_cafile",
)
"""Path settings that, when relative, are resolved under ``home``."""


LOCAL_WORKER_PRINCIPAL = "memstream-worker"
"""The local ACL-mode broker's worker principal (``streams/broker/acl.py`` has them all)."""

READER_GRACE_S = 30.0
"""Default of ``Settings.reader_grace_s`` (also what a table set opened without settings keeps)."""

LANCE_METADATA_CACHE_MB = 16
"""Default of ``Settings.lance_metadata_cache_mb`` (also what a table set opened without settings keeps)."""

LANCE_INDEX_CACHE_MB = 16
"""Default of ``Settings.lance_index_cache_mb`` (also what a table set opened without settings keeps)."""

SEARCH_CACHE_ROWS = 30_000
"""Default of ``Settings.search_cache_rows``."""

SEARCH_CACHE_VECTORS = 60_000
"""Default of ``Settings.search_cache_vectors``."""

OBJECT_SCHEMES = ("s3://",)
"""Storage roots on an object store (``lance_dir``). Only S3 and S3-compatible stores:
the shard lease needs S3's conditional writes (docs/operations-storage.md)."""


@dataclass(frozen=True)
class ObjectRoot:
    """A storage root on an object store: its URI and the options LanceDB (and the
    lease's S3 client) connect with. Plain data; ``projections/object_paths.py`` acts on it."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return self.uri


def _absolute(path: Path, base: Path) -> Path:
    path = path.expanduser()
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def parse_log_level(name: str) -> int:
    """A log level name (any case: ``debug``, ``INFO``...) as ``logging``'s number;
    ``ValueError`` for a name ``logging`` does not know."""
    level = logging.getLevelName(name.strip().upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {name!r} (debug, info, warning or error)")
    return level


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", frozen=True
    )

    # --- logging -------------------------------------------------------------------
    log_level: str = "WARNING"
    """Level of the CLI's log lines on stderr (debug, info, warning, error). Library
    chatter (aiokafka, faust) stays at WARNING unless this is DEBUG; long-running
    commands (worker, up) set their own level with ``--loglevel``."""

    # --- Kafka -------------------------------------------------------------------
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "memstream."
    partitions: int = Field(default=3, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1)
    producer_linger_ms: int = Field(default=5, ge=0)
    producer_max_batch_bytes: int = Field(default=256 * 1024, ge=1024)
    producer_max_in_flight: int = Field(default=10_000, ge=1)
    """Back-pressure bound: at most this many un-acknowledged sends per SDK producer."""
    max_request_bytes: int = Field(default=1_048_576, ge=1024)
    max_inflated_batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    """Most that a consumer inflates from one fetch of one partition; a compressed batch
    past it alone is dead-lettered, not inflated (``memstream.streams.inflation_bound``)."""

    # --- Kafka client security (every client: ``memstream.streams.connect``) -------------
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    """How every memstream client talks to Kafka. With ``broker_acl`` and no explicit
    choice: SASL_PLAINTEXT (the local broker's ACL mode, docs/security.md)."""
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    kafka_username: str | None = None
    """The Kafka principal (``User:<name>``) this process acts as. With ``broker_acl``
    and none given: the local broker's worker principal."""
    kafka_password: SecretStr | None = None
    kafka_password_file: Path | None = None
    """Read the password from this file (mode 0600) when ``kafka_password`` is unset."""
    kafka_ssl_cafile: Path | None = None
    """CA bundle for SSL / SASL_SSL (unset: the system's trust store)."""

    # --- local broker (`memstream broker`) ----------------------------------------
    home: Path = Path(".memstream")
    """memstream's own directory: the local broker's data and logs, banks, keys, the
    LanceDB tables and ``config.env``. Relative: against the working directory."""
    broker_dir: Path | None = None
    kafka_version: str = "4.1.1"
    broker_port: int = 9092
    controller_port: int = 9093
    broker_heap: str = "512m"
    broker_start_timeout_s: float = 90.0
    broker_stop_timeout_s: float = Field(default=30.0, gt=0)
    """How long `memstream broker stop` waits after SIGTERM before it sends SIGKILL."""
    broker_auto_create_topics: bool = False
    """Off by default: a producer writing to a mistyped or not-yet-created topic must fail
    loudly instead of creating it with the broker's defaults (e.g. the events topic with a
    7-day retention). Faust declares its own internal topics through the admin API."""
    kafka_cache_dir: Path | None = None
    """Where Maven puts Kafka's jars (``kafka-<version>/libs``). Defaults to
    ``~/.cache/memstream`` so every clone and CI run on a machine shares one download."""
    kafka_fetch_timeout_s: float = Field(default=900.0, gt=0)
    """Upper bound for the one-time ``mvn dependency:copy-dependencies`` run."""
    broker_acl: bool = False
    """Run the local broker with SASL and Kafka's StandardAuthorizer (ACL mode,
    docs/security.md): per-home principals for the worker, producers and readers,
    their passwords in ``<home>/kafka/`` (0600). Clients of this home then default to
    SASL_PLAINTEXT as the worker principal (``kafka_*`` settings override)."""

    # --- Faust worker ---------------------------------------------------------------
    app_id: str = "memstream"
    worker_web_port: int = 6066
    projector_batch_size: int = Field(default=10_000, ge=1)
    """Most records the projector writes in one LanceDB commit. Batches only grow this
    big under a backlog (what was fetched while the previous batch was written)."""
    projector_fast_path: bool = True
    """Read canonical ``MemoryAdded`` records carrying a vector of the configured model
    on the fast path (``memstream.codec.fast_decode``: msgspec, column-built rows;
    proven to agree with the general path). Off: every record is validated by the
    pydantic model and projected row by row (slower, same tables)."""
    gc_threshold: int = Field(default=50_000, ge=0)
    """Allocations between the garbage collector's youngest-generation runs in the
    worker and in a replay (``memstream.gc_tuning``; Python's default is 700, which
    costs the decode path up to half its time). 0 keeps Python's default."""
    release_memory_every_s: float = Field(default=10.0, ge=0)
    """How often the API and the worker hand the C allocator's free memory back to the
    operating system (``memstream.memory_release``; glibc only). Without it their
    resident memory kept growing after their caches were full. 0: never."""
    malloc_mmap_threshold_kb: int = Field(default=256, ge=0)
    """In the API and the worker, allocations of at least this many KiB get their own
    mapping, returned to the operating system when freed (glibc only,
    ``memory_release.pin_mmap_threshold``): with glibc's moving threshold, large freed
    buffers fragmented the API's heap under writes. 0: glibc's own."""
    projector_batch_seconds: float = Field(default=0.2, gt=0)
    """Longest wait of one fetch for new records when the projector is caught up."""
    projector_linger_s: float = Field(default=0.5, ge=0)
    """While the projector keeps up with a trickle of writes, it starts a commit at most
    this often: records arriving meanwhile wait (at most this long) and are written
    together. Every commit makes new table versions (manifests, small fragments,
    positions, compaction, every reader's caches), a fixed cost per commit, not per
    record. A record arriving after a quiet spell is written at once. 0: no linger."""
    projector_linger_below: int = Field(default=500, ge=1)
    """A batch of at least this many records is not followed by the linger, and a
    linger ends once this many are waiting: a backlog (bulk load, catching up) is
    written back to back. Below it the linger shrinks with the batch (a batch of half
    this many waits half the linger), so a fast stream lingers as little as before."""
    table_store: str = "memory://"

    # --- LanceDB --------------------------------------------------------------------
    lance_dir: Path | ObjectRoot = Path("lance")
    """The LanceDB storage root: a local path (relative: under ``home``) or an S3 URI
    ``s3://bucket/prefix`` (with the ``storage_*`` settings below). Every table set,
    shard, position and lease lives under it."""
    storage_endpoint: str | None = None
    """S3 endpoint URL of an S3-compatible store (SeaweedFS, MinIO...); unset: AWS."""
    storage_region: str = "us-east-1"
    storage_access_key_id: str | None = None
    """Unset (with the secret): the usual AWS sources (``AWS_*`` variables, profiles, roles)."""
    storage_secret_access_key: SecretStr | None = None
    storage_session_token: SecretStr | None = None
    storage_allow_http: bool = False
    """Allow a plain ``http://`` endpoint (a store on a trusted local network only)."""
    storage_lease_ttl_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    """On an object-store root: a shard lease not renewed for this long may be taken
    over (a killed worker's shards move after it); its holder stops writing earlier."""
    sharded: bool = False
    """Whether a new table set (a fresh root, or one a replay builds) is cut into one
    shard per partition (``projections/shards.py``); an existing set keeps its layout,
    and readers follow whichever layout the current set has."""
    worker_session_timeout_s: float = Field(default=10.0, gt=0)
    """With a sharded set, workers form a consumer group: a worker silent this long
    (killed) loses its shards to the others."""
    worker_instance: str = ""
    """Tells apart several workers of one app on one host (their static group
    membership id is ``<app_id>@<host>[-<instance>]``)."""
    vector_index_threshold: int = Field(default=100_000, ge=1)
    optimize_every_s: float = Field(default=10.0, gt=0)
    """How often the worker compacts recent fragments and updates the indexes."""
    compact_after_commits: int = Field(default=8, ge=1)
    """Between maintenance runs, the projector also compacts after this many commits
    (a steady stream of small writes otherwise leaves dozens of small fragments, which
    every read opens)."""
    lance_metadata_cache_mb: int = Field(default=LANCE_METADATA_CACHE_MB, ge=1)
    """Most memory LanceDB keeps per open table set for table metadata (each version's
    manifest and fragment list; LanceDB's default, 1 GiB, let a reader that follows a
    commit every fraction of a second grow until then). A reader reads at the newest
    versions, so old versions' entries only fill the bound: at 64 MB the API was still
    growing toward it after ten minutes of writes (docs/benchmarks.md, issue 23,
    session 19). The worker uses ``worker_lance_metadata_cache_mb`` instead."""
    lance_index_cache_mb: int = Field(default=LANCE_INDEX_CACHE_MB, ge=1)
    """Most memory LanceDB keeps per open table set for index data (scalar, full-text
    and vector indexes' pages). Each index update the worker makes (every
    ``optimize_every_s``) is a new index, and a reader that follows it kept every
    old one under LanceDB's default bound, 6 GiB (docs/benchmarks.md, issue 23,
    session 16, memory); 16 MB fills within minutes under writes, and 100,000
    memories of one space searched no slower than at 64 (session 19). Raise it when
    the current indexes of a table set are larger."""
    search_cache_rows: int = Field(default=SEARCH_CACHE_ROWS, ge=0)
    """Most memory rows and turns a serving process (API, MCP) keeps over every memory
    space for conversation-aware ranking (about 0.9 KB each, memories and turns
    together); the least recently searched spaces go first. What it holds grows with
    the spaces until this bound (docs/benchmarks.md, issue 23, sessions 20 and 23)."""
    search_cache_vectors: int = Field(default=SEARCH_CACHE_VECTORS, ge=0)
    """Most memories whose vector, text and BM25 postings a serving process keeps over
    every space for the vector and lexical legs (about 1.7 KB each); the least recently
    searched spaces go first and are read again at their next search."""
    worker_lance_metadata_cache_mb: int = Field(default=16, ge=1)
    """The same bound in the worker process, which writes a version a fraction of a
    second and reads at its newest one: under a trickle of writes the cache filled
    by several MB a minute until its bound (docs/benchmarks.md, issue 23 worker,
    session 14)."""
    reader_grace_s: float = Field(default=READER_GRACE_S, gt=0)
    """How long a table version stays readable after a newer one replaced it. A reader
    (API, MCP, CLI, extractor) reads at the newest version, so it can be on a replaced
    one only for the LanceDB call it started just before the commit (a search: well
    under a second; the rest is margin for a slow object store). The worker's
    maintenance drops versions replaced longer ago, with the files only they use, every
    half of this (so at most 1.5 times it of replaced versions is on disk); a forget's
    shredding waits this long before its last step (docs/operations-storage.md)."""

    # --- Embeddings -------------------------------------------------------------------
    embedder: str = "onnx"
    """"onnx" (a neural model run offline by onnxruntime, ``onnx_model``), "local"
    (offline lexical hashing embedder), "openai" (any OpenAI-compatible endpoint) or
    "minilm" (all-MiniLM-L6-v2 on PyTorch from the optional ``minilm`` extra)."""
    onnx_model: str = "all-MiniLM-L6-v2-int8-dynamic"
    """The ``onnx`` embedder's model: the built-in all-MiniLM-L6-v2 with int8 compute
    (built into the package when memstream is built), ``all-MiniLM-L6-v2-int8`` (the
    file it is built from, as shipped: the default before session 16; the
    ``minilm-int8`` extra), a local directory with ``model.onnx`` and
    ``tokenizer.json``, or a Hugging Face repository name (downloaded once into the
    hub's cache)."""
    embedding_threads: int = Field(default=0, ge=0)
    """Threads of an ``onnx`` call that fits one batch, a query or a single text
    (0: onnxruntime's default, one per core)."""
    embedding_parallel_runs: int = Field(default=0, ge=0)
    """One-thread ``onnx`` model runs at once for a call of several batches (0: one per
    core; 1: one batch after another on ``embedding_threads``): on few cores, runs side
    by side do more a second than one run on all of them."""
    embedding_model: str = "text-embedding-3-small"
    embedding_dim: int = Field(default=384, ge=8, le=8192)
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None

    # --- reranking (off unless a search asks for it: `rerank=true`) ----------------------
    rerank_url: str | None = None
    """A ``/rerank`` endpoint (Jina/Cohere shape: llama.cpp's ``llama-server
    --reranking``, vLLM, Infinity...): base URL such as ``http://127.0.0.1:8080/v1``
    or the route itself. Unset: a search that asks for reranking is refused."""
    rerank_model: str | None = None
    rerank_api_key: SecretStr | None = None
    rerank_candidates: int = Field(default=20, ge=2, le=200)
    """How many of memstream's top results the reranker orders (the rest follow)."""
    rerank_timeout_s: float = Field(default=10.0, gt=0)

    # --- LLM (extraction, judgment, reflection) ---------------------------------------
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_s: float = Field(default=60.0, gt=0)
    llm_max_retries: int = Field(default=1, ge=0)
    llm_max_tokens: int | None = Field(default=None, ge=1)
    """Sent as ``max_tokens`` when set: bounds a small model that loops inside its JSON
    (a cut answer is repaired: its unfinished memory is dropped)."""
    llm_temperature: float | None = Field(default=None, ge=0, le=2)
    """Sent as ``temperature`` when set (unset: the server's default, 0.8 on llama.cpp
    servers). 0 makes a small local model's JSON answers steadier and repeatable."""
    llm_mode_ttl_s: float = Field(default=7 * 86400.0, gt=0)
    """How long an endpoint's learned output mode is kept before it is probed again
    (``<home>/llm-modes.json``; servers gain modes when upgraded)."""

    # --- extraction ---------------------------------------------------------------------
    extract_min_new_turns: int = Field(default=10, ge=1)
    extract_idle_seconds: float = Field(default=30.0, gt=0)
    """With an LLM, a session is extracted once it has ``extract_min_new_turns`` new
    turns or none arrived for this long. Without one, every turn is extracted at once
    (the heuristic needs no context; see ``extract_batch_turns``)."""
    extract_background_turns: int = Field(default=5, ge=0)
    extract_max_new_turns: int = Field(default=10, ge=1)
    """At most this many new turns go into one extraction (the oldest pending first)."""
    extract_batch_turns: int = Field(default=500, ge=1)
    """Without an LLM: about this many new turns (several sessions' windows) go through
    the extractor together, sharing one exact-dedup lookup per memory space, one
    embedding call and one produce. Each batch is what was read meanwhile, so a quiet
    stream still extracts every turn at once and a busy one gets big batches."""
    extract_max_memories: int = Field(default=10, ge=1)
    extract_max_attempts: int = Field(default=5, ge=1)
    """With an LLM: a window whose extraction failed this many times (timeouts, 5xx,
    dropped connections) is stored as the heuristic would store it, marked as a
    fallback, and its partition commits past it. A failure no retry can fix (a 4xx
    other than 408/429, a context-length error, an answer unparsable after repair)
    falls back at once. ``memstream extract --retry-failed`` redoes those windows."""
    extract_retry_budget_s: float = Field(default=120.0, gt=0)
    """The longest a window may hold its partition's commit: from its first attempt,
    or earlier from when it was ready while holding the commit (waiting for an
    extraction slot counts). When it is spent the window falls back (a call still
    running is cut short; a waiting window needs no slot), so one stalled window never
    holds other sessions' turns back longer. Attempts and budgets survive restarts."""
    extract_declared_empty_fallback: bool = True
    """With an LLM: a window the model declares empty ("nothing to remember") although
    some of its turns plainly state facts (a first-person statement, see
    ``memstream.domain.extraction.stateable``) is counted as ``declared_empty_with_facts``
    and, when this is true (the default), stored by the heuristic fallback (reason
    ``declared_empty``) rather than dropped: a small model's wrong "nothing" would
    otherwise lose the facts. False trusts the model's "nothing"."""
    extract_prompt: Literal["full", "compact"] = "full"
    """Which extraction prompt the model gets. ``full`` (``extraction``, written for
    models of about 7B parameters and up): scenes, times, entities and links to known
    memories. ``compact`` (``extraction_compact``, for small local models of about
    100M-1B): a quarter of the tokens and a flat answer (content, type, source ids),
    sent as a schema a llama.cpp server turns into a grammar."""
    dedup_candidates_k: int = Field(default=5, ge=1)
    extract_known_memories: int = Field(default=10, ge=0)
    """With an LLM: the space's memories most similar to a window's new turns shown in
    the extraction call (not extracted again; links named at once); the judgment then
    only sees drafts whose closest memory the call did not see. 0: none shown."""
    prompts_dir: Path | None = None

    # --- reflection ----------------------------------------------------------------------
    reflection_poll_seconds: float = Field(default=5.0, gt=0)
    outcome_prices_path: Path | None = None
    outcome_benchmark_symbol: str = "SPY"

    # --- sealing (crypto-shredding, docs/security.md) -----------------------------------
    sealing: bool = True
    """Seal every event written to the kept-forever topics under its subject's data key
    (off: plaintext, as before sealing existed; `memstream reseal` migrates)."""
    master_key: SecretStr | None = None
    """The master key (base64 of 32 bytes) that wraps the data keys; unset: read from
    ``master_key_file``, which the first start creates when no wrapped key exists yet."""
    master_key_file: Path | None = None
    """Default ``<home>/master.key`` (mode 0600)."""
    produce_via_ingress: bool = False
    """Client writes (SDK producers, the API) go as plaintext to the ingress topic, which
    the worker seals into the log: for a Kafka principal that may write nothing else
    (ACL mode, docs/security.md). Such a producer needs no master key."""
    ingress_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=60_000)
    """How long the plaintext ingress topic (and the dead-letter topic) keep records."""
    keys_segment_ms: int = Field(default=60_000, ge=1_000)
    """Segment roll (and longest compaction lag) of the key topic: bounds how long a
    forgotten key stays on the broker's disk (docs/security.md)."""

    # --- HTTP API / MCP --------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    banks_file: Path | None = None
    keys_file: Path | None = None
    worker_key_file: Path | None = None
    """The worker's signing key (default ``<home>/worker.key``): records it writes carry
    its signature, and system events without one are dead-lettered (docs/security.md)."""
    read_wait_max_s: float = Field(default=10.0, gt=0)
    api_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest HTTP request body the API reads (413 above it)."""
    api_rate_per_s: float = Field(default=50.0, ge=0)
    """Requests per second one API key may make on average (REST and MCP; 0: no limit)."""
    api_rate_burst: int = Field(default=200, ge=0)
    """Requests one API key may make at once before the rate applies (429 beyond)."""
    api_access_log: bool = False
    """Log one line per HTTP request (uvicorn's access log). Off by default: at tens of
    requests a second the line costs more CPU than a write's own checks."""
    console: bool = True
    """Serve the web console at ``/console`` from the API (docs/console.md); false: off."""
    console_operator_token_file: Path | None = None
    """The console's operator credential (default ``<home>/operator.token``, 0600,
    written by ``memstream up`` or ``memstream console token``): it opens the
    operations pages (dead letters, worker status, forget)."""

    @field_validator("lance_dir", mode="before")
    @classmethod
    def _object_root(cls, value: Any) -> Any:
        text = str(value) if isinstance(value, (str, ObjectRoot)) else None
        if text is None or "://" not in text:
            return value
        if not text.startswith(OBJECT_SCHEMES):
            raise ValueError(f"storage root {text!r}: only local paths and s3://bucket/prefix are supported")
        if not text[len("s3://"):].split("/", 1)[0]:
            raise ValueError(f"storage root {text!r} names no bucket (s3://bucket/prefix)")
        return ObjectRoot(text.rstrip("/"))

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        parse_log_level(value)
        return value.strip().upper()

    @model_validator(mode="before")
    @classmethod
    def _bootstrap_follows_local_broker(cls, data: Any) -> Any:
        """Without an explicit ``bootstrap_servers``, clients talk to the local broker's
        port, so ``MEMSTREAM_BROKER_PORT=29092`` alone moves broker and clients together."""
        if isinstance(data, dict) and data.get("bootstrap_servers") in (None, ""):
            port = data.get("broker_port") or 9092
            data = {**data, "bootstrap_servers": f"127.0.0.1:{port}"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _acl_mode_defaults(cls, data: Any) -> Any:
        """In ACL mode, clients that name no identity act as the local worker principal
        (its password file under ``home``, resolved with the other home paths)."""
        if not isinstance(data, dict) or str(data.get("broker_acl", "")).strip().lower() not in ("1", "true", "yes", "on"):
            return data
        data = dict(data)
        if data.get("kafka_security_protocol") in (None, "", "PLAINTEXT"):
            data["kafka_security_protocol"] = "SASL_PLAINTEXT"
        if data.get("kafka_username") in (None, "") and data.get("kafka_password") in (None, ""):
            data["kafka_username"] = LOCAL_WORKER_PRINCIPAL
            data.setdefault("kafka_password_file", f"kafka/{LOCAL_WORKER_PRINCIPAL}.password")
        return data

    @model_validator(mode="after")
    def _paths_absolute(self) -> "Settings":
        """``home`` against the working directory, every other relative path under
        ``home`` (frozen model: set once, here, before anyone reads them)."""
        home = _absolute(self.home, Path.cwd())
        object.__setattr__(self, "home", home)
        for name in HOME_RELATIVE_PATHS:
            value = getattr(self, name)
            if isinstance(value, ObjectRoot):
                object.__setattr__(self, name, ObjectRoot(value.uri, self.storage_options()))
            elif value is not None:
                object.__setattr__(self, name, _absolute(value, home))
        return self

    def storage_options(self) -> dict[str, str]:
        """The object store's connection options, named as LanceDB's ``storage_options``
        name them (https://docs.lancedb.com/storage/configuration); empty: defaults."""
        opts = {"aws_region": self.storage_region}
        if self.storage_endpoint:
            opts["aws_endpoint"] = self.storage_endpoint
        if self.storage_access_key_id:
            opts["aws_access_key_id"] = self.storage_access_key_id
        for key, secret in (
            ("aws_secret_access_key", self.storage_secret_access_key),
            ("aws_session_token", self.storage_session_token),
        ):
            if secret is not None:
                opts[key] = secret.get_secret_value()
        if self.storage_allow_http:
            opts["allow_http"] = "true"
        return opts

    @property
    def on_object_store(self) -> bool:
        return isinstance(self.lance_dir, ObjectRoot)

    @property
    def local_lance_dir(self) -> Path:
        """``lance_dir`` where a command needs it on this machine's disk (a
        ``ValueError`` names an object-store root)."""
        if isinstance(self.lance_dir, ObjectRoot):
            raise ValueError(f"this needs a local storage root, not {self.lance_dir}")
        return self.lance_dir

    @property
    def config_file(self) -> Path:
        """``<home>/config.env``: settings every command reads, from any directory."""
        return self.home / CONFIG_FILE

    @property
    def resolved_broker_dir(self) -> Path:
        return self.broker_dir or (self.home / "broker")

    @property
    def resolved_kafka_cache_dir(self) -> Path:
        return self.kafka_cache_dir or (Path.home() / ".cache" / "memstream")


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and ``.env``, then again with ``<home>/config.env``
    under them when that file exists (the home it names is the one already chosen)."""
    first = Settings(**overrides)
    config = first.config_file
    if not config.is_file():
        return first
    return Settings(_env_file=(config, ".env"), **{"home": first.home, **overrides})  # type: ignore[call-arg]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def settings_env(settings: Settings) -> dict[str, str]:
    """``MEMSTREAM_*`` variables that reproduce ``settings`` in a child process: every
    field that is set (``None`` ones stay unset), secrets revealed for the child only."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[f"{ENV_PREFIX}{name.upper()}"] = text
    return env


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that must use exactly ``settings``: ``base``
    (default: this process's environment) without its own ``MEMSTREAM_*`` variables,
    plus :func:`settings_env` (so a setting left unset here is unset there too)."""
    inherited = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.upper().startswith(ENV_PREFIX)
    }
    return {**inherited, **settings_env(settings)}
