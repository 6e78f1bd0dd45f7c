"""The environment a command sees: the executor's own, scrubbed, plus the two request channels.

Layering, later wins:

1. the executor's environment, minus credential-shaped names (KEY, SECRET, TOKEN, ...),
   every `DSH_*` name, and the start-up hooks `BASH_ENV`/`ENV` (bash would source them);
2. output defaults for non-terminal use (`NO_COLOR=1`, `TERM=dumb`, `PAGER=cat`, `GIT_PAGER=cat`);
3. the request's ``env`` (ordinary names; it may restore a scrubbed one on purpose);
4. the request's ``dsh_env`` (only `DSH_*` names: the harness's own channel).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from bash_seam import DSH_ENV_PREFIX, EnvChannelError

# Case-insensitive parts of a name that mark it as a credential.
CREDENTIAL_NAME_PARTS: tuple[str, ...] = (
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
)
# Files bash (or sh) would source before the command: never inherited.
STARTUP_HOOK_NAMES: frozenset[str] = frozenset({"BASH_ENV", "ENV"})
COMMAND_DEFAULTS: Mapping[str, str] = {
    "NO_COLOR": "1",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
}


@functools.lru_cache(maxsize=4096)
def is_inherited(name: str) -> bool:
    """Whether the executor's variable ``name`` passes into commands (cached: runs per spawn)."""
    if name.startswith(DSH_ENV_PREFIX) or name in STARTUP_HOOK_NAMES:
        return False
    upper = name.upper()
    return not any(part in upper for part in CREDENTIAL_NAME_PARTS)


def check_env_channels(env: Mapping[str, str] | None, dsh_env: Mapping[str, str] | None) -> None:
    """Reject a `DSH_*` name in ``env`` and anything else in ``dsh_env``."""
    for name in env or {}:
        if name.startswith(DSH_ENV_PREFIX):
            raise EnvChannelError(
                f"env may not set {name}: {DSH_ENV_PREFIX}* names travel in dsh_env"
            )
    for name in dsh_env or {}:
        if not name.startswith(DSH_ENV_PREFIX):
            raise EnvChannelError(
                f"dsh_env may only set {DSH_ENV_PREFIX}* names, got {name}: pass it in env"
            )


def build_command_env(
    base: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    dsh_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of one command (see the module docstring for the layers)."""
    check_env_channels(env, dsh_env)
    built = {name: value for name, value in base.items() if is_inherited(name)}
    built.update(COMMAND_DEFAULTS)
    if env:
        built.update(env)
    if dsh_env:
        built.update(dsh_env)
    return built
