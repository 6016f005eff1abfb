"""Memory banks and the API keys bound to them.

A *memory bank* is a named memory space (a team, optionally narrowed to one user and
one agent) with a description that tells a model what belongs in it. Banks are
declared by the operator in one file (TOML or YAML, chosen by suffix) and are what
an MCP server or an API key is bound to: the bank pins the scope, so nothing a model
or a client puts in a request can widen it.

Banks file (``MEMSTREAM_API_BANKS_FILE``, default ``<home>/banks.toml``)::

    [banks.support]
    team_id = "acme"
    user_id = "alice"            # optional: without it the bank spans the whole team
    agent_id = "helpdesk"        # optional: narrows writes and reads to one agent
    description = "Facts, preferences and instructions about Alice's support tickets."
    memory_template = "{content} (noted {now:%Y-%m-%d %H:%M} UTC)"   # optional
    api_key_sha256 = ["<64 hex chars>"]                              # optional

API keys are random 256-bit secrets (``msk_`` + URL-safe base64). Only their SHA-256
is ever stored: in the banks file (``api_key_sha256``) or in the keys file
(``MEMSTREAM_API_KEYS_FILE``, default ``<home>/keys.toml``) that ``memstream keys create``
appends to. A plain hash is enough because the keys are high-entropy random strings,
not passwords: there is nothing to brute-force from a dictionary.

Access rule (``memstream.domain.access``, described in docs/security.md): a key may
touch an event scope iff the team matches and, where the bank names a user or an
agent, those match too; its reads are confined the same way. A key of team A never
reads or writes team B, and a key pinned to an agent never sees another agent's rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import string
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memstream.domain.access import AccessScope
from memstream.domain.events import Identifier, MemoryType, Scope
from memstream.settings import Settings

__all__ = [
    "KEY_PREFIX",
    "BankConfigError",
    "UnknownBankError",
    "AccessScope",
    "Bank",
    "KeyRecord",
    "Principal",
    "BankRegistry",
    "RegistrySource",
    "banks_path",
    "keys_path",
    "hash_key",
    "generate_key",
    "load_registry",
    "create_key",
    "revoke_key",
    "add_bank",
    "write_default_bank",
]

log = logging.getLogger("memstream.banks")

KEY_PREFIX = "msk_"
_TEMPLATE_FIELDS = frozenset({"content", "now", "bank", "date"})
_HEX64 = frozenset("0123456789abcdef")


class BankConfigError(ValueError):
    """The banks or keys file cannot be used; the message names the file and the problem."""


class UnknownBankError(LookupError):
    """No bank of that name is declared."""


def banks_path(settings: Settings) -> Path:
    """Where the bank declarations live (explicit setting, else ``<home>/banks.toml``)."""
    return settings.api.banks_file or (settings.home / "banks.toml")


def keys_path(settings: Settings) -> Path:
    """Where ``memstream keys create`` stores key hashes (else ``<home>/keys.toml``)."""
    return settings.api.keys_file or (settings.home / "keys.toml")


def hash_key(raw_key: str) -> str:
    """The stored form of a key: lowercase hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    """A new random API key (256 bits of entropy)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _check_hash(value: str) -> str:
    v = value.strip().lower()
    if len(v) != 64 or not set(v) <= _HEX64:
        raise ValueError("an API key hash is 64 hex characters (sha256); never store the key itself")
    return v


class Bank(BaseModel):
    """One declared memory bank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Identifier
    team_id: Identifier
    user_id: Identifier | None = None
    agent_id: Identifier | None = None
    description: str = Field(min_length=1, max_length=2000)
    memory_template: str | None = Field(default=None, max_length=2000)
    """A ``str.format`` template for memories added through MCP. Fields: ``{content}``
    (required), ``{now}`` (UTC datetime, takes strftime specs: ``{now:%Y-%m-%d}``),
    ``{date}`` (ISO date) and ``{bank}``. Only plain field names are allowed."""
    default_memory_type: MemoryType = MemoryType.episodic
    api_key_sha256: tuple[str, ...] = ()

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("description is empty")
        return v.strip()

    @field_validator("memory_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is None:
            return None
        names: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(v))
        except ValueError as exc:
            raise ValueError(f"memory_template is not a valid format string: {exc}") from None
        for _, field_name, _, conversion in parsed:
            if field_name is None:
                continue
            if field_name not in _TEMPLATE_FIELDS or conversion is not None:
                raise ValueError(
                    f"memory_template field {{{field_name}}} is not allowed "
                    f"(allowed: {', '.join('{' + f + '}' for f in sorted(_TEMPLATE_FIELDS))})"
                )
            names.add(field_name)
        if "content" not in names:
            raise ValueError("memory_template must contain {content}")
        # Render once with a sample so a bad strftime spec fails at load, not at a tool call.
        sample = datetime(2000, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        try:
            v.format(content="x", now=sample, date=sample.date().isoformat(), bank="b")
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"memory_template cannot be rendered: {exc}") from None
        return v

    @field_validator("api_key_sha256", mode="before")
    @classmethod
    def _hashes(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        return tuple(_check_hash(h) for h in v) if isinstance(v, (list, tuple)) else v

    @property
    def access(self) -> AccessScope:
        return AccessScope(team_id=self.team_id, user_id=self.user_id, agent_id=self.agent_id)

    @property
    def scope(self) -> Scope:
        """The scope every write through this bank carries."""
        return self.access.default_scope()

    def render_memory(self, content: str, now: datetime) -> str:
        """Apply the bank's template (if any) to memory content at time ``now`` (UTC)."""
        if self.memory_template is None:
            return content
        now = now.astimezone(timezone.utc)
        return self.memory_template.format(
            content=content, now=now, date=now.date().isoformat(), bank=self.name
        )


class KeyRecord(BaseModel):
    """A stored key: its hash and the bank it is bound to, never the key itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    bank: Identifier
    label: str = Field(default="", max_length=200)
    created_at: datetime | None = None

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        return _check_hash(v)

    @property
    def key_id(self) -> str:
        """A short public handle for listing and revoking (a prefix of the hash)."""
        return self.sha256[:12]


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request: the bank its key is bound to."""

    bank: Bank
    key_id: str

    @property
    def access(self) -> AccessScope:
        return self.bank.access


@dataclass(frozen=True)
class BankRegistry:
    """Every bank and every key hash, as loaded from the files."""

    banks: dict[str, Bank] = field(default_factory=dict)
    keys: dict[str, KeyRecord] = field(default_factory=dict)

    def bank(self, name: str) -> Bank:
        try:
            return self.banks[name]
        except KeyError:
            known = ", ".join(sorted(self.banks)) or "none declared"
            raise UnknownBankError(f"unknown bank {name!r} (known: {known})") from None

    def authenticate(self, raw_key: str | None) -> Principal | None:
        """The principal for a presented key, or None when the key is unknown."""
        if not raw_key:
            return None
        record = self.keys.get(hash_key(raw_key.strip()))
        if record is None or record.bank not in self.banks:
            return None
        return Principal(bank=self.banks[record.bank], key_id=record.key_id)


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BankConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise BankConfigError(f"{path}: not valid {path.suffix.lstrip('.') or 'TOML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BankConfigError(f"{path}: the top level must be a table / mapping")
    return data


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "value"
    return f"{loc}: {err.get('msg', 'invalid').removeprefix('Value error, ')}"


def _line_of(path: Path, name: str) -> str:
    """``:LINE`` of a bank's table header (``[banks.NAME]`` or a YAML ``NAME:`` key),
    for the log line of an entry that is skipped; empty when not found."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    quoted = re.escape(name)
    header = re.compile(rf"^\s*(\[\s*banks\s*\.\s*[\"']?{quoted}[\"']?\s*\]|[\"']?{quoted}[\"']?\s*:)")
    for number, line in enumerate(lines, 1):
        if header.match(line):
            return f":{number}"
    return ""


def _parse_banks(path: Path, data: dict[str, Any], skipped: list[str] | None = None) -> dict[str, Bank]:
    """The banks of a banks file. With ``skipped`` (the server's lenient load), an
    invalid entry is described there (file and line) and left out instead of failing
    the whole file: it is never a reason to keep serving an older registry."""
    unknown = set(data) - {"banks"}
    if unknown:
        raise BankConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; expected [banks.NAME]")
    raw = data.get("banks", {})
    if not isinstance(raw, dict):
        raise BankConfigError(f"{path}: 'banks' must be a table of banks keyed by name")
    banks: dict[str, Bank] = {}
    for name, body in raw.items():
        try:
            if not isinstance(body, dict):
                raise BankConfigError(f"{path}: bank {name!r} must be a table")
            try:
                banks[name] = Bank(name=name, **body)
            except ValidationError as exc:
                raise BankConfigError(f"{path}: bank {name!r}: {_one_line(exc)}") from None
            except TypeError as exc:
                raise BankConfigError(f"{path}: bank {name!r}: {exc}") from None
        except BankConfigError as exc:
            if skipped is None:
                raise
            skipped.append(f"{path}{_line_of(path, str(name))}: skipped: {str(exc).removeprefix(f'{path}: ')}")
    return banks


def _parse_keys(path: Path, data: dict[str, Any], skipped: list[str] | None = None) -> list[KeyRecord]:
    raw = data.get("keys", [])
    if not isinstance(raw, list):
        raise BankConfigError(f"{path}: 'keys' must be an array of tables ([[keys]])")
    records = []
    for i, body in enumerate(raw):
        try:
            records.append(KeyRecord.model_validate(body))
        except ValidationError as exc:
            if skipped is None:
                raise BankConfigError(f"{path}: keys[{i}]: {_one_line(exc)}") from None
            skipped.append(f"{path}: keys[{i}] skipped: {_one_line(exc)}")
    return records


def load_registry(settings: Settings, *, skipped: list[str] | None = None) -> BankRegistry:
    """Read the banks file and the keys file (either may be absent).

    Strict by default (the CLI's edits): any problem raises :class:`BankConfigError`;
    a key bound to a bank that is not declared is an error too, since it would
    silently grant nothing. With ``skipped`` (the server's load, which must fail
    closed), problems are described there instead and what they touch is left out:
    an invalid bank entry and its keys, a key of an undeclared bank, a whole file that
    does not parse (none of its banks or keys). Nothing stale is ever kept.
    """
    bpath, kpath = banks_path(settings), keys_path(settings)
    no_banks: dict[str, Bank] = {}
    banks = _lenient(skipped, lambda: _parse_banks(bpath, _read_mapping(bpath), skipped), no_banks) if bpath.exists() else {}
    keys: dict[str, KeyRecord] = {}
    for bank in banks.values():
        for digest in bank.api_key_sha256:
            keys[digest] = KeyRecord(sha256=digest, bank=bank.name, label="banks file")
    if kpath.exists():
        no_keys: list[KeyRecord] = []
        for record in _lenient(skipped, lambda: _parse_keys(kpath, _read_mapping(kpath), skipped), no_keys):
            if record.bank not in banks:
                problem = (
                    f"{kpath}: key {record.key_id} is bound to bank {record.bank!r}, "
                    f"which {bpath} does not declare"
                )
                if skipped is None:
                    raise BankConfigError(problem)
                skipped.append(problem + " (key skipped)")
                continue
            keys[record.sha256] = record
    return BankRegistry(banks=banks, keys=keys)


_T = TypeVar("_T")


def _lenient(skipped: list[str] | None, load: Callable[[], _T], empty: _T) -> _T:
    """``load()``, or with ``skipped`` its error recorded there and ``empty`` instead."""
    try:
        return load()
    except BankConfigError as exc:
        if skipped is None:
            raise
        skipped.append(f"{exc} (nothing of this file is used)")
        return empty


class RegistrySource:
    """The registry as the files say now, for a running server: it fails closed.

    :meth:`current` (called per request) stats both files and reloads when a
    modification time, size or inode changed, and at least every
    :data:`RELOAD_EVERY_S` seconds whatever the stat says, so ``memstream keys revoke``,
    a removed bank or a moved one take effect within that bound. The load is lenient
    per entry (``load_registry(skipped=...)``): an invalid bank entry is logged with
    its file and line and skipped, and a file that does not parse contributes
    nothing. A broken file is never a reason to keep serving the keys it used to
    grant. The problems of the last load are in :attr:`last_error` (one line).
    """

    RELOAD_EVERY_S = 5.0

    def __init__(
        self,
        settings: Settings,
        loader: Callable[..., BankRegistry] = load_registry,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._settings = settings
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: tuple[Any, ...] | None = None
        self._loaded_at = float("-inf")
        self._registry: BankRegistry | None = None
        self.last_error: str | None = None

    def _file_stamp(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for p in (banks_path(self._settings), keys_path(self._settings)):
            try:
                st = p.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def current(self) -> BankRegistry:
        stamp = self._file_stamp()
        now = self._clock()
        with self._lock:
            if self._registry is None or stamp != self._stamp or now - self._loaded_at >= self.RELOAD_EVERY_S:
                skipped: list[str] = []
                registry = self._loader(self._settings, skipped=skipped)
                error = "; ".join(skipped) or None
                if error is not None and error != self.last_error:
                    for problem in skipped:
                        log.error("bank configuration: %s", problem)
                self._registry, self.last_error = registry, error
                self._stamp, self._loaded_at = stamp, now
            return self._registry


def _toml_str(value: str) -> str:
    # JSON string escapes (with ensure_ascii) are a subset of TOML basic-string escapes.
    return json.dumps(value, ensure_ascii=True)


def _write_keys(path: Path, records: list[KeyRecord]) -> None:
    lines = [
        "# API key hashes written by `memstream keys`. Keys themselves are never stored.",
        "",
    ]
    for r in records:
        lines.append("[[keys]]")
        lines.append(f"sha256 = {_toml_str(r.sha256)}")
        lines.append(f"bank = {_toml_str(r.bank)}")
        if r.label:
            lines.append(f"label = {_toml_str(r.label)}")
        if r.created_at is not None:
            lines.append(f"created_at = {r.created_at.astimezone(timezone.utc).isoformat()}")
        lines.append("")
    _atomic_write(path, "\n".join(lines))


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stored_keys(settings: Settings) -> list[KeyRecord]:
    kpath = keys_path(settings)
    return _parse_keys(kpath, _read_mapping(kpath)) if kpath.exists() else []


def create_key(
    settings: Settings, bank: str, *, label: str = "", now: datetime | None = None
) -> tuple[str, KeyRecord]:
    """Create a key for ``bank``; store its hash in the keys file; return the key (to
    show once) and its record. Fails if the bank is not declared."""
    registry = load_registry(settings)
    registry.bank(bank)
    raw = generate_key()
    record = KeyRecord(
        sha256=hash_key(raw),
        bank=bank,
        label=label,
        created_at=(now or datetime.now(timezone.utc)).replace(microsecond=0),
    )
    _write_keys(keys_path(settings), _stored_keys(settings) + [record])
    return raw, record


def revoke_key(settings: Settings, key_id: str) -> KeyRecord:
    """Remove a key from the keys file by its id (a prefix of its hash, 6+ characters).
    Keys declared in the banks file must be removed there."""
    key_id = key_id.strip().lower()
    if len(key_id) < 6:
        raise BankConfigError("give at least 6 characters of the key id")
    records = _stored_keys(settings)
    matches = [r for r in records if r.sha256.startswith(key_id)]
    if not matches:
        raise BankConfigError(f"no key with id {key_id!r} in {keys_path(settings)}")
    if len(matches) > 1:
        raise BankConfigError(f"key id {key_id!r} is ambiguous; give more characters")
    _write_keys(keys_path(settings), [r for r in records if r is not matches[0]])
    return matches[0]


def add_bank(settings: Settings, bank: Bank) -> Path:
    """Append ``bank`` to the banks file (created when absent). TOML only: a YAML file
    is the operator's own, edit it by hand. Refuses a name that is already declared."""
    path = banks_path(settings)
    if path.suffix.lower() in (".yaml", ".yml"):
        raise BankConfigError(f"{path} is YAML: add the bank there by hand")
    existing = load_registry(settings).banks if path.exists() else {}
    if bank.name in existing:
        raise BankConfigError(f"bank {bank.name!r} is already declared in {path}")
    lines = [f"[banks.{_toml_str(bank.name)}]", f"team_id = {_toml_str(bank.team_id)}"]
    for name in ("user_id", "agent_id"):
        value = getattr(bank, name)
        if value is not None:
            lines.append(f"{name} = {_toml_str(value)}")
    lines.append(f"description = {_toml_str(bank.description)}")
    if bank.memory_template is not None:
        lines.append(f"memory_template = {_toml_str(bank.memory_template)}")
    if bank.default_memory_type != MemoryType.episodic:
        lines.append(f"default_memory_type = {_toml_str(bank.default_memory_type.value)}")
    previous = path.read_text(encoding="utf-8") if path.exists() else "# Memory banks (see `memstream banks add`).\n"
    _atomic_write(path, previous.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    load_registry(settings)  # the file must still parse
    return path


def write_default_bank(settings: Settings, *, name: str = "default", team_id: str = "default") -> Bank:
    """Create a banks file with one team-wide bank (first run of ``memstream up``).
    Refuses to touch an existing file."""
    path = banks_path(settings)
    if path.exists():
        raise BankConfigError(f"{path} already exists")
    bank = Bank(
        name=name,
        team_id=team_id,
        description="Durable facts, preferences and instructions the user shares with the assistant.",
    )
    text = (
        "# Memory banks: one named memory space each (see `memstream keys create --bank NAME`).\n"
        f"[banks.{bank.name}]\n"
        f"team_id = {_toml_str(bank.team_id)}\n"
        f"description = {_toml_str(bank.description)}\n"
        '# user_id = "alice"\n'
        '# memory_template = "{content} (noted {now:%Y-%m-%d %H:%M} UTC)"\n'
    )
    _atomic_write(path, text)
    return bank
