"""The CLI's configuration file: finding it, reading its TOML, and validating it.

Where the values come from, strongest first:

1. command-line flags (`--mode`, `--timeout-ms`, ...);
2. the file named by `--config PATH`: its top-level keys, or its `[tool.bash-sandbox]`
   table when the file is a `pyproject.toml`;
3. otherwise `[tool.bash-sandbox]` in the workspace's `pyproject.toml`, when present;
4. the defaults of `SandboxBashConfig`.

Keys are `SandboxBashConfig` field names; `-` is accepted for `_` (`timeout-ms`). The file is
validated on its own, before any flag is applied, so a broken file is reported even when a
flag would have replaced the bad value: a config that was meant to narrow something must
never be half-read. Every problem becomes one `ConfigError` line naming the key as written.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bash_sandbox.config import SandboxBashConfig

PYPROJECT = "pyproject.toml"
TOOL_TABLE = "bash-sandbox"


@dataclass(frozen=True)
class ConfigSource:
    """One file the configuration was read from, and the table inside it."""

    path: str
    table: str | None = None  # None: the file's top level

    def describe(self) -> str:
        return f"{self.path} [{self.table}]" if self.table else self.path


class ConfigError(Exception):
    """The configuration could not be read or is invalid; nothing was run.

    ``detail`` names the key and the problem; the message adds where it came from, so it is
    exactly one line a user can act on.
    """

    code = "CONFIG_INVALID"

    def __init__(self, detail: str, source: ConfigSource | None) -> None:
        self.detail = detail
        self.source = source
        where = f"in {source.describe()}" if source else "from the command line"
        super().__init__(f"{detail} ({where})")


@dataclass(frozen=True)
class LoadedConfig:
    """Raw values of one config table, keys normalised to field names."""

    values: dict[str, Any] = field(default_factory=dict)
    # Field name -> the key as the user wrote it, so errors quote their spelling.
    spelled: dict[str, str] = field(default_factory=dict)
    source: ConfigSource | None = None

    def key_name(self, name: str) -> str:
        return self.spelled.get(name, name)


def find_config_source(explicit: str | None, workspace: str) -> ConfigSource | None:
    """The file to read: ``explicit`` (`--config`), else the workspace's pyproject.toml.

    A workspace pyproject.toml without a `[tool.bash-sandbox]` table still counts: whether
    the table is there is only known once the file is parsed (`load_config` decides).
    """
    if explicit is not None:
        path = os.path.abspath(explicit)
        table = f"tool.{TOOL_TABLE}" if os.path.basename(path) == PYPROJECT else None
        return ConfigSource(path, table)
    candidate = os.path.join(workspace, PYPROJECT)
    if os.path.isfile(candidate):
        return ConfigSource(candidate, f"tool.{TOOL_TABLE}")
    return None


def _read_toml(source: ConfigSource) -> dict[str, Any]:
    try:
        with open(source.path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("file not found", source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", source) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source) from None


def _select_table(document: dict[str, Any], source: ConfigSource) -> dict[str, Any]:
    if source.table is None:
        return document
    tool = document.get("tool", {})
    table = tool.get(TOOL_TABLE, {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{source.table}] must be a table, got {type(table).__name__}", source)
    return table


def load_config(explicit: str | None, workspace: str) -> LoadedConfig:
    """Read and normalise the config table for ``workspace``; raises `ConfigError`.

    Returns an empty `LoadedConfig` (no source) when there is nothing to read: no `--config`
    and no `[tool.bash-sandbox]` in the workspace's pyproject.toml.
    """
    source = find_config_source(explicit, workspace)
    if source is None:
        return LoadedConfig()
    table = _select_table(_read_toml(source), source)
    if not table and explicit is None:
        # A pyproject.toml of a project that does not configure us: not our file.
        return LoadedConfig()
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in values:
            raise ConfigError(f"{key}: given twice (as {spelled[name]!r} and {key!r})", source)
        values[name] = value
        spelled[name] = key
    return LoadedConfig(values, spelled, source)


def describe_validation_error(exc: ValidationError, loaded: LoadedConfig) -> str:
    """A pydantic error as one line: ``key: reason; key[0]: reason``, keys as written."""
    fields = sorted(SandboxBashConfig.model_fields)
    parts: list[str] = []
    for err in exc.errors():
        loc = err["loc"]
        key = loaded.key_name(str(loc[0])) if loc else "config"
        key += "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[0]), fields, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(fields)}"
            parts.append(f"{key}: unknown key ({hint})")
        else:
            parts.append(f"{key}: {err['msg']}")
    return "; ".join(parts)


def build_config(loaded: LoadedConfig, overrides: Mapping[str, Any]) -> SandboxBashConfig:
    """The validated file values with ``overrides`` (command-line flags) applied on top."""
    try:
        from_file = SandboxBashConfig.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, loaded), loaded.source) from None
    if not overrides:
        return from_file
    try:
        return SandboxBashConfig.model_validate(from_file.model_dump() | dict(overrides))
    except ValidationError as exc:
        # Flags are checked by argparse first; this only guards values computed from them.
        raise ConfigError(describe_validation_error(exc, LoadedConfig()), None) from None
