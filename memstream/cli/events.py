"""CLI commands for events: ``memstream produce`` and ``memstream tail``.

``produce`` is the shell's door into the log: JSON lines in, durable events out. It
validates each line through exactly the path every consumer uses
(:func:`memstream.codec.wire.decode_record`, which upcasts), so a line it
accepts is a line every reader accepts; a rejected line is reported with its number
and reason and the valid ones are still sent (exit code 1 tells scripts that some
were rejected).

``tail`` is for looking at a topic: events pretty-printed, dead letters with their
reason and source position, undecodable records with why.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from memstream.cli._errors import CLIError
from memstream.settings import Settings, get_settings

if TYPE_CHECKING:  # the Kafka side is imported where a command runs, not for `--help`
    from aiokafka import ConsumerRecord

    from memstream.domain.log import LogPosition
    from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["register", "produce", "tail"]

_PREVIEW_CHARS = 400


def _kafka_error(settings: Settings, exc: BaseException) -> CLIError:
    return CLIError(f"cannot reach Kafka at {settings.broker.bootstrap_servers}: {exc}")


# --- produce ---------------------------------------------------------------------------


def _report(line: str) -> None:
    """One unwrapped line on stderr (scripts grep these; rich would wrap them)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _LineSource:
    """Lines of a file, or of a pipe read by a daemon thread.

    A pipe (stdin) can stay silent for a long time; reading it on the event loop would
    stall the producer's network I/O, and reading it in the default executor would make
    Ctrl-C wait for the next line at exit. A daemon thread feeding a queue does neither.
    """

    def __init__(self, stream: IO[bytes], *, blocking_ok: bool) -> None:
        self._stream = stream
        self._blocking_ok = blocking_ok
        self._queue: asyncio.Queue[bytes | None] | None = None

    def _start_reader(self) -> asyncio.Queue[bytes | None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=10_000)

        def deliver(item: bytes | None) -> bool:
            try:
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            except RuntimeError:  # the loop is gone: the command ended (error or Ctrl-C)
                return False
            return True

        def pump() -> None:
            # Raw reads on the descriptor: a daemon thread blocked inside a buffered
            # reader holds its lock, and interpreter shutdown (Ctrl-C) then aborts.
            fd = self._stream.fileno()
            pending = b""
            try:
                while chunk := os.read(fd, 1 << 16):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if not deliver(line + b"\n"):
                            return
            except OSError:  # stdin closed under us: treat as the end
                pass
            if pending and not deliver(pending):
                return
            deliver(None)

        threading.Thread(target=pump, name="memstream-produce-stdin", daemon=True).start()
        return queue

    async def next(self) -> bytes | None:
        """The next raw line, or None at the end."""
        if self._blocking_ok:
            raw = self._stream.readline()
            return raw if raw else None
        if self._queue is None:
            self._queue = self._start_reader()
        return await self._queue.get()


async def _produce(source: _LineSource, topic: str | None, settings: Settings) -> int:
    from aiokafka.errors import KafkaConnectionError, KafkaError

    from memstream.codec.wire import DecodeError, EncodeError, decode_record, encode_event
    from memstream.streams.producers.producer import MemstreamProducer
    from memstream.streams.topics import Topics

    topics = Topics.from_settings(settings.broker)
    target = topics.resolve(topic) if topic else None
    producer: MemstreamProducer | None = None
    pending: list[tuple[int, asyncio.Future[LogPosition]]] = []
    rejected = 0
    sent: Counter[str] = Counter()
    failed = 0
    line_no = 0
    checked: set[str] = set()
    try:
        while (raw := await source.next()) is not None:
            line_no += 1
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                # A new event: missing ids and times are filled in here, once.
                event = decode_record(line, require_envelope=False)
                record = encode_event(event)
            except (DecodeError, EncodeError) as exc:
                rejected += 1
                _report(f"line {line_no}: {exc.reason}")
                continue
            if producer is None:
                producer = MemstreamProducer(settings.streams, topics=topics, client_id="memstream-cli")
                try:
                    await producer.start()
                except (KafkaConnectionError, KafkaError, OSError) as exc:
                    raise _kafka_error(settings, exc) from None
            destination = producer.topic_of(event, target)
            if destination not in checked:
                # Fail at once with a clear line: a send to a missing topic would wait for
                # metadata until the request timeout (the broker does not auto-create).
                await _partitions(destination, settings, hint="; create the topics with `memstream topics create`")
                checked.add(destination)
            pending.append((line_no, await producer.send_encoded(destination, record)))
            if len(pending) >= 1000:
                failed += await _settle(pending, sent)
                pending = []
        if pending:
            failed += await _settle(pending, sent)
    finally:
        if producer is not None:
            await producer.stop()
    total = sum(sent.values())
    per_topic = ", ".join(f"{name}: {n}" for name, n in sorted(sent.items()))
    summary = f"sent {total} event{'s' if total != 1 else ''}"
    summary += f" ({per_topic})" if per_topic else ""
    summary += f"; rejected {rejected} line{'s' if rejected != 1 else ''}"
    if failed:
        summary += f"; {failed} failed to send"
    sys.stdout.write(summary + "\n")
    sys.stdout.flush()
    return 1 if rejected or failed else 0


async def _settle(pending: list[tuple[int, asyncio.Future[LogPosition]]], sent: Counter[str]) -> int:
    failed = 0
    results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
    for (line_no, _), result in zip(pending, results):
        if isinstance(result, BaseException):
            failed += 1
            _report(f"line {line_no}: not sent: {type(result).__name__}: {result}")
        else:
            sent[result.topic] += 1
    return failed


def produce(
    file: Annotated[str, typer.Argument(help="JSON-lines file, or - for stdin.")] = "-",
    topic: Annotated[
        str | None,
        typer.Option("--topic", "-t", help="Send every event here (short names like 'events' get the prefix). Default: each event's own topic."),
    ] = None,
) -> None:
    """Validate JSON lines (one event each) and send the valid ones durably.

    Every rejected line is reported with its number and reason; the exit code is 1 if
    any line was rejected or not sent.
    """
    settings = get_settings()
    if file == "-":
        stream: IO[bytes] = sys.stdin.buffer
        code = asyncio.run(_produce(_LineSource(stream, blocking_ok=stream.seekable()), topic, settings))
    else:
        path = Path(file)
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise CLIError(f"cannot read {file}: {exc.strerror or exc}") from None
        with handle:
            code = asyncio.run(_produce(_LineSource(handle, blocking_ok=True), topic, settings))
    if code:
        raise typer.Exit(code)


# --- tail ------------------------------------------------------------------------------


def _preview(value: bytes | None) -> str:
    if value is None:
        return "(no value)"
    text = value.decode("utf-8", "backslashreplace")
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + f"... ({len(value)} bytes)"


def _when(timestamp_ms: int) -> str:
    if timestamp_ms is None or timestamp_ms < 0:
        return "-"
    return datetime.fromtimestamp(timestamp_ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _print_record(console: Console, rec: ConsumerRecord[bytes, bytes], raw: bool) -> None:
    from rich.json import JSON

    from memstream.domain.log import PositionedEvent
    from memstream.streams.dead_letters.publisher import is_dead_letter, parse_dead_letter
    from memstream.streams.records.codec import read_record

    if raw:
        value = rec.value.decode("utf-8", "backslashreplace") if rec.value is not None else ""
        sys.stdout.write(value + "\n")
        sys.stdout.flush()
        return
    where = f"{rec.topic}:{rec.partition}:{rec.offset}"
    key = rec.key.decode("utf-8", "backslashreplace") if rec.key is not None else "-"
    if is_dead_letter(rec.headers):
        dl = parse_dead_letter(rec.key, rec.value, rec.headers)
        head = Text()
        head.append(f"{where} ", style="dim")
        head.append("DEAD LETTER", style="bold red")
        head.append(f"  from {dl.source_topic}:{dl.source_partition}:{dl.source_offset}  stage={dl.stage}  {_when(rec.timestamp)}")
        console.print(head)
        console.print(Text(f"  reason: {dl.reason}", style="red"))
        console.print(Text(f"  value:  {_preview(dl.original_value)}"))
        return
    item = read_record(None, rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.headers)
    if not isinstance(item, PositionedEvent):
        head = Text()
        head.append(f"{where} ", style="dim")
        head.append("UNDECODABLE", style="bold yellow")
        head.append(f"  key={key}  {_when(rec.timestamp)}")
        console.print(head)
        console.print(Text(f"  reason: {item.reason if item is not None else 'sealed'}", style="yellow"))
        console.print(Text(f"  value:  {_preview(rec.value)}"))
        return
    event = item.event
    head = Text()
    head.append(f"{where} ", style="dim")
    head.append(event.type, style="bold cyan")
    head.append(f" v{event.schema_version}  ")
    scope = event.scope
    head.append(f"{scope.team_id}/{scope.user_id}/{scope.agent_id}", style="green")
    head.append(f"  {_when(rec.timestamp)}", style="dim")
    console.print(head)
    body = event.model_dump(mode="json", exclude_none=True)
    console.print(JSON(json.dumps(body, ensure_ascii=False)))


async def _partitions(topic: str, settings: Settings, *, hint: str = "") -> list[int]:
    """The partitions of ``topic``; a CLIError if it does not exist.

    Existence is checked in the full topic list first: a metadata request naming a
    missing topic makes a broker with ``auto.create.topics.enable`` create it, and a
    typo must not become a topic."""
    from aiokafka.errors import KafkaConnectionError, KafkaError

    from memstream.streams.admin import topic_partitions

    try:
        found = await topic_partitions(settings.broker, [topic], client_id="memstream-cli")
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        raise _kafka_error(settings, exc) from None
    if topic not in found:
        raise CLIError(f"topic {topic} does not exist{hint}")
    return found[topic]


async def _tail(
    topic: str,
    *,
    from_beginning: bool,
    offset: int | None,
    partition: int | None,
    max_records: int | None,
    follow: bool,
    raw: bool,
    settings: Settings,
) -> int:
    from aiokafka import TopicPartition
    from aiokafka.errors import KafkaConnectionError, KafkaError

    from memstream.streams.clients import create_consumer

    console = Console(highlight=False, soft_wrap=True)
    parts = await _partitions(topic, settings)
    if partition is not None:
        if partition not in parts:
            raise CLIError(f"topic {topic} has no partition {partition} (it has {len(parts)})")
        parts = [partition]
    consumer = create_consumer(
        settings.broker,
        client_id="memstream-tail",
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        await consumer.start()
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        await consumer.stop()
        raise _kafka_error(settings, exc) from None
    try:
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        for tp in tps:
            if offset is not None:
                consumer.seek(tp, max(begin[tp], min(offset, end[tp])))
            elif from_beginning:
                consumer.seek(tp, begin[tp])
            else:
                consumer.seek(tp, end[tp])
        printed = 0
        idle_polls = 0
        while max_records is None or printed < max_records:
            polled = await consumer.getmany(timeout_ms=1000, max_records=500)
            got = False
            for records in polled.values():
                for rec in records:
                    got = True
                    _print_record(console, rec, raw)
                    printed += 1
                    if max_records is not None and printed >= max_records:
                        return 0
            if follow:
                continue
            idle_polls = 0 if got else idle_polls + 1
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= end[tp] for pos, tp in zip(positions, tps)) or idle_polls >= 3:
                return 0
        return 0
    finally:
        await consumer.stop()


def tail(
    topic: Annotated[str, typer.Argument(help="Topic name, or a short name: ingress, events, messages, outcomes, pending-reflections, dead-letter, keys.")],
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record.")] = False,
    offset: Annotated[int | None, typer.Option("--offset", min=0, help="Start at this offset (in every partition read).")] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Read only this partition.")] = None,
    max_records: Annotated[int | None, typer.Option("--max", "-n", min=1, help="Stop after this many records.")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Keep waiting for new records, or stop at the current end.")] = True,
    raw: Annotated[bool, typer.Option("--raw", help="Print record values as they are, one per line.")] = False,
) -> None:
    """Print the records of a topic: from the end (default), the beginning or an offset.

    Events are pretty-printed; dead letters show their reason and source position.
    """
    from memstream.streams.topics import Topics

    if from_beginning and offset is not None:
        raise CLIError("use either --from-beginning or --offset, not both")
    settings = get_settings()
    name = Topics.from_settings(settings.broker).resolve(topic)
    asyncio.run(
        _tail(
            name,
            from_beginning=from_beginning,
            offset=offset,
            partition=partition,
            max_records=max_records,
            follow=follow,
            raw=raw,
            settings=settings,
        )
    )


def register(app: typer.Typer) -> None:
    """Add ``produce`` and ``tail`` to the main app."""
    app.command("produce")(produce)
    app.command("tail")(tail)
