"""What a confined command inherits from the executor's environment: an allowlist.

A name scrub (KEY, TOKEN, ...) lets most credentials through under other names (GH_PASS,
DATABASE_URL, SENTRY_DSN, CI_JOB_JWT, SSHPASS, ...), so confined commands inherit only the
variables below; everything else, whatever its name, stays with the executor. The request's
``env`` and ``dsh_env`` are added on top by the executor, as for every command, and
`danger-full-access` never comes here (it keeps the local executor's environment exactly).

Inherited names:

- identity and shell: ``PATH HOME USER LOGNAME SHELL HOSTNAME``
- locale and time: ``LANG LANGUAGE LC_* TZ``
- terminal and output: ``TERM COLORTERM NO_COLOR FORCE_COLOR CLICOLOR CLICOLOR_FORCE
  COLUMNS LINES``; ``EDITOR VISUAL``
- temp dir: ``TMPDIR`` (the executor points it at the command's private one anyway)
- XDG base dirs: ``XDG_CONFIG_HOME XDG_DATA_HOME XDG_STATE_HOME XDG_CACHE_HOME
  XDG_DATA_DIRS XDG_CONFIG_DIRS``
- toolchain locators: ``VIRTUAL_ENV CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_EXE
  PYENV_ROOT PYENV_VERSION PYTHONPATH PYTHONUTF8 PYTHONIOENCODING PYTHONUNBUFFERED
  PYTHONDONTWRITEBYTECODE PIPX_HOME POETRY_HOME JAVA_HOME GOROOT GOPATH GOBIN GOFLAGS
  GOPROXY GONOSUMDB GOPRIVATE CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN NVM_DIR NVM_BIN
  NODE_PATH PNPM_HOME VOLTA_HOME BUN_INSTALL DENO_INSTALL GEM_HOME GEM_PATH
  SDKMAN_DIR ASDF_DIR ASDF_DATA_DIR DOTNET_ROOT ANDROID_HOME ANDROID_SDK_ROOT
  PKG_CONFIG_PATH CMAKE_PREFIX_PATH MANPATH INFOPATH``
- compilers and linkers: ``CC CXX CPP FC AR CFLAGS CXXFLAGS CPPFLAGS FFLAGS LDFLAGS
  LDLIBS LIBRARY_PATH LD_LIBRARY_PATH CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH MAKEFLAGS``
- CA bundles: ``SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE
  NODE_EXTRA_CA_CERTS PIP_CERT GIT_SSL_CAINFO``
- proxies: ``HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY`` and their lowercase forms
- automation: ``CI DEBIAN_FRONTEND SOURCE_DATE_EPOCH``

The non-obvious decisions:

- ``LD_LIBRARY_PATH`` is inherited: toolchains installed under a prefix need it, it names
  no secret, and a command can set it for itself anyway; the executor does not rely on it.
- Proxies are inherited so that ``network="host"`` works behind a corporate proxy; under
  ``isolated`` the host's proxy is unreachable and the executor's egress proxy, when it
  runs, overrides them. A proxy URL with a password is dropped by the rule below.
- Not inherited, though harmless-looking: ``XDG_RUNTIME_DIR DISPLAY WAYLAND_DISPLAY
  SSH_AUTH_SOCK DBUS_SESSION_BUS_ADDRESS GPG_AGENT_INFO`` (they lead to host sockets: an
  agent that signs, a desktop that types), ``KRB5CCNAME`` (a ticket cache is a credential),
  ``DOCKER_HOST`` (the host's docker is root), ``JAVA_TOOL_OPTIONS MAVEN_OPTS`` (commonly
  carry ``-D...password=``), ``PWD OLDPWD SHLVL`` (bash sets them for the command itself),
  and ``BASH_ENV ENV`` (bash would source them).

An inherited variable is still dropped when its value carries credentials: a URL with
userinfo (``scheme://user:password@host``, or ``scheme://token@host``, the way forges
take tokens), anywhere in the value; in a proxy variable or ``GOPROXY`` also without the
scheme (``user:password@proxy:3128``), which the tools read as a URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

INHERITED_NAMES: frozenset[str] = frozenset(
    {
        # identity and shell
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME",
        # locale and time (LC_* by prefix)
        "LANG", "LANGUAGE", "TZ",
        # terminal and output
        "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE",
        "COLUMNS", "LINES", "EDITOR", "VISUAL",
        "TMPDIR",
        # XDG base directories (not XDG_RUNTIME_DIR: the user's sockets live there)
        "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME",
        "XDG_DATA_DIRS", "XDG_CONFIG_DIRS",
        # toolchain locators
        "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_EXE",
        "PYENV_ROOT", "PYENV_VERSION", "PYTHONPATH", "PYTHONUTF8", "PYTHONIOENCODING",
        "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIPX_HOME", "POETRY_HOME",
        "JAVA_HOME", "GOROOT", "GOPATH", "GOBIN", "GOFLAGS", "GOPROXY", "GONOSUMDB",
        "GOPRIVATE", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "NVM_DIR", "NVM_BIN",
        "NODE_PATH", "PNPM_HOME", "VOLTA_HOME", "BUN_INSTALL", "DENO_INSTALL",
        "GEM_HOME", "GEM_PATH", "SDKMAN_DIR", "ASDF_DIR", "ASDF_DATA_DIR", "DOTNET_ROOT",
        "ANDROID_HOME", "ANDROID_SDK_ROOT", "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH",
        "MANPATH", "INFOPATH",
        # compilers and linkers
        "CC", "CXX", "CPP", "FC", "AR", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "FFLAGS",
        "LDFLAGS", "LDLIBS", "LIBRARY_PATH", "LD_LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH", "MAKEFLAGS",
        # CA bundles
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO",
        # proxies (a URL with a password is dropped below)
        "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
        "http_proxy", "https_proxy", "all_proxy", "no_proxy",
        # automation
        "CI", "DEBIAN_FRONTEND", "SOURCE_DATE_EPOCH",
    }
)  # fmt: skip

_LOCALE_NAME = re.compile(r"LC_[A-Z]+")
# scheme "://" then userinfo ending in "@" before any "/", "?", "#" or blank.
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@")
# Variables whose value is a URL list where the scheme may be left out: curl and Python
# take `user:password@proxy:3128` as `http://...`, Go's GOPROXY adds `https://`, and each
# sends the userinfo (a red team's).
_SCHEMELESS_URLS = frozenset({"http_proxy", "https_proxy", "all_proxy", "goproxy"})
_ELEMENTS = re.compile(r"[,|\s]+")


def is_sandbox_inherited(name: str, value: str) -> bool:
    """Whether the executor's variable ``name=value`` passes into a confined command."""
    if name not in INHERITED_NAMES and not _LOCALE_NAME.fullmatch(name):
        return False
    if name.lower() in _SCHEMELESS_URLS and any(
        "@" in element and "://" not in element for element in _ELEMENTS.split(value)
    ):
        return False
    return _URL_USERINFO.search(value) is None


def sandbox_inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a confined command inherits (see the module docstring)."""
    return {name: value for name, value in environ.items() if is_sandbox_inherited(name, value)}
