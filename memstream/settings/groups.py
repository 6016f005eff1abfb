"""The settings of each component, one model per group (``broker``, ``storage``, ``api``,
``worker``, ``extraction``, ``embeddings``, ``security``): a component takes its own
group, not the whole :class:`memstream.settings.model.Settings`.

A field's docstring is its documentation (docs/configuration.md is checked against it).
Fields made with :func:`advanced` are tuning knobs: they work like the others, but the
documentation lists them in one separate table; an operator normally leaves them alone.
The environment variable of ``<group>.<field>`` is ``MEMSTREAM_<GROUP>_<FIELD>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "ADVANCED",
    "ApiSettings",
    "BrokerSettings",
    "EmbeddingSettings",
    "ExtractionSettings",
    "OBJECT_SCHEMES",
    "ObjectRoot",
    "READER_GRACE_S",
    "SecuritySettings",
    "StorageSettings",
    "WorkerSettings",
    "advanced",
]

ADVANCED = "advanced"
"""Key in a field's ``json_schema_extra`` that marks a tuning knob."""

READER_GRACE_S = 30.0
"""Default of ``storage.reader_grace_s`` (also what a table set opened without settings keeps)."""

OBJECT_SCHEMES = ("s3://",)
"""Storage roots on an object store (``storage.root``). Only S3 and S3-compatible stores:
the shard lease needs S3's conditional writes (docs/operations-storage.md)."""


def advanced(default: Any, **kwargs: Any) -> Any:
    """A tuning knob: a field with ``default`` listed in the documentation's advanced table."""
    return Field(default=default, json_schema_extra={ADVANCED: True}, **kwargs)


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)


@dataclass(frozen=True)
class ObjectRoot:
    """A storage root on an object store: its URI and the options LanceDB (and the
    lease's S3 client) connect with. Plain data; ``projections/store/object_paths.py`` acts on it."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return self.uri


class BrokerSettings(_Group):
    """The Kafka cluster, how every client reaches it, and the local broker (`memstream broker`)."""

    bootstrap_servers: str = ""
    """Kafka bootstrap servers (unset: the local broker, ``127.0.0.1:<broker.port>``)."""
    topic_prefix: str = "memstream."
    """Prefix of every topic memstream creates and reads."""
    partitions: int = Field(default=3, ge=1, le=1024)
    """Partitions of a new events topic (also the shard count of a sharded table set)."""
    replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the topics memstream creates."""
    port: int = 9092
    """Port of the local broker (`memstream broker start`)."""
    acl: bool = False
    """Run the local broker with SASL and Kafka's StandardAuthorizer (ACL mode,
    docs/security.md): per-home principals, their passwords in ``<home>/kafka/`` (0600).
    Clients of this home then default to SASL_PLAINTEXT as the worker principal."""
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    """How every memstream client talks to Kafka (with ``broker.acl``: SASL_PLAINTEXT)."""
    username: str | None = None
    """The Kafka principal (``User:<name>``) this process acts as (with ``broker.acl``
    and none given: the local broker's worker principal)."""
    password_file: Path | None = None
    """File (mode 0600) holding the Kafka password when ``broker.password`` is unset."""
    password: SecretStr | None = advanced(None)
    """The Kafka password itself (prefer ``broker.password_file``)."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = advanced("PLAIN")
    """SASL mechanism for SASL_PLAINTEXT / SASL_SSL."""
    ssl_cafile: Path | None = advanced(None)
    """CA bundle for SSL / SASL_SSL (unset: the system's trust store)."""
    controller_port: int = advanced(9093)
    """The local broker's KRaft controller port."""
    heap: str = advanced("512m")
    """The local broker's JVM heap."""
    kafka_version: str = advanced("4.1.1")
    """Kafka version the local broker runs (its jars are fetched once with Maven)."""
    dir: Path | None = advanced(None)
    """The local broker's data and logs (default ``<home>/broker``)."""
    kafka_cache_dir: Path | None = advanced(None)
    """Where Maven puts Kafka's jars (default ``~/.cache/memstream``, shared by every clone)."""
    start_timeout_s: float = advanced(90.0, gt=0)
    """How long `memstream broker start` waits for the broker to answer."""
    auto_create_topics: bool = advanced(False)
    """Let the local broker create topics on first write (off: a mistyped topic fails loudly)."""
    max_request_bytes: int = advanced(1_048_576, ge=1024)
    """Largest produce request (and so the largest event)."""
    ingress_retention_ms: int = advanced(7 * 24 * 3600 * 1000, ge=60_000)
    """How long the plaintext ingress topic (and the dead-letter topic) keep records."""

    @model_validator(mode="before")
    @classmethod
    def _bootstrap_follows_local_broker(cls, data: Any) -> Any:
        """Without explicit bootstrap servers, clients talk to the local broker's port,
        so ``MEMSTREAM_BROKER_PORT=29092`` alone moves broker and clients together."""
        if isinstance(data, dict) and data.get("bootstrap_servers") in (None, ""):
            data = {**data, "bootstrap_servers": f"127.0.0.1:{data.get('port') or 9092}"}
        return data


class StorageSettings(_Group):
    """Where the LanceDB views live: a local directory or an S3(-compatible) bucket."""

    root: Path | ObjectRoot = Path("lance")
    """The LanceDB storage root: a local path (relative: under ``home``) or
    ``s3://bucket/prefix``. Every table set, shard, position and lease lives under it."""
    endpoint: str | None = None
    """S3 endpoint URL of an S3-compatible store (SeaweedFS, MinIO...); unset: AWS."""
    region: str = "us-east-1"
    """The S3 region."""
    sharded: bool = False
    """Cut a new table set into one shard per partition (``projections/store/shards.py``);
    an existing set keeps its layout."""
    access_key_id: str | None = advanced(None)
    """S3 access key (unset, with the secret: the usual ``AWS_*`` variables, profiles, roles)."""
    secret_access_key: SecretStr | None = advanced(None)
    """S3 secret key."""
    session_token: SecretStr | None = advanced(None)
    """S3 session token."""
    allow_http: bool = advanced(False)
    """Allow a plain ``http://`` endpoint (a store on a trusted local network only)."""
    lease_ttl_s: float = advanced(30.0, ge=1.0, le=3600.0)
    """On an object store: a shard lease not renewed for this long may be taken over."""
    reader_grace_s: float = advanced(READER_GRACE_S, gt=0)
    """How long a replaced table version stays readable (maintenance drops older ones;
    a forget's shredding waits this long before its last step)."""
    vector_index_threshold: int = advanced(100_000, ge=1)
    """Memories in a table before it gets a vector index."""
    optimize_every_s: float = advanced(10.0, gt=0)
    """How often the worker compacts recent fragments and updates the indexes."""

    @field_validator("root", mode="before")
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

    def storage_options(self) -> dict[str, str]:
        """The object store's connection options, named as LanceDB's ``storage_options``
        name them (https://docs.lancedb.com/storage/configuration); empty: defaults."""
        opts = {"aws_region": self.region}
        if self.endpoint:
            opts["aws_endpoint"] = self.endpoint
        if self.access_key_id:
            opts["aws_access_key_id"] = self.access_key_id
        for key, secret in (("aws_secret_access_key", self.secret_access_key), ("aws_session_token", self.session_token)):
            if secret is not None:
                opts[key] = secret.get_secret_value()
        if self.allow_http:
            opts["allow_http"] = "true"
        return opts

    @property
    def on_object_store(self) -> bool:
        return isinstance(self.root, ObjectRoot)

    @property
    def local_root(self) -> Path:
        """``root`` where a command needs it on this machine's disk (a ``ValueError``
        names an object-store root)."""
        if isinstance(self.root, ObjectRoot):
            raise ValueError(f"this needs a local storage root, not {self.root}")
        return self.root


class ApiSettings(_Group):
    """The HTTP API and MCP server."""

    host: str = "127.0.0.1"
    """Address the HTTP API listens on."""
    port: int = 8080
    """Port the HTTP API listens on."""
    rate_per_s: float = Field(default=50.0, ge=0)
    """Requests per second one API key may make on average (REST and MCP; 0: no limit)."""
    rate_burst: int = advanced(200, ge=0)
    """Requests one API key may make at once before the rate applies (429 beyond)."""
    max_body_bytes: int = advanced(16 * 1024 * 1024, ge=1024)
    """Largest HTTP request body the API reads (413 above it)."""
    access_log: bool = advanced(False)
    """Log one line per HTTP request (costs more CPU than a write's own checks)."""
    read_wait_max_s: float = advanced(10.0, gt=0)
    """Longest a read-your-writes request waits for the view to catch up."""
    banks_file: Path | None = advanced(None)
    """The memory banks (default ``<home>/banks.toml``)."""
    keys_file: Path | None = advanced(None)
    """The API keys (default ``<home>/keys.toml``)."""
    console: bool = advanced(True)
    """Serve the web console at ``/console`` from the API (docs/console.md); false: off."""
    console_operator_token_file: Path | None = advanced(None)
    """The console's operator credential (default ``<home>/operator.token``, 0600, written
    by ``memstream up`` or ``memstream console token``): it opens the operations pages."""


class WorkerSettings(_Group):
    """The worker: the projector, extractor and reflector services."""

    app_id: str = "memstream"
    """The worker's consumer-group and Faust application id."""
    instance: str = ""
    """Tells apart several workers of one app on one host (static membership
    ``<app_id>@<host>[-<instance>]``)."""
    session_timeout_s: float = advanced(10.0, gt=0)
    """With a sharded set: a worker silent this long loses its shards to the others."""
    projector_batch_seconds: float = advanced(0.2, gt=0)
    """Longest wait of one fetch for new records when the projector is caught up."""
    reflection_poll_seconds: float = advanced(5.0, gt=0)
    """How often the reflector looks for decisions with a known outcome."""
    outcome_prices_path: Path | None = advanced(None)
    """Price file the reflector judges trading outcomes with."""
    outcome_benchmark_symbol: str = advanced("SPY")
    """Benchmark symbol of those outcomes."""


class ExtractionSettings(_Group):
    """The LLM that extracts memories from turns, judges them and reflects, and when it runs."""

    llm_base_url: str | None = None
    """An OpenAI-compatible endpoint (unset: the offline heuristic extractor)."""
    llm_api_key: SecretStr | None = None
    """Its API key."""
    llm_model: str = "gpt-4o-mini"
    """The model name sent to it."""
    llm_timeout_s: float = advanced(60.0, gt=0)
    """Timeout of one LLM call."""
    llm_max_retries: int = advanced(1, ge=0)
    """Retries of one LLM call by the client."""
    llm_max_tokens: int | None = advanced(None, ge=1)
    """Sent as ``max_tokens`` when set: bounds a small model that loops inside its JSON."""
    llm_temperature: float | None = advanced(None, ge=0, le=2)
    """Sent as ``temperature`` when set (unset: the server's default); 0 makes a small
    local model's JSON answers steadier and repeatable."""
    prompt: Literal["full", "compact"] = advanced("full")
    """Which extraction prompt the model gets: ``full`` (scenes, times, entities, links;
    for models of about 7B and up) or ``compact`` (a quarter of the tokens and a flat
    answer sent as a schema, for small local models of about 100M-1B)."""
    declared_empty_fallback: bool = advanced(True)
    """A window the model declares empty although some turns plainly state facts is
    stored by the heuristic fallback (false: trust the model's "nothing")."""
    min_new_turns: int = advanced(10, ge=1)
    """With an LLM: a session is extracted once it has this many new turns..."""
    idle_seconds: float = advanced(30.0, gt=0)
    """...or none arrived for this long."""
    background_turns: int = advanced(5, ge=0)
    """Earlier turns shown to the LLM as context."""
    max_new_turns: int = advanced(10, ge=1)
    """At most this many new turns go into one extraction."""
    max_attempts: int = advanced(5, ge=1)
    """With an LLM: a window that failed this often is stored as the heuristic would store it."""
    retry_budget_s: float = advanced(120.0, gt=0)
    """The longest one window may hold its partition's commit before it falls back."""
    prompts_dir: Path | None = advanced(None)
    """A directory of prompt files overriding the built-in ones."""


class EmbeddingSettings(_Group):
    """The embedding model and the optional reranker."""

    provider: str = "onnx"
    """"onnx" (a neural model run offline by onnxruntime), "local" (offline lexical
    hashing), "openai" (any OpenAI-compatible endpoint) or "minilm" (the ``minilm`` extra)."""
    model: str | None = None
    """The model: for "onnx" a built-in name, a directory with ``model.onnx`` and
    ``tokenizer.json`` or a Hugging Face repository (default: the built-in
    all-MiniLM-L6-v2 with int8 compute); for "openai" the model name
    (default text-embedding-3-small)."""
    dim: int = Field(default=384, ge=8, le=8192)
    """Width of the vectors (must match the model)."""
    base_url: str | None = None
    """The "openai" provider's endpoint (unset: OpenAI's)."""
    api_key: SecretStr | None = None
    """The "openai" provider's API key."""
    rerank_url: str | None = None
    """A ``/rerank`` endpoint (Jina/Cohere shape: llama-server --reranking, vLLM,
    Infinity...). Unset: a search that asks for reranking is refused."""
    rerank_model: str | None = advanced(None)
    """The reranker's model name."""
    rerank_api_key: SecretStr | None = advanced(None)
    """The reranker's API key."""

    @field_validator("provider", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class SecuritySettings(_Group):
    """Sealing (crypto-shredding) and the keys of the log (docs/security.md)."""

    sealing: bool = True
    """Seal every event on the kept-forever topics under its subject's data key
    (off: plaintext; `memstream reseal` migrates)."""
    produce_via_ingress: bool = False
    """Client writes go as plaintext to the ingress topic, which the worker seals into
    the log: for a Kafka principal that may write nothing else (ACL mode)."""
    master_key: SecretStr | None = advanced(None)
    """The master key (base64 of 32 bytes) that wraps the data keys (unset: ``master_key_file``)."""
    master_key_file: Path | None = advanced(None)
    """The master key's file (default ``<home>/master.key``, mode 0600; the first start creates it)."""
    worker_key_file: Path | None = advanced(None)
    """The worker's signing key (default ``<home>/worker.key``)."""
