"""All configuration in one typed object, read from ``MEMSTREAM_*`` environment variables,
an optional ``.env`` file in the working directory and an optional ``config.env`` in
``MEMSTREAM_HOME`` (in that order of precedence). Nothing else in memstream reads the
environment; the way back, settings written as variables for a child process
(:func:`settings_env`, :func:`child_env`), lives here too, so the mapping exists once.

The settings are grouped by component (``memstream.settings.groups``): ``settings.broker``,
``settings.storage``... and a component takes its own group (memstream's Kafka clients
take ``settings.streams`` and the local broker ``settings.local_broker``: the groups they
need and the files they use, resolved under ``home``). ``<group>.<field>`` is the
variable ``MEMSTREAM_<GROUP>_<FIELD>``; docs/configuration.md lists them all (checked
against these models). The flat names of earlier releases still work for one release
(``memstream.settings.legacy``).

Every path setting ends up absolute: ``home`` against the working directory, every
other relative path under ``home``. So one set of variables (an MCP host's snippet
names only ``MEMSTREAM_HOME``) means the same files from any working directory.

Secrets (API keys) are ``SecretStr``: they never appear in reprs or logs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from memstream.settings.groups import (
    ADVANCED,
    OBJECT_SCHEMES,
    READER_GRACE_S,
    ApiSettings,
    BrokerSettings,
    EmbeddingSettings,
    ExtractionSettings,
    ObjectRoot,
    SecuritySettings,
    StorageSettings,
    WorkerSettings,
    advanced,
)
from memstream.settings.legacy import GROUPS, RENAMED, LegacyEnvSource, env_name, nest

__all__ = [
    "Settings",
    "StreamsConfig",
    "LocalBrokerConfig",
    "ApiSettings",
    "BrokerSettings",
    "EmbeddingSettings",
    "ExtractionSettings",
    "SecuritySettings",
    "StorageSettings",
    "WorkerSettings",
    "ObjectRoot",
    "OBJECT_SCHEMES",
    "get_settings",
    "load_settings",
    "settings_env",
    "child_env",
    "setting_fields",
    "parse_log_level",
    "ENV_PREFIX",
    "LOCAL_WORKER_PRINCIPAL",
    "CONFIG_FILE",
    "HOME_RELATIVE_PATHS",
    "READER_GRACE_S",
]

ENV_PREFIX = "MEMSTREAM_"
CONFIG_FILE = "config.env"
"""``MEMSTREAM_*`` lines read from ``<home>/config.env`` by every command, whatever its
working directory (the environment and a ``.env`` file win over it)."""
HOME_RELATIVE_PATHS = (
    "storage.root",
    "broker.dir",
    "broker.kafka_cache_dir",
    "extraction.prompts_dir",
    "worker.outcome_prices_path",
    "api.banks_file",
    "api.keys_file",
    "api.console_operator_token_file",
    "security.master_key_file",
    "broker.password_file",
    "broker.ssl_cafile",
)
"""Path settings that, when relative, are resolved under ``home``."""


LOCAL_WORKER_PRINCIPAL = "memstream-worker"
"""The local ACL-mode broker's worker principal (``streams/broker/acl.py`` has them all)."""
CREDENTIALS_DIR = "kafka"
"""Under ``home``: the local ACL-mode broker's password files, one per principal."""


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


@dataclass(frozen=True)
class StreamsConfig:
    """What memstream's Kafka clients (``streams/``) take: the broker and security groups
    and this host's two key files, resolved under ``home`` (``Settings.streams``)."""

    broker: BrokerSettings
    security: SecuritySettings
    master_key_file: Path
    worker_key_file: Path


@dataclass(frozen=True)
class LocalBrokerConfig:
    """What the local broker's lifecycle (``streams/broker/``) takes: the broker group,
    the app id its ACLs name, and its directories (``Settings.local_broker``)."""

    broker: BrokerSettings
    app_id: str
    broker_dir: Path
    credentials_dir: Path
    """``<home>/kafka``: the ACL-mode principals' password files."""
    kafka_cache_dir: Path


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
    )

    home: Path = Path(".memstream")
    """memstream's own directory: the local broker's data, banks, keys, the LanceDB
    tables and ``config.env`` (relative: against the working directory)."""
    log_level: str = advanced("WARNING")
    """Level of the CLI's log lines on stderr (debug, info, warning, error)."""
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    extraction: ExtractionSettings = Field(default_factory=ExtractionSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)

    def __init__(self, **values: Any) -> None:
        # Old flat keywords go into their groups before the sources are merged, so a
        # keyword still beats the environment whichever name either uses.
        super().__init__(**nest(values))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        legacy = LegacyEnvSource(settings_cls, getattr(dotenv_settings, "env_file", None))
        return init_settings, env_settings, dotenv_settings, legacy, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Old flat keywords (``Settings(partitions=6)``) go into their groups."""
        return nest(data) if isinstance(data, dict) else data

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        parse_log_level(value)
        return value.strip().upper()

    @model_validator(mode="after")
    def _resolve(self) -> "Settings":
        """ACL-mode defaults, then ``home`` against the working directory and every
        other relative path under ``home`` (frozen models: set once, here)."""
        broker = self.broker
        if broker.acl:
            if broker.security_protocol == "PLAINTEXT":
                object.__setattr__(broker, "security_protocol", "SASL_PLAINTEXT")
            if broker.username in (None, "") and broker.password is None:
                object.__setattr__(broker, "username", LOCAL_WORKER_PRINCIPAL)
                if broker.password_file is None:
                    object.__setattr__(broker, "password_file", Path(CREDENTIALS_DIR, f"{LOCAL_WORKER_PRINCIPAL}.password"))
        home = _absolute(self.home, Path.cwd())
        object.__setattr__(self, "home", home)
        for path in HOME_RELATIVE_PATHS:
            group_name, name = path.split(".")
            group = getattr(self, group_name)
            value = getattr(group, name)
            if isinstance(value, ObjectRoot):
                object.__setattr__(group, name, ObjectRoot(value.uri, self.storage.storage_options()))
            elif value is not None:
                object.__setattr__(group, name, _absolute(value, home))
        return self

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            """``settings.<old flat name>`` reads the setting it became (one release)."""
            path = RENAMED.get(name)
            if path is None:
                return super().__getattr__(name)
            group, field = path.split(".")
            return getattr(getattr(self, group), field)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "Settings":
        """A copy with ``update`` applied; keys may be group names, ``group.field`` or
        old flat names (each lands in its group)."""
        if not update:
            return super().model_copy(deep=deep)
        flat = {k: v for k, v in update.items() if "." not in k}
        for key, value in update.items():
            if "." in key:
                group, name = key.split(".", 1)
                flat.setdefault(group, {})[name] = value
        changes: dict[str, Any] = {}
        for key, value in nest(flat).items():
            current = getattr(self, key, None)
            if isinstance(value, dict) and isinstance(current, BaseModel):
                value = current.model_copy(update=value)
            changes[key] = value
        return super().model_copy(update=changes, deep=deep)

    def storage_options(self) -> dict[str, str]:
        """The object store's connection options (``storage.storage_options``)."""
        return self.storage.storage_options()

    @property
    def on_object_store(self) -> bool:
        return self.storage.on_object_store

    @property
    def local_lance_dir(self) -> Path:
        """``storage.root`` where a command needs it on this machine's disk (a
        ``ValueError`` names an object-store root)."""
        return self.storage.local_root

    @property
    def config_file(self) -> Path:
        """``<home>/config.env``: settings every command reads, from any directory."""
        return self.home / CONFIG_FILE

    @property
    def resolved_broker_dir(self) -> Path:
        return self.broker.dir or (self.home / "broker")

    @property
    def resolved_kafka_cache_dir(self) -> Path:
        return self.broker.kafka_cache_dir or (Path.home() / ".cache" / "memstream")

    @property
    def credentials_dir(self) -> Path:
        return self.home / CREDENTIALS_DIR

    @property
    def resolved_master_key_file(self) -> Path:
        return self.security.master_key_file or (self.home / "master.key")

    @property
    def resolved_worker_key_file(self) -> Path:
        return self.security.worker_key_file or (self.home / "worker.key")

    @property
    def streams(self) -> StreamsConfig:
        return StreamsConfig(self.broker, self.security, self.resolved_master_key_file, self.resolved_worker_key_file)

    @property
    def local_broker(self) -> LocalBrokerConfig:
        return LocalBrokerConfig(
            self.broker, self.worker.app_id, self.resolved_broker_dir, self.credentials_dir, self.resolved_kafka_cache_dir
        )


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


def setting_fields(settings: Settings | None = None) -> Iterator[tuple[str, FieldInfo, Any]]:
    """Every setting as ``(path, field, value)``: ``home``, ``log_level``, then each
    group's fields as ``group.field`` (values from ``settings``, or the defaults)."""
    settings = settings if settings is not None else Settings.model_construct()
    for name in ("home", "log_level"):
        yield name, Settings.model_fields[name], getattr(settings, name)
    for group_name in GROUPS:
        group = getattr(settings, group_name)
        for name, info in type(group).model_fields.items():
            yield f"{group_name}.{name}", info, getattr(group, name)


def is_advanced(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(ADVANCED))


def settings_env(settings: Settings) -> dict[str, str]:
    """``MEMSTREAM_*`` variables that reproduce ``settings`` in a child process: every
    field that is set (``None`` ones stay unset), secrets revealed for the child only."""
    env: dict[str, str] = {}
    for path, _info, value in setting_fields(settings):
        if value is None:
            continue
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[env_name(path)] = text
    return env


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that must use exactly ``settings``: ``base``
    (default: this process's environment) without its own ``MEMSTREAM_*`` variables,
    plus :func:`settings_env` (so a setting left unset here is unset there too)."""
    inherited = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.upper().startswith(ENV_PREFIX)
    }
    return {**inherited, **settings_env(settings)}
