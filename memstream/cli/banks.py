"""CLI commands: ``memstream keys`` (API keys bound to memory banks; only hashes are
stored) and ``memstream banks`` (the named memory spaces keys and MCP servers bind to)."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from memstream.banks import (
    Bank,
    BankConfigError,
    BankRegistry,
    UnknownBankError,
    add_bank,
    banks_path,
    create_key,
    keys_path,
    load_registry,
    revoke_key,
)
from memstream.cli._errors import CLIError
from memstream.settings import Settings, get_settings

__all__ = ["register", "keys_app", "banks_app", "registry_or_fail"]

console = Console(stderr=True, highlight=False, soft_wrap=True)


def registry_or_fail(settings: Settings) -> BankRegistry:
    try:
        return load_registry(settings)
    except BankConfigError as exc:
        raise CLIError(str(exc)) from None


keys_app = typer.Typer(help="API keys bound to memory banks (only hashes are stored).", no_args_is_help=True)

@keys_app.command("create")
def keys_create(
    bank: Annotated[str, typer.Option("--bank", help="The bank the key is bound to.")],
    label: Annotated[str, typer.Option(help="A note to tell keys apart.")] = "",
) -> None:
    """Create a key for a bank and print it once (store it now: it cannot be shown again)."""
    settings = get_settings()
    try:
        raw, record = create_key(settings, bank, label=label)
    except (BankConfigError, UnknownBankError) as exc:
        raise CLIError(str(exc)) from None
    console.print(f"key {record.key_id} for bank {bank!r} stored (hash only) in {keys_path(settings)}")
    print(raw)

@keys_app.command("list")
def keys_list() -> None:
    """List keys (their ids and banks; never the keys)."""
    registry = registry_or_fail(get_settings())
    table = Table("key id", "bank", "label", "created")
    for record in sorted(registry.keys.values(), key=lambda r: (r.bank, r.key_id)):
        table.add_row(record.key_id, record.bank, record.label, str(record.created_at or ""))
    Console().print(table)

@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key id shown by `keys list`.")]) -> None:
    """Remove a key from the keys file (a running server stops accepting it)."""
    try:
        record = revoke_key(get_settings(), key_id)
    except BankConfigError as exc:
        raise CLIError(str(exc)) from None
    console.print(f"revoked key {record.key_id} (bank {record.bank!r})")

banks_app = typer.Typer(help="Memory banks: named memory spaces that keys and MCP servers bind to.", no_args_is_help=True)

@banks_app.command("list")
def banks_list() -> None:
    """List the declared memory banks."""
    settings = get_settings()
    registry = registry_or_fail(settings)
    if not registry.banks:
        raise CLIError(f"no banks declared in {banks_path(settings)}")
    table = Table("bank", "team", "user", "agent", "keys", "description")
    for bank in sorted(registry.banks.values(), key=lambda b: b.name):
        n = sum(1 for r in registry.keys.values() if r.bank == bank.name)
        table.add_row(bank.name, bank.team_id, bank.user_id or "*", bank.agent_id or "*", str(n), bank.description)
    Console().print(table)

@banks_app.command("add")
def banks_add(
    name: Annotated[str, typer.Argument(help="The bank's name.")],
    team: Annotated[str, typer.Option("--team", help="Team id (tenant).")],
    description: Annotated[str, typer.Option("--description", help="What belongs in this bank (the model reads it).")],
    user: Annotated[str | None, typer.Option("--user", help="Pin one user (else the whole team).")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Pin one agent.")] = None,
    template: Annotated[str | None, typer.Option("--template", help="MCP memory template, e.g. '{content} (noted {now:%Y-%m-%d})'.")] = None,
) -> None:
    """Declare a bank in the banks file (then: `memstream keys create --bank NAME`)."""
    settings = get_settings()
    try:
        bank = Bank(name=name, team_id=team, user_id=user, agent_id=agent, description=description, memory_template=template)
    except ValidationError as exc:
        raise CLIError(f"invalid bank: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
    try:
        path = add_bank(settings, bank)
    except BankConfigError as exc:
        raise CLIError(str(exc)) from None
    console.print(f"bank {name!r} ({bank.access.describe()}) added to {path}")


def register(app: typer.Typer) -> None:
    """Add ``keys`` and ``banks`` to the main app."""
    app.add_typer(keys_app, name="keys")
    app.add_typer(banks_app, name="banks")
