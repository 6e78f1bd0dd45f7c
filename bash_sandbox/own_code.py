"""The sandbox's own installation: what the harness itself runs and imports.

A harness started from a project's virtual environment (`.venv/bin/bash-sandbox`, an MCP
client pointed there, an editable install of this repository) keeps its own code inside the
workspace. A confined command that writes a `.pth` file there, or edits a module, runs its
code in the next harness process, unconfined (a red team's). These paths are covered
read-only in every confined view wherever they lie in a writable root (`host_view.py`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys

_PACKAGES = ("bash_sandbox", "bash_local", "bash_seam", "policies", "bash_sandbox_audit")
# What Python imports at every start from any directory on its path (`site`): a sys.path
# entry in a root (an editable install's source tree, which may be the workspace itself) is
# not covered whole, only these names in it, held while missing by empty files (a file at
# the package's name keeps its directory from being made; a directory there made
# setuptools' flat-layout discovery see two more packages: a usability pass).
STARTUP_MODULES = ("sitecustomize.py", "sitecustomize", "usercustomize.py", "usercustomize")

REASON = "the sandbox's own installation, which the harness runs next"


@functools.cache
def own_installation() -> tuple[str, ...]:
    """The real paths the harness's interpreter starts from and imports this package and its
    dependencies from: the environment (`sys.prefix`, where `.pth` files run at start) and
    the one it was made from (`sys.base_prefix`: a project-local Python), the site
    directories, and each of this distribution's package directories (an editable install's
    lie in its source tree)."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    paths += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        paths += list(spec.submodule_search_locations or ()) if spec is not None else []
    found = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}
    # The outermost of nested ones (a venv holds its site-packages): one cover each.
    return tuple(sorted(p for p in found if not any(_below(p, q) for q in found)))


@functools.cache
def import_dirs() -> tuple[str, ...]:
    """The directories a harness process of this installation imports from that are not part
    of it: every `sys.path` entry (its first too: the current directory of a `python -m
    bash_sandbox.cli` started in a workspace, which comes before the package itself) but
    the installation (an editable install's source tree is one of these)."""
    own = own_installation()
    entries = [p or os.getcwd() for p in sys.path]
    dirs = {os.path.realpath(p) for p in entries if os.path.isdir(p)}
    return tuple(sorted(d for d in dirs if not any(d == o or _below(d, o) for o in own)))


def package_names(directory: str) -> tuple[str, ...]:
    """This distribution's package names in ``directory``, as a module or a package: what
    a harness importing from there would take for itself."""
    return tuple(os.path.join(directory, n + s) for n in _PACKAGES for s in ("", ".py"))


@functools.cache
def startup_names() -> tuple[str, ...]:
    """`STARTUP_MODULES` in each directory on the interpreter's path that `site` searches at
    start (`sys.path` but its first entry, the script's directory or the current one, which
    is put there after `site` ran)."""
    dirs = {os.path.realpath(p) for p in sys.path[1:] if p and os.path.isdir(p)}
    return tuple(sorted(os.path.join(d, n) for d in dirs for n in STARTUP_MODULES))


def _below(path: str, other: str) -> bool:
    return path != other and path.startswith(other.rstrip("/") + "/")
