"""memstream's typed settings: the :class:`Settings` object and how it is read
(``model``), its component groups (``groups``), the flat names of earlier releases
(``legacy``) and the generated tables of docs/configuration.md (``docs``)."""

from __future__ import annotations

from memstream.settings.groups import (
    ApiSettings,
    BrokerSettings,
    EmbeddingSettings,
    ExtractionSettings,
    OBJECT_SCHEMES,
    ObjectRoot,
    READER_GRACE_S,
    SecuritySettings,
    StorageSettings,
    WorkerSettings,
)
from memstream.settings.legacy import env_name
from memstream.settings.model import (
    CONFIG_FILE,
    ENV_PREFIX,
    HOME_RELATIVE_PATHS,
    LOCAL_WORKER_PRINCIPAL,
    LocalBrokerConfig,
    Settings,
    StreamsConfig,
    child_env,
    get_settings,
    load_settings,
    parse_log_level,
    setting_fields,
    settings_env,
)

__all__ = [
    "ApiSettings",
    "BrokerSettings",
    "CONFIG_FILE",
    "ENV_PREFIX",
    "EmbeddingSettings",
    "ExtractionSettings",
    "HOME_RELATIVE_PATHS",
    "LOCAL_WORKER_PRINCIPAL",
    "LocalBrokerConfig",
    "OBJECT_SCHEMES",
    "ObjectRoot",
    "READER_GRACE_S",
    "SecuritySettings",
    "Settings",
    "StorageSettings",
    "StreamsConfig",
    "WorkerSettings",
    "child_env",
    "env_name",
    "get_settings",
    "load_settings",
    "parse_log_level",
    "setting_fields",
    "settings_env",
]
