"""Files the host runs without being asked, protected by default in every writable root.

Editors, direnv, agent tools and shells run what these name when the user opens the
folder, enters it, starts a session or a shell: a command that writes one runs its code
later, outside the sandbox, with the user's full rights. So each is a default protected
name (read-only in every writable root, also while it does not exist yet), with the reason
a denial shows. `unprotected_paths` in the policy (or the executor's config) lifts one.

Shell start-up files are protected where they exist in a root, and also when missing only
in a root that is a home directory (elsewhere a missing `.bashrc` runs nothing); the rest
are protected whether or not they exist. A missing one is held by an empty read-only
*directory* placeholder, whatever its kind: git ignores empty directories, so `git status`
and `git add -A` in the workspace never see them.
"""

from __future__ import annotations

import functools
import os
import pwd
from types import MappingProxyType

AUTORUN_PATHS: MappingProxyType[str, str] = MappingProxyType(
    {
        ".vscode": "VS Code runs its tasks on folder open; its settings and launch "
        "configurations name programs it runs",
        ".idea": "JetBrains IDEs run its run configurations and startup tasks",
        ".devcontainer": "Dev Containers run its initializeCommand on the host",
        ".devcontainer.json": "Dev Containers run its initializeCommand on the host",
        ".envrc": "direnv runs it on entering the directory",
        ".mcp.json": "agent tools start the MCP servers it names",
        ".claude": "Claude Code runs its hooks and loads its commands, agents and MCP servers",
        ".cursor": "Cursor starts the MCP servers it names and follows its rules",
        ".gemini": "Gemini CLI runs its hooks and starts the MCP servers its settings name",
        "opencode.json": "opencode starts the MCP servers it names",
        "opencode.jsonc": "opencode starts the MCP servers it names",
        ".opencode": "opencode loads its plugins at start and starts the MCP servers its "
        "config names",
        "crush.json": "Crush starts the MCP and language servers it names",
        ".crush.json": "Crush starts the MCP and language servers it names",
        ".qwen": "Qwen Code runs its hooks and starts the MCP servers its settings name",
        ".kilocode": "Kilo Code starts the MCP servers its mcp.json names",
        ".clinerules": "Cline runs its hooks",
        ".helix": "Helix starts the language servers its languages.toml names",
        ".Rprofile": "R runs it at start in this directory",
        ".continue": "Continue starts the MCP servers its workspace blocks name",
        ".roo": "Roo Code starts the MCP servers its mcp.json names",
        ".amazonq": "Amazon Q starts the MCP servers its workspace configuration names",
        ".kiro": "Kiro runs its agent hooks on file events",
        ".zed": "Zed starts the language servers its settings name when a file opens",
        ".aider.conf.yml": "aider runs the lint and test commands it names after its edits",
        ".codex": "Codex starts the MCP servers its config.toml names in a trusted project",
        ".windsurf": "Windsurf runs the hooks its hooks.json names",
        ".qoder": "Qoder runs its SessionStart and other hooks",
    }
)

SHELL_RC_PATHS: MappingProxyType[str, str] = MappingProxyType(
    {
        ".bashrc": "bash runs it in every interactive shell",
        ".bash_profile": "bash runs it in every login shell",
        ".bash_login": "bash runs it in every login shell",
        ".bash_logout": "bash runs it when a login shell exits",
        ".profile": "login shells run it",
        ".zshrc": "zsh runs it in every interactive shell",
        ".zshenv": "zsh runs it in every shell",
        ".zprofile": "zsh runs it in every login shell",
        ".zlogin": "zsh runs it in every login shell",
        ".zlogout": "zsh runs it when a login shell exits",
        ".config/fish": "fish runs its config.fish and conf.d in every shell",
    }
)

DEFAULT_AUTORUN_PATHS: tuple[str, ...] = (*AUTORUN_PATHS, *SHELL_RC_PATHS)

UNPROTECT_KEY = "unprotected_paths"


def autorun_reason(name: str) -> str | None:
    """Why ``name`` (a protected name) is protected by default, if it is an auto-run name."""
    return AUTORUN_PATHS.get(name) or SHELL_RC_PATHS.get(name)


@functools.cache
def _homes(home: str) -> frozenset[str]:
    """``home`` (this process's HOME, the cache key: a warm daemon's call has its client's)
    and every account's home directory."""
    homes = {os.path.realpath(home)}
    for entry in pwd.getpwall():
        if entry.pw_dir not in ("", "/"):
            homes.add(os.path.realpath(entry.pw_dir))
    return frozenset(homes)


def needs_placeholder(name: str, root: str, *, real_root: str | None = None) -> bool:
    """Whether a missing protected ``name`` in ``root`` must be held by a placeholder:
    a shell start-up file only in a home directory (see the module docstring).
    ``real_root``: ``root`` resolved, where the caller has it (once a spawn, not per name)."""
    if name not in SHELL_RC_PATHS:
        return True
    return (real_root or os.path.realpath(root)) in _homes(os.path.expanduser("~"))


def directory_placeholder(name: str) -> bool:
    """Whether a missing ``name`` is held by a directory even when it names a file."""
    return autorun_reason(name) is not None


def protected_label(name: str) -> str:
    """The reason a refused write to protected ``name`` reports: an auto-run name says what
    runs it and which key lifts it."""
    why = autorun_reason(name)
    if why is None:
        return f"protected name {name}"
    return f"protected name {name}: {why}; {UNPROTECT_KEY} lifts it"
