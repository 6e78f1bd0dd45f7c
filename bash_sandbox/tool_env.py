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
  Bounded: a domain unused for `CACHE_MAX_AGE_S` (30 days) is removed, and beyond
  `CACHE_MAX_DOMAINS` (32) the least recently used go first; never one that a live
  executor holds (a shared flock per domain, held for the process's lifetime). The old
  shared home (`~/.cache/bash-sandbox/tools`, one for every project) is removed on first
  use: it may hold code planted by any project.
- Fail fast on the isolated network (no allowlist): no retries and short timeouts, so a
  tool that needs the network tries once and fails within seconds (npm retried for over a
  minute). The tools still *try*, so the supervisor sees the attempt and the result says
  `network_denied` (an offline mode would fail without trying, and without evidence):
  `npm_config_fetch_retries=0`, `npm_config_fetch_timeout=5000`, `PIP_RETRIES=0`,
  `PIP_TIMEOUT=3`, `UV_HTTP_TIMEOUT=3`, `CARGO_NET_RETRY=0`, `CARGO_HTTP_TIMEOUT=3`,
  `YARN_HTTP_RETRY=0`, `GIT_HTTP_LOW_SPEED_TIME=3`. Go and git fail at once without retrying.
- The egress proxy's variables (`egress.environment`) when the policy has an allowlist.
  A request's own `env` wins over all of these.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid

from bash_sandbox.state import remove_tree
from bash_sandbox.trust_domain import domain_fields, domain_key
from policies import NetworkMode, SandboxMode, SandboxPolicy

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


CACHE_MAX_DOMAINS = 32
CACHE_MAX_AGE_S = 30 * 24 * 3600
# A stamp is refreshed at most this often (one utime per spawn would be wasted work).
_STAMP_EVERY_S = 60
_LOCKS = ".locks"
_TRASH = ".trash-"

# Process-wide: the domains this process uses, each held by a shared flock until it exits
# (a sweeper elsewhere removes only what it can lock exclusively), and when each was stamped.
_held: dict[str, int] = {}
_stamped: dict[str, float] = {}
_swept: set[str] = set()
_mutex = threading.Lock()


def _owned_dir(path: str) -> bool:
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (
        os.path.isdir(path)
        and not os.path.islink(path)
        and st.st_uid == os.geteuid()
        and os.access(path, os.W_OK | os.X_OK)
    )


def cache_base() -> str:
    """Where the per-domain cache homes of this user live."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.realpath(os.path.join(base, "bash-sandbox", "caches"))


def tool_cache_home(policy: SandboxPolicy) -> str | None:
    """The sandbox's own cache home for ``policy``'s trust domain (created 0700, held for
    this process's lifetime), or None when the home cannot hold one (read-only, not ours):
    caches then stay in the call's private /tmp."""
    base = cache_base()
    key = domain_key(policy)
    with _mutex:
        if not _owned_dir(base) or not _owned_dir(os.path.join(base, _LOCKS)):
            return None
        if base not in _swept:
            _swept.add(base)
            sweep_caches(base)
        path = os.path.join(base, key)
        try:
            if path not in _held:
                # Held before the directory is made: a sweeper never removes it under us.
                fd = os.open(
                    os.path.join(base, _LOCKS, key),
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                )
                fcntl.flock(fd, fcntl.LOCK_SH)
                _held[path] = fd
            if not _owned_dir(path):
                return None
            _stamp(base, key, policy)
        except OSError:
            return None
        return path


def _stamp(base: str, key: str, policy: SandboxPolicy) -> None:
    """Record that ``key`` was used now (its description file's mtime: the LRU order)."""
    described = os.path.join(base, _LOCKS, key + ".json")
    now = time.time()
    if now - _stamped.get(described, 0.0) < _STAMP_EVERY_S:
        return
    if not os.path.exists(described):
        # Which policy this domain is, for a human looking at ~/.cache/bash-sandbox/caches.
        tmp = f"{described}.{uuid.uuid4().hex}"
        with open(tmp, "w") as fh:
            json.dump(domain_fields(policy), fh, indent=1)
        os.replace(tmp, described)
    os.utime(described)
    _stamped[described] = now


def sweep_caches(
    base: str, *, max_domains: int = CACHE_MAX_DOMAINS, max_age_s: float = CACHE_MAX_AGE_S
) -> list[str]:
    """Remove the domains unused for ``max_age_s``, then the least recently used beyond
    ``max_domains``, skipping any a live process holds; returns the keys removed. Also the
    old shared home and the trash of an interrupted sweep."""
    parent = os.path.dirname(base)
    legacy = os.path.join(parent, "tools")
    if os.path.isdir(legacy) and not os.path.islink(legacy):
        _discard(legacy, base)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        if name.startswith(_TRASH):  # a deletion the process's exit cut short
            threading.Thread(
                target=remove_tree, args=(os.path.join(base, name),), daemon=True
            ).start()
    used: list[tuple[float, str]] = []
    for name in names:
        if name.startswith(".") or not os.path.isdir(os.path.join(base, name)):
            continue
        try:
            mtime = os.stat(os.path.join(base, _LOCKS, name + ".json")).st_mtime
        except OSError:
            mtime = 0.0
        used.append((mtime, name))
    used.sort(reverse=True)  # most recent first
    now = time.time()
    victims = [k for i, (m, k) in enumerate(used) if i >= max_domains or now - m > max_age_s]
    removed = []
    for key in victims:
        if os.path.join(base, key) in _held:
            continue
        lock = os.path.join(base, _LOCKS, key)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live executor uses it
        try:
            _discard(os.path.join(base, key), base)
            with contextlib.suppress(OSError):
                os.unlink(lock + ".json")
            removed.append(key)
        finally:
            os.close(fd)
    return removed


def _discard(path: str, base: str) -> None:
    """Move ``path`` out of reach at once (a rename), then delete it in the background:
    a big cache takes seconds to delete, a spawn should not wait for it."""
    trash = os.path.join(base, f"{_TRASH}{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except OSError:
        return
    threading.Thread(target=remove_tree, args=(trash,), daemon=True).start()


def cache_variables(home: str) -> dict[str, str]:
    """The cache variables pointing into ``home``."""
    env = {name: os.path.join(home, sub) for name, sub in _CACHE_DIRS.items()}
    if not os.path.isdir(os.path.join(os.path.expanduser("~"), ".cargo")):
        env["CARGO_HOME"] = os.path.join(home, "cargo")
    return env


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
    if policy.network is NetworkMode.ISOLATED and not policy.allow_domains:
        extra |= OFFLINE
    extra |= proxy_env or {}
    env |= extra
    env |= request_env or {}
    return env
