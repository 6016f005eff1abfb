"""Versioned prompt files, with per-team and per-agent overrides.

Every LLM call in memstream renders a prompt from a TOML file that carries an ``id``,
a ``version`` and the ``system``/``user`` templates. The SHA-256 of the file's bytes
goes into the provenance of every event the call produced, so any memory can be traced
to the exact text that asked for it (``sha256sum`` of the file gives the same digest).

Packaged defaults live next to this module (``prompts/<id>.toml``). A deployment may
override them in ``extraction.prompts_dir`` (``MEMSTREAM_EXTRACTION_PROMPTS_DIR``); the most specific file wins:

1. ``<prompts_dir>/teams/<team_id>/agents/<agent_id>/<id>.toml`` (one agent of one team),
2. ``<prompts_dir>/teams/<team_id>/<id>.toml`` (one team),
3. ``<prompts_dir>/<id>.toml`` (the whole deployment),
4. the packaged default.

An override must keep the prompt's ``id``, give a ``version``, and use only the
placeholders the packaged prompt declares in ``variables`` (the code fills exactly
those). A broken override raises :class:`PromptError` instead of silently falling back:
an operator who wrote an override must learn that it is not used.

Templates use :class:`string.Template` syntax (``$name``; ``$$`` for a dollar sign), so
JSON examples with braces need no escaping.

Reading files is the one side effect here and it is confined to :class:`PromptLibrary`
(its ``reader`` is injectable); parsing, validation and rendering are pure.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from memstream.domain.events import Scope

__all__ = ["Prompt", "PromptError", "PromptLibrary", "parse_prompt", "override_paths", "packaged_prompt"]


class PromptError(ValueError):
    """A prompt file that cannot be used, or a render that lacks a value."""


@dataclass(frozen=True)
class Prompt:
    """One parsed prompt file. ``sha256`` is the hex digest of the file's bytes."""

    id: str
    version: str
    system: str
    user: str
    variables: tuple[str, ...]
    sha256: str
    source: str
    description: str = ""

    def render(self, values: Mapping[str, object]) -> tuple[str, str]:
        """``(system, user)`` with every placeholder filled; a missing value raises."""
        text_values = {k: str(v) for k, v in values.items()}
        try:
            return (
                Template(self.system).substitute(text_values),
                Template(self.user).substitute(text_values),
            )
        except KeyError as exc:
            raise PromptError(
                f"prompt {self.id} v{self.version} ({self.source}) needs a value for ${exc.args[0]}"
            ) from None
        except ValueError as exc:
            raise PromptError(f"prompt {self.id} v{self.version} ({self.source}): {exc}") from None

    def ref(self) -> dict[str, str]:
        """The provenance triple."""
        return {"prompt_id": self.id, "prompt_version": self.version, "prompt_sha256": self.sha256}


def parse_prompt(
    data: bytes,
    *,
    source: str,
    expected_id: str | None = None,
    allowed_variables: tuple[str, ...] | None = None,
) -> Prompt:
    """Parse and validate one prompt file's bytes."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise PromptError(f"{source}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise PromptError(f"{source}: invalid TOML: {exc}") from None

    def text_field(name: str, required: bool = True) -> str:
        value = doc.get(name)
        if value is None and not required:
            return ""
        if isinstance(value, int) and not isinstance(value, bool) and name == "version":
            return str(value)
        if not isinstance(value, str) or (required and not value.strip()):
            raise PromptError(f"{source}: '{name}' must be a non-empty string")
        return value

    prompt_id = text_field("id")
    version = text_field("version")
    system = text_field("system")
    user = text_field("user")
    description = text_field("description", required=False)
    if expected_id is not None and prompt_id != expected_id:
        raise PromptError(f"{source}: id is {prompt_id!r}, expected {expected_id!r}")

    declared = doc.get("variables", [])
    if not isinstance(declared, list) or not all(isinstance(v, str) for v in declared):
        raise PromptError(f"{source}: 'variables' must be a list of names")
    variables = tuple(declared)
    allowed = set(allowed_variables if allowed_variables is not None else variables)
    for name, template in (("system", system), ("user", user)):
        tpl = Template(template)
        if not tpl.is_valid():
            raise PromptError(f"{source}: '{name}' has a malformed placeholder (write $$ for '$')")
        unknown = set(tpl.get_identifiers()) - allowed
        if unknown:
            raise PromptError(
                f"{source}: '{name}' uses unknown placeholder(s) "
                f"{', '.join('$' + u for u in sorted(unknown))} (allowed: "
                f"{', '.join('$' + a for a in sorted(allowed)) or 'none'})"
            )
    return Prompt(
        id=prompt_id,
        version=version,
        system=system,
        user=user,
        variables=tuple(sorted(allowed)) if allowed_variables is not None else variables,
        sha256=hashlib.sha256(data).hexdigest(),
        source=source,
        description=description,
    )


def _segment(value: str) -> bool:
    """Whether an id can name one directory entry inside the prompts directory: ids
    may hold ``.`` and ``/``, so ``..``, ``a/b`` or ``../../beta`` could climb out of it
    (another team's prompt, any file)."""
    return value not in ("", ".", "..") and "/" not in value and "\\" not in value and "\x00" not in value


def override_paths(prompts_dir: Path, prompt_id: str, scope: Scope | None) -> list[Path]:
    """Candidate override files, most specific first (see the module docstring). A
    level whose id is not a single path segment (:func:`_segment`) is not consulted,
    so every candidate lies inside ``prompts_dir``."""
    if not _segment(prompt_id):
        return []
    paths: list[Path] = []
    if scope is not None and _segment(scope.team_id):
        team = prompts_dir / "teams" / scope.team_id
        if _segment(scope.agent_id):
            paths.append(team / "agents" / scope.agent_id / f"{prompt_id}.toml")
        paths.append(team / f"{prompt_id}.toml")
    paths.append(prompts_dir / f"{prompt_id}.toml")
    return paths


def _read_package(prompt_id: str) -> bytes:
    try:
        return (resources.files("memstream.domain") / "prompts" / f"{prompt_id}.toml").read_bytes()
    except (FileNotFoundError, OSError):
        raise PromptError(f"no packaged prompt {prompt_id!r}") from None


def packaged_prompt(prompt_id: str) -> Prompt:
    """The default prompt shipped with memstream."""
    return parse_prompt(_read_package(prompt_id), source=f"package:{prompt_id}.toml")


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise PromptError(f"{path}: cannot read: {exc}") from None


class PromptLibrary:
    """Resolves a prompt id for a scope: override files first, then the packaged default.

    Files are read on every :meth:`get` (a few small files per extraction), so an edited
    override takes effect without a restart; parsed results are cached by content.
    """

    def __init__(
        self,
        prompts_dir: Path | None = None,
        *,
        reader: Callable[[Path], bytes | None] = _read_file,
    ) -> None:
        self._dir = prompts_dir
        self._read = reader
        self._defaults: dict[str, Prompt] = {}
        self._parsed: dict[tuple[str, str], Prompt] = {}

    def default(self, prompt_id: str) -> Prompt:
        if prompt_id not in self._defaults:
            self._defaults[prompt_id] = packaged_prompt(prompt_id)
        return self._defaults[prompt_id]

    def get(self, prompt_id: str, scope: Scope | None = None) -> Prompt:
        base = self.default(prompt_id)
        if self._dir is None:
            return base
        for path in override_paths(self._dir, prompt_id, scope):
            data = self._read(path)
            if data is None:
                continue
            digest = hashlib.sha256(data).hexdigest()
            key = (str(path), digest)
            if key not in self._parsed:
                self._parsed[key] = parse_prompt(
                    data,
                    source=str(path),
                    expected_id=prompt_id,
                    allowed_variables=base.variables,
                )
            return self._parsed[key]
        return base
