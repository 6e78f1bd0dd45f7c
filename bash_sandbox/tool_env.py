"""What confined commands' tools are told: scratch space, caches, and to fail fast offline.

- `TMPDIR=/tmp`: under bwrap and the Landlock backend `/tmp` is the executor's private,
  size-capped tmpfs in every confined mode.
- Caches: in workspace-write, the tools' cache variables point into the sandbox's own cache
  home for this command's *trust domain* (`trust_domain.py`): `~/.cache/bash-sandbox/
  caches/<key>`, where the key is a hash of the writable roots, mode, network, allowlist
  and the rest of the policy's width. Commands of one project with one policy share a warm
  cache; another project (or the same one under a wider policy) never runs what this one
  left there (a corepack "pnpm", a poisoned wheel): its tools look in its own directory,
  and only that one is writable for it. Never the host's own tool state (`~/.npm`,
  `~/.cache/pip`, `~/go`, `~/.gradle`). In read-only, they point into the private /tmp,
  itself per trust domain (thrown away with the executor).
  The list: `npm_config_cache`, `YARN_CACHE_FOLDER`, `PIP_CACHE_DIR`, `UV_CACHE_DIR`,
  `POETRY_CACHE_DIR`, `GOCACHE`, `GOMODCACHE`, `CARGO_HOME` (only when `~/.cargo` does not
  exist: moving it would hide the user's installed tools), `GRADLE_USER_HOME`,
  `XDG_CACHE_HOME`, `PRE_COMMIT_HOME`, `HF_HOME` is not moved (it holds tokens).
  The homes, their locks and their bounds: `cache_domains.py`.
- Fail fast on the isolated network (and under an allowlist, with 30 s timeouts there: a
  refused destination is a 403 pip retried for 12 s): no retries and short timeouts, so a
  tool that needs the network tries once and fails within seconds (npm retried for over a
  minute). The tools still *try*, so the supervisor sees the attempt and the result says
  `network_denied` (an offline mode would fail without trying, and without evidence):
  `npm_config_fetch_retries=0`, `npm_config_fetch_timeout=5000`, `PIP_RETRIES=0`,
  `PIP_TIMEOUT=3`, `UV_HTTP_TIMEOUT=3`, `CARGO_NET_RETRY=0`, `CARGO_HTTP_TIMEOUT=3`,
  `YARN_HTTP_RETRY=0`, `GIT_HTTP_LOW_SPEED_TIME=3`. Go and git fail at once without retrying.
  And `PIP_DISABLE_PIP_VERSION_CHECK=1`, `npm_config_update_notifier=false`: pip's and
  npm's own update checks are refused lookups the result would report after work that went
  fine.
- `GIT_OPTIONAL_LOCKS=0`, so `git status` (and `diff`, `describe`) does not rewrite the index
  to refresh its stat data: in read-only a refused `index.lock` after a status that worked
  (which pointed users at workspace-write); in workspace-write a changed index in the
  overlay, which the import then compared with the host's (eight host git processes after
  every `git status`, 3x a read-only one) to apply nothing. Git's own writes (`add`,
  `commit`, `checkout`) are not optional and refresh it as they always do.
- `TAR_OPTIONS=--no-same-owner` (after any the harness or the request passes, unless they
  name a `same-owner` option themselves): GNU tar run as root
  restores each entry's owner, which no confined command can give (no uid but its own is
  mapped, no capability to chown), so a release tarball of another uid failed to extract
  (`Cannot change ownership`, exit 2) where the same tar outside worked (a usability pass).
- The egress proxy's variables (`egress.environment`) when the policy has an allowlist.
  A request's own `env` wins over all of these.
"""

from __future__ import annotations

import os

from bash_sandbox.cache_domains import CacheHolds, tool_cache_home
from policies import NetworkMode, SandboxMode, SandboxPolicy

__all__ = [
    "OFFLINE",
    "CacheHolds",
    "cache_variables",
    "confined_environment",
    "tool_cache_home",
]

OFFLINE = {
    "npm_config_fetch_retries": "0",
    "npm_config_fetch_timeout": "5000",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "3",
    "UV_HTTP_TIMEOUT": "3",
    "CARGO_NET_RETRY": "0",
    "CARGO_HTTP_TIMEOUT": "3",
    "YARN_HTTP_RETRY": "0",
    "GIT_HTTP_LOW_SPEED_TIME": "3",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "npm_config_update_notifier": "false",
}
# Under an allowlist: no retries still, but timeouts that a slow allowed mirror survives.
ALLOWLIST_TIMEOUTS = {
    "npm_config_fetch_timeout": "30000",
    "PIP_TIMEOUT": "30",
    "UV_HTTP_TIMEOUT": "30",
    "CARGO_HTTP_TIMEOUT": "30",
    "GIT_HTTP_LOW_SPEED_TIME": "30",
}
_CACHE_DIRS = {
    "npm_config_cache": "npm",
    "YARN_CACHE_FOLDER": "yarn",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "POETRY_CACHE_DIR": "poetry",
    "GOCACHE": "go-build",
    "GOMODCACHE": "go-mod",
    "GRADLE_USER_HOME": "gradle",
    "XDG_CACHE_HOME": "xdg",
    "PRE_COMMIT_HOME": "pre-commit",
}


def cache_variables(home: str) -> dict[str, str]:
    """The cache variables pointing into ``home``."""
    env = {name: os.path.join(home, sub) for name, sub in _CACHE_DIRS.items()}
    if not _has_entries(os.path.join(os.path.expanduser("~"), ".cargo")):
        env["CARGO_HOME"] = os.path.join(home, "cargo")
    return env


def _has_entries(path: str) -> bool:
    """A directory with something in it: an empty `~/.cargo` is the placeholder a home
    workspace's survey holds (`policies.autorun.HOME_PATHS`), read-only, no user's tools."""
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def confined_environment(
    built: dict[str, str],
    policy: SandboxPolicy,
    *,
    private_tmp: bool,
    cache_home: str | None = None,
    proxy_env: dict[str, str] | None = None,
    request_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """``built`` (inherited allowlist plus the request's channels) with the tool settings;
    the request's own ``env`` keeps the last word."""
    env = dict(built)
    extra: dict[str, str] = {}
    if private_tmp:
        extra["TMPDIR"] = "/tmp"
    if policy.mode is SandboxMode.WORKSPACE_WRITE and cache_home is not None:
        extra |= cache_variables(cache_home)
    elif private_tmp:
        extra |= cache_variables("/tmp/.cache")
    extra["GIT_OPTIONAL_LOCKS"] = "0"
    if policy.network is NetworkMode.ISOLATED:
        # Under an allowlist too: a refusal is a 403 the tools would retry for seconds
        # (pip: 12 s); the timeouts stay longer there, for slow but allowed mirrors.
        extra |= OFFLINE if not policy.allow_domains else OFFLINE | ALLOWLIST_TIMEOUTS
    extra |= proxy_env or {}
    env |= extra
    env |= request_env or {}
    tar = env.get("TAR_OPTIONS", "")
    if "same-owner" not in tar:  # a harness that asks for owners keeps them
        env["TAR_OPTIONS"] = f"{tar} --no-same-owner".strip()
    return env
