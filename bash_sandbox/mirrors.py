"""The user's package mirrors, passed to confined commands without their credentials.

A user whose pip, uv, npm, yarn, Go or cargo is pointed at a company mirror (devpi,
verdaccio, Artifactory, a split-horizon registry) expects the sandboxed tool to use it too.
The environment allowlist (`environment.py`) does not inherit these settings, and the files
holding them (`~/.config/pip/pip.conf`, `~/.npmrc`) are in `deny_read` because they also
hold tokens. So the executor passes the *index settings only*, as environment variables:

- from the environment: ``PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST UV_INDEX_URL
  UV_EXTRA_INDEX_URL UV_DEFAULT_INDEX UV_INDEX npm_config_registry (any case)
  YARN_NPM_REGISTRY_SERVER GOPROXY CARGO_REGISTRIES_<NAME>_INDEX``;
- from pip's user config (``$PIP_CONFIG_FILE``, ``~/.config/pip/pip.conf``,
  ``~/.pip/pip.conf``): ``index-url``, ``extra-index-url``, ``trusted-host`` of
  ``[global]`` (``[install]`` wins), as ``PIP_INDEX_URL`` ... when the environment does not
  set them;
- from ``~/.npmrc`` (or ``$NPM_CONFIG_USERCONFIG``): ``registry`` and ``@scope:registry``
  lines, as ``npm_config_registry`` and ``npm_config_@scope:registry``.

Credentials never pass: userinfo (``https://user:token@host``) is cut from every URL, and
each setting that lost one is named in a warning; a setting whose URL seems to carry a token
elsewhere (a long mixed letters-and-digits path segment, a ``?token=`` query) is dropped,
also with a warning (the command then reaches the mirror
without authenticating). Every other line of those files (``_authToken``, ``_auth``,
``password``, ``client-cert``, ...) is never read into the sandbox. The mirrors' hosts are
read back from the command's environment (`mirror_hosts`), so a command refused the
network is told which host to ask for (`mirror_hint`).
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bash_sandbox.safe_read import read_regular
from policies import stamps

# Variables whose value is a URL (or a space/comma-separated list of URLs) of an index.
_URL_NAMES = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "YARN_NPM_REGISTRY_SERVER",
    "GOPROXY",
)
_HOST_NAMES = ("PIP_TRUSTED_HOST",)  # host names, no URL: passed as they are
_CARGO_INDEX = re.compile(r"CARGO_REGISTRIES_[A-Z0-9_]+_INDEX")
_NPM_REGISTRY = re.compile(r"npm_config_(@[a-z0-9._~-]+:)?registry", re.IGNORECASE)
# scheme "://" userinfo "@": what is cut.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,|]+")
_MAX_FILE_BYTES = 64 * 1024
_PIP_KEYS = {
    "index-url": "PIP_INDEX_URL",
    "extra-index-url": "PIP_EXTRA_INDEX_URL",
    "trusted-host": "PIP_TRUSTED_HOST",
}


@dataclass
class MirrorSettings:
    """What a confined command is given: the variables, and the warnings saying what was
    left behind."""

    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The executor's variables judged here: what `env` does not pass of them is not passed
    # at all, whatever the inherited allowlist says (GOPROXY is on both: refused here for a
    # token in its path, the allowlist passed it as it was: a red team's).
    judged: frozenset[str] = frozenset()


# userinfo "@" of a URL written without its scheme, at the start of the value or of one of
# its elements (`GOPROXY=user:token@proxy.corp,direct`: Go adds `https://` and sends it).
_BARE_USERINFO = re.compile(r"(?P<lead>^|[,|\s])(?![^\s,|@]*://)[^\s,|@]*@")


def strip_userinfo(value: str) -> tuple[str, bool]:
    """``value`` with the userinfo of every URL in it cut; True when something was cut."""
    stripped, count = _USERINFO.subn(r"\g<scheme>", value)
    stripped, bare = _BARE_USERINFO.subn(r"\g<lead>", stripped)
    return stripped, count + bare > 0


# A path segment that looks like a token (Gemfury's https://pypi.fury.io/TOKEN/user/): long,
# letters and digits mixed. A false alarm only costs the user a warning and the public index.
_TOKEN_SEGMENT = re.compile(r"(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{24,}")
_SECRET_QUERY = re.compile(r"(token|key|secret|auth|pass|sig)", re.IGNORECASE)


def secret_in_url(value: str) -> bool:
    """A URL in ``value`` carries what looks like a secret outside its userinfo: a token-like
    path segment, or a query parameter named like one."""
    for url in _URL.findall(value):
        try:
            parts = urlsplit(url)
        except ValueError:
            return True
        if any(_TOKEN_SEGMENT.fullmatch(seg) for seg in parts.path.split("/")):
            return True
        if parts.query and _SECRET_QUERY.search(parts.query):
            return True
    return False


def _hosts_of(value: str) -> list[str]:
    hosts = []
    for url in _URL.findall(value):
        try:
            host = urlsplit(url).hostname
        except ValueError:
            continue
        if host:
            hosts.append(host)
    return hosts


def _read_small(path: str) -> str | None:
    try:
        # A user config can be a link into a workspace, where a command made it a FIFO.
        data = read_regular(path, _MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_FILE_BYTES:
        return None
    return data.decode("utf-8", "replace")


def _pip_files(environ: Mapping[str, str], home: str) -> list[str]:
    """pip's user config files, weakest first (pip's own order)."""
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg, "pip", "pip.conf")]
    explicit = environ.get("PIP_CONFIG_FILE")
    if explicit and explicit != os.devnull:
        files.append(explicit)
    return files


def _pip_index_lines(environ: Mapping[str, str], home: str) -> dict[tuple[str, str], str]:
    """``(variable, file) -> value`` of the index lines of pip's user config files."""
    found: dict[str, tuple[str, str]] = {}
    for path in _pip_files(environ, home):
        text = _read_small(path)
        if text is None:
            continue
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        try:
            parser.read_string(text, source=path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if not parser.has_section(section):
                continue
            for key, variable in _PIP_KEYS.items():
                value = parser.get(section, key, fallback=None)
                if value is None:
                    value = parser.get(section, key.replace("-", "_"), fallback=None)
                if value is not None:
                    found[variable] = (" ".join(value.split()), path)
    return {(variable, path): value for variable, (value, path) in found.items()}


_NPM_SECRET_KEYS = re.compile(
    r"(^|:)(_authtoken|_auth|_password|password|username|certfile|keyfile|email)$", re.IGNORECASE
)


def _npmrc_path(environ: Mapping[str, str], home: str) -> str:
    return next(
        (environ[k] for k in ("NPM_CONFIG_USERCONFIG", "npm_config_userconfig") if environ.get(k)),
        os.path.join(home, ".npmrc"),
    )


def _npmrc_registry_lines(
    environ: Mapping[str, str], home: str, warnings: list[str]
) -> dict[tuple[str, str], str]:
    """``(variable, file) -> value`` of the registry lines of the user's `.npmrc`; each
    credential line left behind is named in ``warnings`` (its key, never its value)."""
    path = _npmrc_path(environ, home)
    text = _read_small(path)
    if text is None:
        return {}
    found: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key.startswith(("#", ";")):
            continue
        if _NPM_SECRET_KEYS.search(key):
            warnings.append(f"{path}: {key} not passed to the sandbox (a credential)")
            continue
        match = re.fullmatch(r"(@[a-z0-9._~-]+:)?registry", key, re.IGNORECASE)
        if match is None or "${" in value:  # ${VAR}: npm would expand a host variable
            continue
        found[(f"npm_config_{key}", path)] = value
    return found


def mirror_settings(environ: Mapping[str, str], home: str | None = None) -> MirrorSettings:
    """The index settings of ``environ`` and the user's pip/npm config, without credentials
    (see the module docstring). ``home``: the user's home (default: ``~``)."""
    home = home if home is not None else os.path.expanduser("~")
    out = MirrorSettings()
    candidates: dict[tuple[str, str], str] = {}
    for (variable, path), value in _pip_index_lines(environ, home).items():
        candidates[(variable, path)] = value
    for (variable, path), value in _npmrc_registry_lines(environ, home, out.warnings).items():
        candidates[(variable, path)] = value
    for name, value in environ.items():
        if (
            name in _URL_NAMES
            or name in _HOST_NAMES
            or _CARGO_INDEX.fullmatch(name)
            or _NPM_REGISTRY.fullmatch(name)
        ):
            candidates[(name, "the environment")] = value
    for (variable, where), value in candidates.items():
        if where != "the environment" and any(
            n.lower() == variable.lower() and w == "the environment" for n, w in candidates
        ):
            continue  # the environment wins over a file, as in the tools themselves
        clean, cut = strip_userinfo(value)
        if secret_in_url(clean):
            out.warnings.append(
                f"{variable} (from {where}) not passed to the sandbox: its URL seems to carry "
                "a token in its path or query"
            )
            continue
        if cut:
            out.warnings.append(
                f"{variable} (from {where}) passed to the sandbox without its credentials "
                "(user:password@ cut from the URL); the command reaches that index "
                "unauthenticated"
            )
        out.env[variable] = clean
    out.judged = frozenset(n for n, where in candidates if where == "the environment")
    return out


def mirror_hosts(env: Mapping[str, str]) -> list[str]:
    """The hosts of the index settings in a command's environment ``env``."""
    hosts: list[str] = []
    for name, value in env.items():
        if name in _URL_NAMES or _CARGO_INDEX.fullmatch(name) or _NPM_REGISTRY.fullmatch(name):
            hosts += [h for h in _hosts_of(value) if h not in hosts]
    return hosts


def mirror_hint(hosts: list[str]) -> str:
    """The warning for a command refused the network while mirrors are configured."""
    return (
        f"package mirror configured at {', '.join(hosts)}: that is what to ask for "
        f"(allow_domains = {hosts!r}), not the public registry"
    )


SETTLE_NS = stamps.SETTLE_NS  # here, so the tests can shorten it


class Mirrors:
    """An executor's view of the user's mirrors: each spawn gets the settings, and each
    warning once per executor (not on every command's result), again only when it changes.

    The answer is kept with the environment it came from and a stamp of each config file
    (`policies/stamps.py`), and reused while both are the same and settled: parsing pip's
    and npm's files cost 0.1-0.2 ms a spawn."""

    def __init__(self, home: str | None = None) -> None:
        self._home = home
        self._warned: set[str] = set()
        self._kept: tuple[object, MirrorSettings] | None = None
        self.hits = 0  # answers reused (the tests read it)

    def settings(self, environ: Mapping[str, str]) -> MirrorSettings:
        home = self._home if self._home is not None else os.path.expanduser("~")
        files = (*_pip_files(environ, home), _npmrc_path(environ, home))
        # Stamped before reading: a change in between moves the stamp, so the next spawn
        # reads again rather than trusting what this one read.
        seen = tuple(stamps.stamp(path) for path in files)
        key = (home, tuple(sorted(environ.items())), seen)  # the files follow from both
        kept = self._kept
        if kept is not None and kept[0] == key:
            self.hits += 1
            out = kept[1]
        else:
            out = mirror_settings(environ, home)
            self._kept = (key, out) if stamps.settled(seen, SETTLE_NS) else None
        fresh = [w for w in out.warnings if w not in self._warned]
        self._warned.update(fresh)
        return MirrorSettings(dict(out.env), fresh, out.judged)
