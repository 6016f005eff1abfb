"""How every memstream Kafka client connects: the one place its address and security
(SASL, TLS) come from settings (:func:`kafka_options`; faust's from the same, in
``memstream.services.app``), and
starting clients while the broker may be briefly unreachable.

Why: a worker restarted during a broker restart (a rolling upgrade, the chaos
benchmark) found no broker for a few seconds and crashed at start-up, so a supervisor
had to notice and start it again. A client that cannot *bootstrap* is retried here with
back-off until the broker answers or the worker stops; every other error still fails
the start at once (a wrong address stays visible in the log as a warning every time it
is retried).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from memstream.settings import BrokerSettings

__all__ = ["kafka_options", "kafka_password", "KafkaSecurityError", "until_reachable", "until_started"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Client(Protocol):
    async def start(self) -> Any: ...

    async def stop(self) -> Any: ...


C = TypeVar("C", bound=_Client)


class KafkaSecurityError(ValueError):
    """The client security settings are incomplete (a one-line reason)."""


def kafka_password(broker: BrokerSettings) -> str | None:
    """``kafka_password``, else the content of ``kafka_password_file`` (stripped)."""
    if broker.password is not None:
        return broker.password.get_secret_value()
    if broker.password_file is None:
        return None
    try:
        return broker.password_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KafkaSecurityError(
            f"cannot read the Kafka password of {broker.username!r} from {broker.password_file}: "
            f"{exc.strerror or exc} (ACL mode: `memstream broker start --acl` creates it)"
        ) from None


@lru_cache(maxsize=8)
def _ssl_context(cafile: Path | None) -> ssl.SSLContext:
    return create_ssl_context(cafile=str(cafile) if cafile else None)


def _sasl(broker: BrokerSettings) -> tuple[str, str]:
    password = kafka_password(broker)
    if not broker.username or password is None:
        raise KafkaSecurityError(
            f"MEMSTREAM_BROKER_SECURITY_PROTOCOL={broker.security_protocol} needs "
            "MEMSTREAM_BROKER_USERNAME and MEMSTREAM_BROKER_PASSWORD (or MEMSTREAM_BROKER_PASSWORD_FILE)"
        )
    return broker.username, password


def kafka_options(broker: BrokerSettings, *, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Keyword arguments every aiokafka client (producer, consumer, admin) of memstream
    is built with: the bootstrap address and the security settings."""
    options: dict[str, Any] = {"bootstrap_servers": bootstrap_servers or broker.bootstrap_servers}
    protocol = broker.security_protocol
    if protocol == "PLAINTEXT":
        return options
    options["security_protocol"] = protocol
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _ssl_context(broker.ssl_cafile)
    if protocol.startswith("SASL_"):
        username, password = _sasl(broker)
        options.update(sasl_mechanism=broker.sasl_mechanism, sasl_plain_username=username, sasl_plain_password=password)
    return options


_FIRST_DELAY_S = 0.5
_MAX_DELAY_S = 5.0
_WARN_EVERY_S = 30.0


async def until_reachable(attempt: Callable[[], Awaitable[T]], what: str, *, max_delay_s: float = _MAX_DELAY_S) -> T:
    """``await attempt()`` until it does not fail with ``KafkaConnectionError``
    (back-off 0.5 s doubling to ``max_delay_s``). ``attempt`` must leave nothing open
    when it fails (stop the client it created). Cancellation stops the waiting."""
    warned_at = float("-inf")
    failures = 0

    def failed(state: RetryCallState) -> None:
        nonlocal warned_at, failures
        failures = state.attempt_number
        if time.monotonic() - warned_at >= _WARN_EVERY_S:  # a warning every 30 s, not every attempt
            warned_at = time.monotonic()
            error = state.outcome.exception() if state.outcome else None
            log.warning("%s: Kafka unreachable (%s); retrying until it answers", what, error)

    async def call() -> T:  # tenacity awaits only coroutine functions, not a lambda's coroutine
        return await attempt()

    result: T = await AsyncRetrying(
        retry=retry_if_exception_type(KafkaConnectionError),
        wait=wait_exponential(multiplier=_FIRST_DELAY_S, max=max_delay_s),
        before_sleep=failed,
        reraise=True,
    )(call)
    if failures:
        log.info("%s: connected after %d failed attempt(s)", what, failures)
    return result


async def until_started(make: Callable[[], C], what: str, *, max_delay_s: float = _MAX_DELAY_S) -> C:
    """A started client from ``make()``, retried as :func:`until_reachable` does; a
    client whose start failed is stopped before the next one is made."""

    async def attempt() -> C:
        client = make()
        try:
            await client.start()
        except BaseException:
            await client.stop()
            raise
        return client

    return await until_reachable(attempt, what, max_delay_s=max_delay_s)
