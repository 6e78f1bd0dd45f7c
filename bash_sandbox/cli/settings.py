"""The settings `run` and `mcp` share, declared once: flag, config field, parser, help.

Each `Setting` names the `SandboxBashConfig` field it sets (``("limits", "memory_bytes")``),
so one declaration gives both front ends their argparse option, the value's validation
(the model's own, floors included, reported as a usage error naming the flag) and the
default shown in `--help` (read from the model). `add_shared_flags` adds them to a
subcommand's parser; `shared_config` turns the parsed flags and the config file into the
validated config both subcommands run with.

Values use one grammar (`policies.units`): sizes `512M`/`2G`, durations `30s`/`500ms`
(a bare number is milliseconds).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from bash_sandbox.cli.config_file import LoadedConfig, build_config, load_config
from bash_sandbox.cli.egress_flags import pin_value
from bash_sandbox.cli.exit_codes import EXIT_USAGE, CliError
from bash_sandbox.config import BackendName, SandboxBashConfig
from policies import NetworkMode, SandboxMode
from policies.units import format_size, parse_duration_ms, parse_size

MODES = ", ".join(m.value for m in SandboxMode)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bash-sandbox")
    except PackageNotFoundError:
        return "unknown"


# -- value parsers: text -> value, ValueError with the accepted forms -------------------------


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return number


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0 or number == float("inf"):
        raise ValueError(f"expected a positive number, got {value!r}")
    return number


def _enum_parser(kind: type[SandboxMode] | type[NetworkMode]) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        return kind(value)  # its ValueError already lists nothing; argparse adds the flag

    return parse


def _backend(value: str) -> str:
    names = get_args(BackendName)
    if value not in names:
        raise ValueError(f"invalid choice {value!r} (choose from {', '.join(names)})")
    return value


# -- the declaration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One shared flag. ``field`` is its path in `SandboxBashConfig`; None when the
    subcommand uses the value itself (the workspace, the session log, `run`'s mode)."""

    option: str
    dest: str
    field: tuple[str, ...] | None
    metavar: str
    help: str
    parse: Callable[[str], Any]
    repeat: bool = False  # list flag: its entries are added to the config file's list
    group: str | None = None
    show_default: Callable[[Any], str] = str


LISTS = "policy lists (repeatable, added to the config file's)"
LIMITS = "limits (per command, its whole process tree)"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "--mode",
        "mode",
        None,
        "MODE",
        f"sandbox mode ({MODES}); run: this command's, mcp: every call's default "
        "(default: the config's)",
        _enum_parser(SandboxMode),
    ),
    Setting(
        "--workspace",
        "workspace",
        None,
        "DIR",
        "workspace root and working directory (default: the current directory)",
        str,
    ),
    Setting(
        "--network",
        "network",
        ("network",),
        "NET",
        "isolated (own loopback only) or host",
        _enum_parser(NetworkMode),
    ),
    Setting(
        "--backend",
        "backend",
        ("backend",),
        "NAME",
        f"sandbox backend ({', '.join(get_args(BackendName))})",
        _backend,
    ),
    Setting(
        "--timeout-ms",
        "timeout_ms",
        ("timeout_ms",),
        "TIME",
        "kill a command after this long: milliseconds, or 30s, 10m",
        parse_duration_ms,
        show_default=lambda ms: f"{ms} ms",
    ),
    Setting(
        "--session",
        "session",
        None,
        "FILE",
        "JSON-lines session log whose mode override applies; mcp also records approvals "
        "'for this session' there (refused inside the workspace or a writable root)",
        str,
    ),
    Setting(
        "--writable-root",
        "writable_roots",
        ("writable_roots",),
        "DIR",
        "another existing directory writable under workspace-write (~/ allowed)",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--deny-read",
        "deny_read",
        ("deny_read",),
        "PATH",
        "a path no confined command may read (added to the default credential stores)",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--protected-path",
        "protected_paths",
        ("protected_paths",),
        "NAME",
        "a name kept read-only inside every writable root, e.g. .env",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--unprotected-path",
        "unprotected_paths",
        ("unprotected_paths",),
        "NAME",
        "a default protected name commands may write after all, e.g. .vscode",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--allow-domain",
        "allow_domains",
        ("allow_domains",),
        "D",
        "a destination the isolated network may reach (domain, *.suffix)",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--allow-private-domain",
        "allow_private_domains",
        ("allow_private_domains",),
        "D",
        "an allowed name whose DNS answer may be a private address (10.x, fd00::, ...; "
        "never loopback or cloud metadata)",
        str,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--pin",
        "pins",
        None,  # a table: `shared_config` merges it into the config's `pin`
        "NAME=ADDRESS",
        "answer NAME with ADDRESS for the egress proxy, whatever its range (a mirror on the "
        "LAN or this host); adds to the config's pin table",
        pin_value,
        repeat=True,
        group=LISTS,
    ),
    Setting(
        "--hosts-file",
        "hosts_file",
        ("hosts_file",),
        "PATH",
        "the hosts file whose entries pin answers ('' for none)",
        lambda text: os.path.abspath(text) if text else "",
    ),
    Setting(
        "--memory",
        "memory",
        ("limits", "memory_bytes"),
        "SIZE",
        "memory, e.g. 2G",
        parse_size,
        group=LIMITS,
        show_default=format_size,
    ),
    Setting(
        "--max-processes",
        "max_processes",
        ("limits", "processes"),
        "N",
        "processes",
        positive_int,
        group=LIMITS,
    ),
    Setting(
        "--cpus",
        "cpus",
        ("limits", "cpu_cores"),
        "N",
        "CPU cores, e.g. 1.5",
        positive_number,
        group=LIMITS,
    ),
    Setting(
        "--tmp-size",
        "tmp_size",
        ("limits", "tmp_bytes"),
        "SIZE",
        "private /tmp size",
        parse_size,
        group=LIMITS,
        show_default=format_size,
    ),
    Setting(
        "--shm-size",
        "shm_size",
        ("limits", "shm_bytes"),
        "SIZE",
        "private /dev/shm size",
        parse_size,
        group=LIMITS,
        show_default=format_size,
    ),
    Setting(
        "--max-open-files",
        "max_open_files",
        ("limits", "open_files"),
        "N",
        "open files per process",
        positive_int,
        group=LIMITS,
    ),
)


def _field_default(path: tuple[str, ...]) -> Any:
    model: type[BaseModel] = SandboxBashConfig
    default: Any = None
    for name in path:
        info = model.model_fields[name]
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            model = type(default)
    return default


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for name in reversed(path):
        value = {name: value}
    return value  # type: ignore[no-any-return]


def _validating(setting: Setting) -> Callable[[str], Any]:
    """The argparse type: the grammar's parser, then the model's own check of the field."""

    def convert(text: str) -> Any:
        try:
            value = setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if setting.field is not None and not setting.repeat:
            try:
                SandboxBashConfig.model_validate(_nested(setting.field, value))
            except ValidationError as exc:
                message = exc.errors()[0]["msg"].removeprefix("Value error, ")
                raise argparse.ArgumentTypeError(message) from None
        return value

    convert.__name__ = setting.metavar.lower()  # argparse names it in "invalid <x> value"
    return convert


def _help(setting: Setting) -> str:
    if setting.field is None or setting.repeat:
        return setting.help
    default = _field_default(setting.field)
    shown = "none" if default is None else setting.show_default(default)
    return f"{setting.help} (default: {shown})"


def add_shared_flags(parser: argparse.ArgumentParser) -> None:
    """Add every `Setting` to ``parser`` (a `run` or `mcp` subparser), and the egress
    flags whose values are tables (`egress_flags.py`)."""
    groups: dict[str, Any] = {}
    for setting in SETTINGS:
        target: Any = parser
        if setting.group is not None:
            if setting.group not in groups:
                groups[setting.group] = parser.add_argument_group(setting.group)
            target = groups[setting.group]
        if setting.repeat:
            target.add_argument(
                setting.option,
                action="append",
                default=[],
                type=None if setting.parse is str else _validating(setting),
                metavar=setting.metavar,
                dest=setting.dest,
                help=_help(setting),
            )
        else:
            target.add_argument(
                setting.option,
                type=_validating(setting),
                metavar=setting.metavar,
                dest=setting.dest,
                help=_help(setting),
            )


# argparse dest -> `ResourceLimits` field (kept for callers of the old names).
LIMIT_FLAGS = {s.dest: s.field[1] for s in SETTINGS if s.field and s.field[0] == "limits"}
LIST_FLAGS = tuple(s.dest for s in SETTINGS if s.repeat)


# -- from flags to the validated config --------------------------------------------------------


def workspace_dir(raw: str | None) -> str:
    """The workspace as a canonical existing directory; the current directory by default."""
    try:
        path = os.path.realpath(os.path.expanduser(raw) if raw else os.getcwd())
    except FileNotFoundError:
        raise CliError(
            "the current directory no longer exists; pass --workspace",
            EXIT_USAGE,
            "WORKSPACE_INVALID",
        ) from None
    if not os.path.isdir(path):
        raise CliError(
            f"workspace {raw!r} is not an existing directory", EXIT_USAGE, "WORKSPACE_INVALID"
        )
    if path == "/":
        # Under workspace-write every host file would be writable, and the sandbox keeps its
        # own state outside every writable root: there is no such place.
        raise CliError(
            "the workspace cannot be / (the whole host); pass a project directory with "
            "--workspace DIR",
            EXIT_USAGE,
            "WORKSPACE_INVALID",
        )
    return path


def flag_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The config values the flags set (``limits`` as a partial mapping), and the entries
    the list flags add."""
    overrides: dict[str, Any] = {}
    additions: dict[str, list[str]] = {}
    for setting in SETTINGS:
        value = getattr(args, setting.dest, None)
        if setting.field is None or value is None or value == []:
            continue
        if setting.repeat:
            additions[setting.field[0]] = list(value)
        elif len(setting.field) == 2:
            overrides.setdefault(setting.field[0], {})[setting.field[1]] = value
        else:
            overrides[setting.field[0]] = value
    return overrides, additions


def shared_config(
    args: argparse.Namespace,
    workspace: str,
    extra: dict[str, Any] | None = None,
) -> tuple[SandboxBashConfig, LoadedConfig]:
    """The config file with the shared flags (and ``extra`` overrides) on top."""
    loaded = load_config(args.config, workspace)
    overrides, additions = flag_overrides(args)
    pins: dict[str, list[str]] = {}
    for name, address in getattr(args, "pins", None) or ():
        pins.setdefault(name, []).append(address)
    if pins:
        overrides["pin"] = pins
    overrides.update(extra or {})
    if args.workspace is not None or "workspace_root" not in loaded.values:
        overrides["workspace_root"] = workspace
    config = build_config(loaded, overrides, additions=additions)
    if args.timeout_ms is not None and args.timeout_ms > config.max_timeout_ms:
        # An explicit flag is the user's own decision: lift the cap instead of silently
        # shortening the timeout they asked for.
        overrides["max_timeout_ms"] = args.timeout_ms
        config = build_config(loaded, overrides, additions=additions)
    return config, loaded
