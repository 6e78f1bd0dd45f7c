"""The CLI's configuration file: which one is trusted, reading its TOML, and validating it.

Where the values come from, strongest first:

1. command-line flags (`--mode`, `--timeout-ms`, `--writable-root`, ...); list flags add to
   the file's lists, limit flags replace single limits;
2. the file named by `--config PATH` (its top-level keys, or its `[tool.bash-sandbox]`
   table when the file is a `pyproject.toml`), else the user config
   `$XDG_CONFIG_HOME/bash-sandbox/config.toml` (default `~/.config/bash-sandbox/config.toml`);
3. the defaults of `SandboxBashConfig`.

The workspace's own `pyproject.toml` is never read for configuration: a workspace-write
command (or a hostile repository) could write `[tool.bash-sandbox]` there and widen the next
run (threat-model row 15). For the same reason a config file is refused
(`ConfigUntrustedError`) when its real path lies inside the workspace or a writable root,
when it is not a regular file, not owned by us or root, writable by group or others, has
other hard links, or sits in a directory others can write.

Keys are `SandboxBashConfig` field names; `-` is accepted for `_` (`timeout-ms`). The file is
validated on its own, before any flag is applied, so a broken file is reported even when a
flag would have replaced the bad value: a config that was meant to narrow something must
never be half-read. Every problem becomes one `ConfigError` line naming the key as written.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.safe_read import read_regular
from policies import default_deny_read
from policies.paths import within
from policies.units import parse_duration_ms, parse_size

PYPROJECT = "pyproject.toml"
TOOL_TABLE = "bash-sandbox"
# A config larger than this is not a config; reading it whole would only cost memory.
MAX_CONFIG_BYTES = 1024 * 1024
# List fields whose entries are host paths and may be written `~/...`.
HOME_RELATIVE_LISTS = ("writable_roots", "deny_read")


def user_config_path() -> str:
    """`$XDG_CONFIG_HOME/bash-sandbox/config.toml`, `~/.config/...` when unset or relative."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, TOOL_TABLE, "config.toml")


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


class ConfigUntrustedError(ConfigError):
    """A config file that a confined command or another user could have written; not read."""

    code = "CONFIG_UNTRUSTED"

    def __init__(self, detail: str, source: ConfigSource) -> None:
        self.detail = detail
        self.source = source
        Exception.__init__(self, f"{source.path}: {detail}")


@dataclass(frozen=True)
class LoadedConfig:
    """Raw values of one config table, keys normalised to field names."""

    values: dict[str, Any] = field(default_factory=dict)
    # Field name -> the key as the user wrote it, so errors quote their spelling.
    spelled: dict[str, str] = field(default_factory=dict)
    source: ConfigSource | None = None
    # The file's real path (symlinks resolved): what the writable-root check compares.
    real_path: str | None = None

    def key_name(self, name: str) -> str:
        return self.spelled.get(name, name)


def find_config_source(explicit: str | None, workspace: str) -> ConfigSource | None:
    """The file to read: ``explicit`` (`--config`), else the user config when it exists.

    ``workspace`` is not searched: its files are the commands' to write.
    """
    del workspace  # kept for the signature; never a place to look for configuration
    if explicit is not None:
        path = os.path.abspath(os.path.expanduser(explicit))
        table = f"tool.{TOOL_TABLE}" if os.path.basename(path) == PYPROJECT else None
        return ConfigSource(path, table)
    candidate = user_config_path()
    # lexists: a dangling symlink or a planted FIFO is refused loudly, not skipped.
    return ConfigSource(candidate) if os.path.lexists(candidate) else None


def _refuse_unsafe_file(source: ConfigSource, st: os.stat_result, real: str) -> None:
    """Raise `ConfigUntrustedError` unless only we (or root) can have written the file."""
    euid = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        raise ConfigUntrustedError("not a regular file; point --config at a regular file", source)
    if st.st_uid not in (euid, 0):
        raise ConfigUntrustedError(
            f"owned by uid {st.st_uid}, not by you (uid {euid}) or root; use a copy you own",
            source,
        )
    if st.st_mode & 0o022:
        raise ConfigUntrustedError(
            f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run `chmod go-w {real}`",
            source,
        )
    if st.st_nlink > 1:
        raise ConfigUntrustedError(
            f"has {st.st_nlink} hard links, so it can be changed under another name; "
            "use a copy of its own",
            source,
        )
    parent = os.path.dirname(real)
    if os.stat(parent).st_mode & 0o002:
        raise ConfigUntrustedError(
            f"its directory {parent} is writable by others; "
            "move the file to a directory only you can write",
            source,
        )


def _refuse_inside_roots(source: ConfigSource, real: str, roots: Sequence[str]) -> None:
    user_config = os.path.realpath(user_config_path())
    for root in roots:
        canonical = os.path.realpath(root)
        if within(real, canonical):
            example = f" (e.g. {user_config})" if not within(user_config, canonical) else ""
            raise ConfigUntrustedError(
                f"lies inside {canonical}, which confined commands can write; keep the config "
                f"outside every writable root{example}",
                source,
            )


def _read_trusted(source: ConfigSource, workspace: str) -> tuple[dict[str, Any], str]:
    """Parse ``source`` after the trust checks; returns the document and the real path."""
    real = os.path.realpath(source.path)
    _refuse_inside_roots(source, real, [workspace])
    try:
        # O_NOFOLLOW: the real path has no symlink left, one appearing now is a race.
        # O_NONBLOCK: a FIFO planted as the config must not hang us before fstat refuses it.
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("file not found", source) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            detail = "was replaced by a symlink while being read"
            raise ConfigUntrustedError(detail, source) from None
        raise ConfigError(f"cannot read the file: {exc.strerror}", source) from None
    with os.fdopen(fd, "rb") as fh:
        # Checked on the open file: what we read is what we checked.
        _refuse_unsafe_file(source, os.fstat(fh.fileno()), real)
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {MAX_CONFIG_BYTES} bytes; not a config file", source)
    import tomllib  # only when there is a file to parse (most runs have none)

    try:
        return tomllib.loads(data.decode()), real
    except UnicodeDecodeError:
        raise ConfigError("not valid TOML: the file is not UTF-8", source) from None
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
    """Read and normalise the config for a run in ``workspace``; raises `ConfigError`.

    Returns an empty `LoadedConfig` (no source) when there is nothing to read: no `--config`
    and no user config. Raises `ConfigUntrustedError` for a file that fails a trust check
    (module docstring); `build_config` repeats the root check against the final roots.
    """
    source = find_config_source(explicit, workspace)
    if source is None:
        return LoadedConfig()
    document, real = _read_trusted(source, workspace)
    table = _select_table(document, source)
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in values:
            raise ConfigError(f"{key}: given twice (as {spelled[name]!r} and {key!r})", source)
        values[name] = value
        spelled[name] = key
    return LoadedConfig(apply_units(values, source), spelled, source, real)


def workspace_table_notice(workspace: str) -> str | None:
    """One line saying the workspace's `[tool.bash-sandbox]` is ignored, when it has one."""
    path = os.path.join(workspace, PYPROJECT)
    try:
        # Never opened unless a regular file: a command's link to a device would be opened.
        data = read_regular(path, MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    import tomllib

    try:
        tool = tomllib.loads(data.decode()).get("tool")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # not ours to judge: the run does not depend on this file
    if not isinstance(tool, dict) or TOOL_TABLE not in tool:
        return None
    return (
        f"notice: ignoring [tool.{TOOL_TABLE}] in {path}: confined commands can write the "
        f"workspace, so its settings are never trusted; put them in {user_config_path()} "
        "or pass --config"
    )


def _nested_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model a field of ``model`` holds (`limits` -> `ResourceLimits`), if any."""
    info = model.model_fields.get(name)
    annotation = info.annotation if info is not None else None
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key a config file may set, nested ones dotted: ``limits.memory_bytes``."""
    keys: list[str] = []
    for name in sorted(model.model_fields):
        inner = _nested_model(model, name)
        keys += _leaf_keys(inner, f"{prefix}{name}.") if inner else [f"{prefix}{name}"]
    return keys


def suggest_key(loc: Sequence[str | int]) -> str:
    """The hint for an unknown key at ``loc``: the nearest real key, compared leaf to leaf,
    so `limits.memory` suggests `limits.memory_bytes` and a top-level `memory_bytes` its
    place in `[limits]`."""
    import difflib  # error path only

    model: type[BaseModel] | None = SandboxBashConfig
    for part in loc[:-1]:
        model = _nested_model(model, str(part)) if model else None
    prefix = "".join(f"{p}." for p in loc[:-1])
    siblings = [f"{prefix}{k}" for k in _leaf_keys(model)] if model else []
    # Near the top level, any leaf of the whole config may be what was meant.
    candidates = siblings + [k for k in _leaf_keys(SandboxBashConfig) if k not in siblings]
    leaves: dict[str, str] = {}
    for key in candidates:
        leaves.setdefault(key.rsplit(".", 1)[-1], key)
    wanted = str(loc[-1]).replace("-", "_")
    close = difflib.get_close_matches(wanted, list(leaves), n=1)
    if close:
        return f"did you mean {leaves[close[0]]}?"
    known = sorted(model.model_fields) if model else []
    return f"known keys: {', '.join(known)}"


def describe_validation_error(exc: ValidationError, loaded: LoadedConfig) -> str:
    """A pydantic error as one line: ``key: reason; key[0]: reason``, keys as written."""
    parts: list[str] = []
    for err in exc.errors():
        loc = err["loc"]
        key = loaded.key_name(str(loc[0])) if loc else "config"
        key += "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        if err["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key ({suggest_key(loc)})")
        else:
            parts.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def apply_units(
    values: Mapping[str, Any], source: ConfigSource | None, where: str = ""
) -> dict[str, Any]:
    """Text values of ``*_bytes`` and ``*_ms`` keys read in the units grammar
    (`policies.units`): ``memory_bytes = "2G"``, ``timeout_ms = "30s"``; nested tables too."""
    out = dict(values)
    for key, value in values.items():
        name = f"{where}{key}"
        if isinstance(value, Mapping):
            out[key] = apply_units(value, source, f"{name}.")
        elif isinstance(value, str) and key.endswith(("_bytes", "-bytes", "_ms", "-ms")):
            parse = parse_size if key.endswith("bytes") else parse_duration_ms
            try:
                out[key] = parse(value)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}", source) from None
    return out


def _expand_home(values: dict[str, Any]) -> dict[str, Any]:
    """``~/x`` entries of the path lists made absolute; anything else is left to validation."""
    out = dict(values)
    for name in HOME_RELATIVE_LISTS:
        entries = out.get(name)
        if isinstance(entries, list | tuple):
            out[name] = [os.path.expanduser(e) if isinstance(e, str) else e for e in entries]
    return out


def config_roots(config: SandboxBashConfig) -> list[str]:
    """Every host directory a confined command of ``config`` may write, whatever the mode
    (a session or a flag can still choose workspace-write)."""
    workspace = [config.workspace_root] if config.workspace_root else []
    return [*workspace, *config.writable_roots]


def _check_writable_roots(
    roots: Sequence[str], key: str, source: ConfigSource | None, first: int = 0
) -> None:
    """A writable root must be an existing directory: binding a missing one fails later,
    where it would look like a broken sandbox instead of a typo."""
    for index, root in enumerate(roots[first:], start=first):
        where = f"{key}[{index}]" if source is not None else key
        if not os.path.isabs(root):
            raise ConfigError(f"{where}: must be an absolute path or ~/..., got {root!r}", source)
        if not os.path.isdir(root):
            raise ConfigError(f"{where}: {root!r} is not an existing directory", source)


def build_config(
    loaded: LoadedConfig,
    overrides: Mapping[str, Any],
    *,
    additions: Mapping[str, Sequence[str]] | None = None,
) -> SandboxBashConfig:
    """The validated file values with ``overrides`` (command-line flags) applied on top.

    An override that is a mapping (``limits``) replaces only the keys it names.
    ``additions`` are entries appended to the file's lists (`--writable-root`,
    `--deny-read`, ...); `deny_read` additions extend the default credential stores when
    the file names none. Raises `ConfigError`, and `ConfigUntrustedError` when the file lies
    inside the resulting workspace or a writable root.
    """
    try:
        from_file = SandboxBashConfig.model_validate(_expand_home(loaded.values))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, loaded), loaded.source) from None
    if loaded.source is not None:
        _check_writable_roots(
            from_file.writable_roots, loaded.key_name("writable_roots"), loaded.source
        )
    config = from_file
    if overrides or additions:
        merged = from_file.model_dump()
        for name, value in overrides.items():
            base = merged.get(name)
            merged[name] = base | dict(value) if isinstance(value, Mapping) and base else value
        for name, extra in (additions or {}).items():
            base = merged.get(name)
            if name == "deny_read" and base is None:
                base = default_deny_read()
            merged[name] = [*(base or ()), *extra]
        try:
            config = SandboxBashConfig.model_validate(_expand_home(merged))
        except ValidationError as exc:
            # Flags are checked by argparse first; this guards values computed from them.
            raise ConfigError(describe_validation_error(exc, LoadedConfig()), None) from None
        # Only the entries the command line added are new here.
        _check_writable_roots(
            config.writable_roots, "writable_roots", None, first=len(from_file.writable_roots)
        )
    if loaded.source is not None and loaded.real_path is not None:
        _refuse_inside_roots(loaded.source, loaded.real_path, config_roots(config))
    return config
