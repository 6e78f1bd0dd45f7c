"""A repository the command created gets git's default control plane back.

A `.git` that did not exist before the command (`git init`, `git clone`, `cargo new`, a
worktree or submodule of a new repository) keeps its objects, refs, index and logs: that is
the command's work (an index holding a path git refuses to check out, `.git/config` or
`../x`, is removed: the user's `git restore .` would write it). What makes host git run
something is reset, on the host, after the command, so the user's next `git status` there
runs nothing the command planted:

- `config` is re-written from the keys git's own parser (`git config --list -z`) reads in
  it, keeping only an allowlist of keys that configure data (`_KEPT`; remote and submodule
  URLs without a `<transport>::` helper; `core.worktree` only as git's default). Everything
  else, known to run code or not (`core.fsmonitor`, `core.hooksPath`, `filter.*`,
  `alias.*`, `include.*`, ...), is dropped;
- `hooks/` is emptied; `info/` keeps only `exclude` and `sparse-checkout`;
- `commondir` and `config.worktree` are removed, and so are legacy `remotes/` and
  `branches/`, rebase and sequencer state (their todo lists run `exec` lines), and object
  alternates leading out of the roots;
- a linked worktree's directory (`worktrees/<name>`) keeps git's own `commondir` (`../..`)
  only, and each submodule's git directory under `modules/` is reset the same way.

Every step opens directories with O_NOFOLLOW from `/` down (the roots are canonical), and
removes symlinks instead of following them: a link the command left in its `.git` cannot
redirect a write of the executor's. The command has ended: nothing races these writes but
its own leftover background processes, which O_NOFOLLOW keeps from redirecting them.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator

from bash_sandbox.git_discovery import listed_pairs, scrubbed_git, scrubbed_git_env
from bash_sandbox.host_run import run_bounded
from bash_sandbox.linux.binaries import host_git
from bash_sandbox.safe_read import is_special, open_below
from policies.paths import within_any

# Keys that only describe data; every other key is dropped.
_KEPT = frozenset(
    {
        "core.repositoryformatversion",
        "core.bare",
        "core.filemode",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "core.autocrlf",
        "core.eol",
        "core.sparsecheckout",
        "core.sparsecheckoutcone",
        "extensions.objectformat",
        "extensions.refstorage",
        "init.defaultbranch",
        "user.name",
        "user.email",
    }
)
# (section, key) kept for any subsection: remote and branch tracking, submodule URLs.
_KEPT_SUB = frozenset(
    {
        ("remote", "url"),
        ("remote", "pushurl"),
        ("remote", "fetch"),
        ("branch", "remote"),
        ("branch", "merge"),
        ("submodule", "url"),
        ("submodule", "active"),
    }
)
_URL_KEYS = frozenset({"url", "pushurl"})
# `<transport>::<address>` runs `git-remote-<transport>` (`ext::` runs a shell command).
_HELPER_URL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.-]*::")
_INFO_KEPT = frozenset({"exclude", "sparse-checkout"})
_REMOVED = (
    "commondir",
    "config.worktree",
    "remotes",
    "branches",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
)
_CONFIG_MAX = 1 << 20
# An index git would hold for a very large checkout is a few hundred MiB.
_INDEX_MAX = 1 << 30
_MODULES_DEPTH = 8
_NESTED_MAX = 100_000  # directories below one created git dir looked at for hidden ones
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def reset_control_plane(gitdir: str, roots: tuple[str, ...]) -> list[str]:
    """Reset ``gitdir`` (a repository the command created, inside ``roots``) to git's
    default control plane; returns what was dropped that could run code or redirect git,
    relative to ``gitdir`` (empty for what `git init`, `git clone` or `cargo new` make)."""
    dropped: list[str] = []
    try:
        fd = _open_path(gitdir)
    except OSError:
        return dropped
    try:
        _reset(fd, gitdir, roots, dropped, rel="", depth=0)
        _nested(fd, gitdir, roots, dropped)
    finally:
        os.close(fd)
    return dropped


def _nested(fd: int, gitdir: str, roots: tuple[str, ...], dropped: list[str]) -> None:
    """Reset every other git directory hidden below the created one (`x/.git/evil`): the
    repository search never looks inside a `.git`, but a gitfile or a link elsewhere (one
    already there, or one a later command writes in another workspace) can lead host git
    into it. A linked worktree's directory is git's own (`_worktree` judged it); a
    submodule's was reset with `modules/`, and again here does nothing. Depth first, one
    directory open at a time, each reached from ``fd`` without following a link."""
    pending = [""]
    seen = 0
    while pending:
        rel = pending.pop()
        try:
            parent = open_below(fd, rel)
        except OSError:
            continue
        try:
            _drop_special(parent, rel, dropped)
            for name, sub in _subdirs(parent, None):
                try:
                    path = os.path.join(rel, name)
                    seen += 1
                    if seen > _NESTED_MAX:
                        dropped.append(f"(not searched past {_NESTED_MAX} directories)")
                        return
                    if _looks_git(sub) and not _linked_worktree(sub, rel):
                        _reset(sub, os.path.join(gitdir, path), roots, dropped, rel=path,
                               depth=_MODULES_DEPTH)  # fmt: skip
                    pending.append(path)
                finally:
                    os.close(sub)
        finally:
            os.close(parent)


def _drop_special(fd: int, rel: str, dropped: list[str]) -> None:
    """Remove the FIFOs, sockets and device nodes in the directory ``fd``: nothing of git's,
    and host git (or the executor) opening one would wait for a writer that never comes
    (a red team's `mkfifo r/.git/HEAD` stopped the executor's next spawn)."""
    try:
        with os.scandir(fd) as listing:
            entries = [(e.name, e.stat(follow_symlinks=False).st_mode) for e in listing]
    except OSError:
        return
    for name, mode in entries:
        if is_special(mode):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
                dropped.append(os.path.join(rel, name) + " (not a file: removed)")


def _linked_worktree(fd: int, parent: str) -> bool:
    """Whether the directory ``fd`` (in ``parent``) is a linked worktree's in git's own
    layout: in a `worktrees/`, naming its common dir `../..`, whose config and hooks git
    uses (its own `config` is never read). Without that `commondir`, a directory there
    holding `objects` and `refs` is a repository of its own to git: reset like any other."""
    return os.path.basename(parent) == "worktrees" and _read(fd, "commondir") in (
        b"../..\n",
        b"../..",
    )


def _looks_git(fd: int) -> bool:
    """Whether git may take the directory ``fd`` for a git directory, erring towards yes
    (`git_discovery.is_git_directory`: a `HEAD` that is not a directory, and `objects` and
    `refs`, or a `commondir`)."""
    try:
        if stat.S_ISDIR(os.lstat("HEAD", dir_fd=fd).st_mode):
            return False
    except OSError:
        return False
    return _lexists(fd, "commondir") or (_lexists(fd, "objects") and _lexists(fd, "refs"))


def _open_path(path: str) -> int:
    """A directory descriptor for the absolute ``path``, no component followed as a link."""
    top = os.open("/", _O_DIR)
    try:
        return open_below(top, "/".join(p for p in path.split("/") if p))
    finally:
        os.close(top)


def _reset(
    fd: int, gitdir: str, roots: tuple[str, ...], dropped: list[str], *, rel: str, depth: int
) -> None:
    def note(name: str) -> None:
        dropped.append(os.path.join(rel, name))

    keys = _config(fd, gitdir, roots)
    if keys:
        note(f"config ({', '.join(keys)})")
    for name in _REMOVED:
        if not _empty(fd, name) and _remove(fd, name):
            note(name)
    # git's own samples are never run: removed without a word, like an empty legacy dir.
    for name in _empty_dir(fd, "hooks", keep=frozenset()):
        if not name.endswith(".sample"):
            note(f"hooks/{name}")
    for name in _empty_dir(fd, "info", keep=_INFO_KEPT):
        note(f"info/{name}")
    _alternates(fd, gitdir, roots, dropped, rel)
    if _refused_index(fd, gitdir):
        note("index (paths git refuses to check out)")
    for name, sub in _subdirs(fd, "worktrees"):
        try:
            _worktree(sub, roots, dropped, os.path.join(rel, "worktrees", name))
            if _refused_index(sub, gitdir):
                dropped.append(os.path.join(rel, "worktrees", name, "index"))
        finally:
            os.close(sub)
    if depth < _MODULES_DEPTH:
        for name, sub in _subdirs(fd, "modules"):
            try:
                _module(sub, os.path.join(gitdir, "modules", name), roots, dropped,
                        rel=os.path.join(rel, "modules", name), depth=depth + 1)  # fmt: skip
            finally:
                os.close(sub)


def _module(
    fd: int, path: str, roots: tuple[str, ...], dropped: list[str], *, rel: str, depth: int
) -> None:
    # A submodule named `a/b` lives in `modules/a/b`: a git directory has a HEAD.
    if _lexists(fd, "HEAD"):
        _reset(fd, path, roots, dropped, rel=rel, depth=depth)
        return
    if depth >= _MODULES_DEPTH:
        return
    for name, sub in _subdirs(fd, None):
        try:
            _module(sub, os.path.join(path, name), roots, dropped,
                    rel=os.path.join(rel, name), depth=depth + 1)  # fmt: skip
        finally:
            os.close(sub)


def _worktree(fd: int, roots: tuple[str, ...], dropped: list[str], rel: str) -> None:
    for name in ("config.worktree", "rebase-merge", "rebase-apply", "sequencer"):
        if _remove(fd, name):
            dropped.append(os.path.join(rel, name))
    # Where host git writes the worktree's `.git` (`git worktree repair`) and what
    # `git worktree remove --force` deletes: only inside the roots.
    named = _read(fd, "gitdir", 1 << 16)
    # Here, not at the top: `git_import` imports this module (a survey imports this first).
    from bash_sandbox.git_import.state_files import worktree_inside

    if _lexists(fd, "gitdir") and (named is None or not worktree_inside(named, roots)):
        _remove(fd, "gitdir")
        dropped.append(os.path.join(rel, "gitdir"))
    # git's own layout: `<common>/worktrees/<name>/commondir` holds `../..`.
    if _read(fd, "commondir") not in (None, b"../..\n", b"../.."):
        _remove(fd, "commondir")
        dropped.append(os.path.join(rel, "commondir"))


def _refused_index(fd: int, gitdir: str) -> bool:
    """Remove the `index` below ``fd`` when it holds an entry git's own path rules refuse
    (`.git/config`, `../x`, `.GIT/...`): git checks names when it adds an entry, not when it
    reads an index, so the user's `git restore .` there would write them (the config that
    then runs, a file outside the workspace). Judged by git itself: the entries, as
    `ls-files` reads them, given to `update-index --index-info` in a scratch index, which
    drops each path `verify_path` refuses. Returns whether it was removed."""
    if not _lexists(fd, "index"):
        return False
    with tempfile.TemporaryDirectory(prefix="bash-sandbox-index-") as tmp:
        copy, scratch = os.path.join(tmp, "index"), os.path.join(tmp, "scratch")
        if not _copy_regular(fd, "index", copy):
            return _remove(fd, "index")  # a link, a fifo: not an index git would read as one
        env = scrubbed_git_env(GIT_DIR=gitdir)
        try:
            listed = run_bounded(
                [*scrubbed_git(), "ls-files", "--stage", "-z"],
                env={**env, "GIT_INDEX_FILE": copy},
                cwd="/",
                timeout=60,
            )
            if listed.returncode != 0:
                return False  # host git cannot read it either
            entries = [e for e in listed.stdout.split(b"\0") if e]
            if not entries:
                return False
            run_bounded(
                [*scrubbed_git(), "update-index", "-z", "--index-info"],
                env={**env, "GIT_INDEX_FILE": scratch},
                cwd="/",
                input=listed.stdout,
                timeout=60,
            )
            kept = run_bounded(
                [*scrubbed_git(), "ls-files", "--stage", "-z"],
                env={**env, "GIT_INDEX_FILE": scratch},
                cwd="/",
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return _remove(fd, "index")
    if kept.returncode == 0 and len([e for e in kept.stdout.split(b"\0") if e]) == len(entries):
        return False
    return _remove(fd, "index")


def _copy_regular(fd: int, name: str, dest: str) -> bool:
    """Copy the regular file ``name`` below ``fd`` (never through a link) to ``dest``; not
    one larger than `_INDEX_MAX`, or sparse (a command's `truncate -s 500G index` was copied
    whole to the host's temp directory, on the settle's time)."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return False
    try:
        st = os.fstat(src)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_size > _INDEX_MAX
            or st.st_blocks * 512 < st.st_size - (1 << 16)
        ):
            return False
        with open(dest, "wb") as out:
            while chunk := os.read(src, 1 << 20):
                out.write(chunk)
        return True
    finally:
        os.close(src)


def _subdirs(fd: int, name: str | None) -> Iterator[tuple[str, int]]:
    """Real subdirectories of ``name`` (below ``fd``), each opened without following."""
    try:
        parent = os.open(name, _O_DIR, dir_fd=fd) if name is not None else os.dup(fd)
    except OSError:
        return
    try:
        for entry in sorted(os.listdir(parent)):
            try:
                sub = os.open(entry, _O_DIR, dir_fd=parent)
            except OSError:
                continue
            yield entry, sub
    finally:
        os.close(parent)


def _lexists(fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=fd)
    except OSError:
        return False
    return True


def _read(fd: int, name: str, limit: int = 4096) -> bytes | None:
    """A regular file's first bytes, never through a link; None if it is not one."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            return None
        return os.read(f, limit)
    finally:
        os.close(f)


def _remove(fd: int, name: str) -> bool:
    """Remove ``name`` below ``fd`` whatever it is (a directory with all it holds)."""
    try:
        st = os.lstat(name, dir_fd=fd)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        try:
            sub = os.open(name, _O_DIR, dir_fd=fd)
        except OSError:
            return False
        try:
            for entry in os.listdir(sub):
                _remove(sub, entry)
        finally:
            os.close(sub)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=fd)
        return True
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)
    return True


def _empty(fd: int, name: str) -> bool:
    """Whether ``name`` is a real, empty directory (git init's `branches/`)."""
    try:
        sub = os.open(name, _O_DIR, dir_fd=fd)
    except OSError:
        return False
    try:
        return not os.listdir(sub)
    finally:
        os.close(sub)


def _empty_dir(fd: int, name: str, keep: frozenset[str]) -> list[str]:
    """Leave ``name`` a real directory holding only regular files named in ``keep``;
    returns what was removed (``name`` itself when it was not a real directory)."""
    try:
        st = os.lstat(name, dir_fd=fd)
    except OSError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        _remove(fd, name)
        with contextlib.suppress(OSError):
            os.mkdir(name, 0o755, dir_fd=fd)
        return ["(not a directory)"]
    removed: list[str] = []
    try:
        sub = os.open(name, _O_DIR, dir_fd=fd)
    except OSError:
        return []
    try:
        for entry in sorted(os.listdir(sub)):
            if entry in keep and stat.S_ISREG(os.lstat(entry, dir_fd=sub).st_mode):
                continue
            if _remove(sub, entry):
                removed.append(entry)
    finally:
        os.close(sub)
    return removed


def _alternates(fd: int, gitdir: str, roots: tuple[str, ...], dropped: list[str], rel: str) -> None:
    try:
        objects = os.open("objects", _O_DIR, dir_fd=fd)
    except OSError:
        return
    try:
        try:
            info = os.open("info", _O_DIR, dir_fd=objects)
        except OSError:
            return
        try:
            if _remove_if(info, "http-alternates", lambda _: True):
                dropped.append(os.path.join(rel, "objects/info/http-alternates"))
            base = os.path.join(gitdir, "objects")

            def leads_out(data: bytes) -> bool:
                # Git C-unquotes a line that starts with a quote (and may read on after its
                # closing one): not read here as git would, so any quote is taken to lead out.
                if b'"' in data:
                    return True
                lines = [ln for ln in data.splitlines() if ln.strip() and not ln.startswith(b"#")]
                return any(
                    not within_any(os.path.realpath(os.path.join(base, os.fsdecode(ln))), roots)
                    for ln in lines
                )

            if _remove_if(info, "alternates", leads_out):
                dropped.append(os.path.join(rel, "objects/info/alternates"))
        finally:
            os.close(info)
    finally:
        os.close(objects)


def _remove_if(fd: int, name: str, bad: Callable[[bytes], bool]) -> bool:
    if not _lexists(fd, name):
        return False
    data = _read(fd, name, _CONFIG_MAX)
    if data is not None and not bad(data):
        return False
    return _remove(fd, name)


# -- config ----------------------------------------------------------------------------------


def _config(fd: int, gitdir: str, roots: tuple[str, ...]) -> list[str]:
    """Re-write `config` from its allowlisted keys; returns the keys dropped."""
    if not _lexists(fd, "config"):
        return []
    data = _read(fd, "config", _CONFIG_MAX)
    parsed = parse_config(data) if data is not None else None
    pairs = parsed or []
    kept = [(k, v) for k, v in pairs if _keep(k, v, gitdir, roots)]
    dropped = [k for k, v in pairs if (k, v) not in kept]
    if parsed is None:
        dropped.insert(0, "not a config git reads")  # a link, a fifo, a malformed file
    if dropped:
        _write(fd, "config", serialize_config(kept))
    # Asked of the repository as it is now (data keys only): `includeIf` conditions on its
    # path, branch or remotes are git's to evaluate (a red team's set it through them).
    pinned = _hooks_pinned(gitdir)
    if pinned is not None:
        _write(fd, "config", serialize_config([*kept, pinned]))
    return list(dict.fromkeys(dropped))


_REPOSITORY_VARIABLES = frozenset(
    {"GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"}
)


def _hooks_pinned(gitdir: str) -> tuple[str, str] | None:
    """`core.hooksPath` set to this repository's own (emptied) hooks where host git, reading
    the user's configs for this repository, finds a relative one: that is relative to each
    repository's worktree, so host git in a repository the command made ran the command's
    `.githooks/pre-commit` (a red team's)."""
    # The user's environment (where their configs are), but what would pick a repository.
    env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_VARIABLES}
    try:
        done = run_bounded(
            [host_git(), f"--git-dir={gitdir}", "config", "--get", "core.hooksPath"],
            env=env,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    value = os.fsdecode(done.stdout.rstrip(b"\n"))
    if done.returncode != 0 or not value or value.startswith(("/", "~")):
        return None
    return ("core.hookspath", os.path.join(gitdir, "hooks"))


def parse_config(data: bytes) -> list[tuple[str, str | None]] | None:
    """(key, value) pairs of a config file's bytes, read by git (`--list -z`, no includes);
    a key without `=` has the value None. None when git cannot read it."""
    with tempfile.TemporaryDirectory(prefix="bash-sandbox-config-") as tmp:
        path = os.path.join(tmp, "config")
        with open(path, "wb") as fh:
            fh.write(data)
        try:
            done = run_bounded(
                [*scrubbed_git(), "config", "--file", path, "--no-includes", "--list", "-z"],
                env=scrubbed_git_env(),
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None
    if done.returncode != 0:
        return None
    return listed_pairs(done.stdout)


def _keep(key: str, value: str | None, gitdir: str, roots: tuple[str, ...]) -> bool:
    section, _, rest = key.partition(".")
    sub, _, name = rest.rpartition(".")
    if key == "core.worktree":
        # Only git's own default, spelled out: the directory holding `.git`, reached without
        # a link. Anything else is a directory a later command can swap for a symlink
        # (`../../link` -> `/`), and the user's `git checkout -- .` there writes through
        # it; an ancestor holds names the command may not write (`.vscode/`, `.envrc`).
        if value is None:
            return False
        target = os.path.normpath(os.path.join(gitdir, value))
        return (
            os.path.basename(gitdir) == ".git"
            and target == os.path.dirname(gitdir)
            and os.path.realpath(target) == target
            and within_any(target, roots)
        )
    if not sub:
        return key in _KEPT
    if (section, name) not in _KEPT_SUB:
        return False
    if name in _URL_KEYS:
        return value is not None and not _HELPER_URL.match(value) and not value.startswith("-")
    return True


def data_pairs(pairs: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
    """Of ``pairs`` (`parse_config`), those of the remote, branch, submodule and user keys
    the allowlist keeps (`_KEPT`, `_KEPT_SUB`): what a new repository the import makes may
    take over from the command's (its `core.*` and `extensions.*` are git's own there)."""
    return [
        (k, v)
        for k, v in pairs
        if v is not None
        and k.partition(".")[0] in ("remote", "branch", "submodule", "user")
        and _keep(k, v, "", ())
    ]


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'


def serialize_config(pairs: list[tuple[str, str | None]]) -> bytes:
    """A config file holding ``pairs`` (as `--list` names them), grouped by section."""
    sections: dict[tuple[str, str | None], list[tuple[str, str | None]]] = {}
    for key, value in pairs:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        sections.setdefault((section, sub or None), []).append((name, value))
    lines: list[str] = []
    for (section, subsection), entries in sections.items():
        head = section if subsection is None else f"{section} " + _quote(subsection)
        lines.append(f"[{head}]")
        lines += [f"\t{name} = {_quote(v) if v is not None else 'true'}" for name, v in entries]
    return os.fsencode("\n".join(lines) + ("\n" if lines else ""))


def _write(fd: int, name: str, data: bytes) -> None:
    """Replace ``name`` below ``fd`` with ``data`` (a new file renamed over it)."""
    tmp = f".{name}.bash-sandbox-{os.getpid()}"
    with contextlib.suppress(OSError):
        _remove(fd, tmp)
    if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
        _remove(fd, name)
    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                dir_fd=fd)  # fmt: skip
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(f, view) :]
        os.fsync(f)
    finally:
        os.close(f)
    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
