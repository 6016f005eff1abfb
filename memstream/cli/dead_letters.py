"""``memstream dead-letters``: what memstream could not read, and why, for the operator.

``list`` prints one line per letter, ``show`` one letter whole, ``count`` the letters by
reason code and stage. Sealed reasons and values are opened with the master key of
the host it runs on (the worker's: ``MEMSTREAM_HOME/master.key`` or
``MEMSTREAM_SECURITY_MASTER_KEY``); without it they are listed as sealed. Codes are the stable
ones of docs/producers.md (:mod:`memstream.streams.dead_letters.reasons`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Annotated

import typer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from memstream.cli._errors import CLIError, err_console

__all__ = ["register", "parse_time"]

app = typer.Typer(help="Read the dead-letter topic: reasons opened, counted, filtered.", no_args_is_help=True)
_console = Console(highlight=False, soft_wrap=True)
_AGO = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_PREVIEW = 400


def parse_time(text: str, now: datetime | None = None) -> int:
    """``--since``/``--until``: an ISO 8601 time (UTC when it names no zone) or an age
    such as ``30m``, ``2h``, ``7d``; as Kafka milliseconds."""
    now = now or datetime.now(timezone.utc)
    ago = _AGO.match(text.strip())
    if ago:
        return int((now - timedelta(**{_UNITS[ago[2]]: int(ago[1])})).timestamp() * 1000)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CLIError(f"not a time: {text!r} (use ISO 8601, e.g. 2026-12-01T10:00, or an age: 30m, 2h, 7d)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


@asynccontextmanager
async def _keyring(settings):  # type: ignore[no-untyped-def]
    """The keyring that opens sealed letters, or None (sealing off, or no master key
    here: the letters are then listed sealed, with a warning)."""
    from memstream.sealing import MasterKeyError
    from memstream.streams.sealing.keys import SubjectKeys

    if not settings.security.sealing:
        yield None
        return
    keys = SubjectKeys(settings.streams, client_id="memstream-dead-letters-keys")
    try:
        await keys.start()
    except MasterKeyError as exc:
        err_console.print(f"warning: sealed reasons stay sealed: {exc}", highlight=False, markup=False)
        yield None
        return
    try:
        yield keys.keyring
    finally:
        await keys.stop()


def _letters(
    topic: str | None, since: str | None, until: str | None, team: str | None, user: str | None,
    stage: str | None, code: str | None, offset: int | None = None,
) -> Callable[[Callable[[object], None]], None]:
    """A runner feeding each matching letter to a callback (Kafka errors as one line)."""
    from memstream.settings import get_settings
    from memstream.streams.dead_letters.reader import LetterFilter, read_letters
    from memstream.streams.topics import Topics

    settings = get_settings()
    topics = Topics.from_settings(settings.broker)
    wanted = LetterFilter(
        source_topic=topics.resolve(topic) if topic else None, team_id=team, user_id=user, stage=stage,
        code=code, until_ms=parse_time(until) if until else None,
    )
    since_ms = parse_time(since) if since else None

    async def each(callback: Callable[[object], None]) -> None:
        async with _keyring(settings) as keyring:
            letters: AsyncIterator = read_letters(settings.broker, topics.dead_letter, keyring, since_ms=since_ms, offset=offset)  # type: ignore[type-arg]
            async for item in letters:
                if wanted(item):
                    callback(item)

    def run(callback: Callable[[object], None]) -> None:
        try:
            asyncio.run(each(callback))
        except LookupError as exc:
            raise CLIError(f"{exc}; create the topics with `memstream topics create`") from None
        except (KafkaError, OSError) as exc:
            raise CLIError(f"cannot read {topics.dead_letter} at {settings.broker.bootstrap_servers}: {exc}") from None

    return run


_Topic = Annotated[str | None, typer.Option("--topic", "-t", help="Only letters read from this topic (short names: ingress, events...).")]
_Since = Annotated[str | None, typer.Option("--since", help="From this time: ISO 8601 or an age (30m, 2h, 7d).")]
_Until = Annotated[str | None, typer.Option("--until", help="Up to this time: ISO 8601 or an age.")]
_Team = Annotated[str | None, typer.Option("--team", help="Only letters of this team.")]
_User = Annotated[str | None, typer.Option("--user", help="Only letters of this user.")]
_Stage = Annotated[str | None, typer.Option("--stage", help="Only this stage: seal, decode, project, extract, reflect.")]
_Code = Annotated[str | None, typer.Option("--code", help="Only this reason code (see `count`).")]
_Json = Annotated[bool, typer.Option("--json", help="One JSON object per letter.")]


def _as_json(item) -> dict[str, object]:  # type: ignore[no-untyped-def]
    dl = item.letter
    return {
        "offset": item.offset, "time": item.when.isoformat().replace("+00:00", "Z"), "code": item.code,
        "stage": dl.stage, "reason": item.reason, "sealed": item.sealed,
        "source": f"{dl.source_topic}:{dl.source_partition}:{dl.source_offset}",
        "team_id": item.team_id, "user_id": item.user_id,
    }


def list_cmd(
    topic: _Topic = None, since: _Since = None, until: _Until = None, team: _Team = None, user: _User = None,
    stage: _Stage = None, code: _Code = None, as_json: _Json = False,
    limit: Annotated[int | None, typer.Option("--max", "-n", min=1, help="Stop after this many letters.")] = None,
) -> None:
    """One line per dead letter: offset, time, code, stage, source, space and the full reason."""
    shown = 0

    def show(item) -> None:  # type: ignore[no-untyped-def]
        nonlocal shown
        if limit is not None and shown >= limit:
            return
        shown += 1
        if as_json:
            typer.echo(json.dumps(_as_json(item), ensure_ascii=False))
            return
        dl = item.letter
        line = Text()
        line.append(f"{item.offset} ", style="dim")
        line.append(f"{item.when:%Y-%m-%d %H:%M:%S}Z ", style="dim")
        line.append(item.code, style="bold red")
        line.append(f" [{dl.stage}] {dl.source_topic}:{dl.source_partition}:{dl.source_offset} {item.team_id or '-'}/{item.user_id or '-'}  ")
        line.append(item.reason)
        _console.print(line)

    _letters(topic, since, until, team, user, stage, code)(show)
    if not as_json:
        err_console.print(f"{shown} dead letter{'s' if shown != 1 else ''}", highlight=False)


def show_cmd(offset: Annotated[int, typer.Argument(min=0, help="The letter's offset in the dead-letter topic (from `list`).")]) -> None:
    """One dead letter whole: where it came from, why, its headers and its value (opened)."""
    found: list[object] = []
    _letters(None, None, None, None, None, None, None, offset=offset)(found.append)
    if not found:
        raise CLIError(f"no dead letter at offset {offset}")
    item = found[0]
    dl = item.letter  # type: ignore[attr-defined]
    body = _as_json(item)
    body["key"] = dl.original_key.decode("utf-8", "backslashreplace") if dl.original_key is not None else None
    body["headers"] = {k: v.decode("utf-8", "backslashreplace") for k, v in dl.original_headers if not k.startswith("memstream-dlq-")}
    value = item.value  # type: ignore[attr-defined]
    text = value.decode("utf-8", "backslashreplace") if value is not None else None
    body["value"] = text if text is None or len(text) <= _PREVIEW * 10 else text[: _PREVIEW * 10] + "..."
    typer.echo(json.dumps(body, ensure_ascii=False, indent=2))


def count_cmd(
    topic: _Topic = None, since: _Since = None, until: _Until = None, team: _Team = None, user: _User = None,
    stage: _Stage = None, as_json: _Json = False,
) -> None:
    """Dead letters counted by reason code and stage (most first)."""
    counts: Counter[tuple[str, str]] = Counter()
    _letters(topic, since, until, team, user, stage, None)(lambda item: counts.update([(item.code, item.letter.stage)]))  # type: ignore[attr-defined]
    if as_json:
        typer.echo(json.dumps([{"code": c, "stage": s, "count": n} for (c, s), n in counts.most_common()]))
        return
    table = Table(title=f"{sum(counts.values())} dead letter(s)")
    for column in ("code", "stage", "count"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for (c, s), n in counts.most_common():
        table.add_row(c, s, str(n))
    _console.print(table)


def register(root: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("show")(show_cmd)
    app.command("count")(count_cmd)
    root.add_typer(app, name="dead-letters")
