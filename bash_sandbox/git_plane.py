"""Git's control plane: read-only to confined commands, while commits still land.

Writing `.git/config`, `.git/commondir`, `.git/config.worktree`, hooks, `info/`, a submodule's
or a worktree's config makes the host user's next `git` run code the command chose; a
symlink at `.git/COMMIT_EDITMSG` or `.git/logs/HEAD` makes the host's git write outside the
workspace. Covering names one by one cannot hold (a name git creates later, the host's
`config.lock` during `git config`, a rename that detaches a cover). So each git directory in
a writable root is mounted, for one command, as an overlay whose upper layer is private to
that command: every write lands there, never in the host's `.git`. When the command has
ended, the executor copies back what git needs to commit, branch, stash, rebase, merge and
fetch (objects, refs, packed-refs, logs, the index, HEAD and the `*_HEAD` files,
`COMMIT_EDITMSG` and the other message files, rebase and sequencer state, new linked
worktrees with git's own layout) and discards the rest, each discarded write reported as a
denial. A rebase or sequencer todo with `exec` lines, or a merge strategy that is not git's
own, is discarded too: the host's `git rebase --continue` would run them. Regular files
only: a symlink, a device or a fifo in the upper layer is never copied. A file the host
changed during the run is not overwritten (a conflict, reported).

The copy-back runs in the executor, outside every sandbox, and never follows a symlink on
the host side (each directory is opened with O_NOFOLLOW from the git directory down).

Which git directories get an overlay is `git_discovery.py`'s: every repository in a writable
root at any depth (dependency directories searched last, `.git` symlinks and gitfiles
followed as git follows them); the directories leading to one are pinned, so it cannot be
renamed away. A search stopped by its budget makes the run partial and names what it did
not list, and every `.git` an earlier search found is looked at again (`known`), so
flooding a root with directories hides nothing found before. A repository the command
creates has no overlay: after the command it is reset to git's default control plane
(`git_created.py`) and reported in `nested_repositories`; the workspace files installed
hooks run are covered like the hooks (`git_hook_chain.py`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from bash_sandbox.backends.mount_plan import GitOverlay
from bash_sandbox.git_discovery import (  # noqa: F401 - discovery's home; names kept here
    DEPENDENCY_DIRS,
    DISCOVERY_BUDGET,
    GitDiscovery,
    discover_gitdirs,
    read_gitfile,
)
from bash_seam import DenialEvidence, DenialKind, SandboxDenial

_TOP_FILES = frozenset(
    {
        "HEAD",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
        "MERGE_MSG",
        "MERGE_MODE",
        "MERGE_AUTOSTASH",
        "AUTO_MERGE",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "REBASE_HEAD",
        "BISECT_HEAD",
        "BISECT_LOG",
        "BISECT_START",
        "BISECT_TERMS",
        "BISECT_EXPECTED_REV",
        "BISECT_ANCESTORS_OK",
        "BISECT_NAMES",
        "COMMIT_EDITMSG",
        "SQUASH_MSG",
        "TAG_EDITMSG",
        "NOTES_MERGE_PARTIAL",
        "NOTES_MERGE_REF",
        "packed-refs",
        "index",
        "shallow",
        "gc.pid",
        "gc.log",
        "description",
    }
)
_TOP_DIRS = frozenset({"refs", "logs", "rebase-merge", "rebase-apply", "sequencer", "rr-cache"})
_REFUSED_OBJECT_FILES = frozenset({"info/alternates", "info/http-alternates"})
_GITLINK = 0o160000
MAX_DENIALS = 16


@dataclass
class MergeReport:
    """What the copy-back did: applied paths, refused writes, conflicts."""

    applied: list[str] = field(default_factory=list)
    denials: list[SandboxDenial] = field(default_factory=list)
    refused_total: int = 0
    conflicts: list[str] = field(default_factory=list)
    new_gitlinks: list[str] = field(default_factory=list)

    def refuse(self, path: str, why: str) -> None:
        self.refused_total += 1
        if len(self.denials) < MAX_DENIALS:
            self.denials.append(
                SandboxDenial(
                    kind=DenialKind.FILE_WRITE,
                    target=path,
                    operation="write",
                    reason=f"git control plane ({why})",
                    evidence=DenialEvidence.OVERLAY,
                )
            )


# -- discovery -------------------------------------------------------------------------------


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode(errors="replace")
    except OSError:
        return None


def prepare_placeholders(
    gitdir: str, upper: str, names: tuple[tuple[str, bool], ...]
) -> tuple[str, ...]:
    """Make empty placeholders in ``upper`` for protected names missing from ``gitdir``, so
    they exist in the merged view and can be covered read-only; returns them (relative)."""
    made: list[str] = []
    for name, is_dir in names:
        if os.path.lexists(os.path.join(gitdir, name)):
            continue
        path = os.path.join(upper, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if is_dir:
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        made.append(name)
    return tuple(made)


# -- hooks paths and includes ------------------------------------------------------------------


_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*?))?\s*$")


def _config_values(text: str) -> Iterator[tuple[str, str]]:
    """(section.key lower-cased, value) pairs of a git config text; enough to find paths."""
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        head = _SECTION.match(line)
        if head is not None:
            name, sub, rest = head.groups()
            section = name.lower() + (f".{sub}" if sub is not None else "")
            line = rest.strip()
            if not line:
                continue
        match = _KEY.match(line)
        if match is None:
            continue
        value = (match.group(2) or "").split(" #")[0].split(" ;")[0].strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        yield f"{section}.{match.group(1).lower()}", value


def config_path_targets(
    gitdir: str, worktree: str, home: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hooks directories, included config files): the targets of `core.hooksPath` and of
    `include.path`/`includeIf.*.path` in the configs git reads for this repository (system,
    global, local, worktree), following includes. Relative hooks paths are relative to the
    worktree, includes to the file that includes them."""
    configs = [
        "/etc/gitconfig",
        os.path.join(home, ".gitconfig"),
        os.path.join(
            os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "git", "config"
        ),
        os.path.join(gitdir, "config"),
        os.path.join(gitdir, "config.worktree"),
    ]
    hooks: dict[str, None] = {}
    includes: dict[str, None] = {}
    seen: set[str] = set()
    queue = list(configs)
    while queue and len(seen) < 32:
        path = os.path.realpath(queue.pop(0))
        if path in seen:
            continue
        seen.add(path)
        text = _read_small(path)
        if text is None:
            continue
        for key, value in _config_values(text):
            if not value:
                continue
            expanded = os.path.expanduser(value) if value.startswith("~") else value
            if key == "core.hookspath":
                full = expanded if os.path.isabs(expanded) else os.path.join(worktree, expanded)
                hooks.setdefault(os.path.normpath(full), None)
            elif key.startswith("include") and key.endswith(".path"):
                full = (
                    expanded
                    if os.path.isabs(expanded)
                    else os.path.join(os.path.dirname(path), expanded)
                )
                full = os.path.normpath(full)
                includes.setdefault(full, None)
                queue.append(full)
    return tuple(hooks), tuple(includes)


# -- the copy-back ----------------------------------------------------------------------------


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


_CONTROL_NAMES = frozenset({"config", "config.worktree", "commondir", "gitdir", "hooks", "info"})
# Rebase and sequencer state the host's `git rebase --continue` acts on: a todo list's
# `exec` lines are run by the host's shell, and a merge strategy other than git's own is
# run as `git-merge-<name>` from the host's PATH.
_TODO_FILES = frozenset(
    {"rebase-merge/git-rebase-todo", "rebase-merge/git-rebase-todo.backup", "sequencer/todo"}
)
_STRATEGY_FILES = frozenset({"rebase-merge/strategy", "sequencer/opts"})
_BUILTIN_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})


def _runs_code(rel: str, data: bytes) -> str | None:
    """Why copying ``data`` to ``rel`` would have the host's git run the command's code
    (also in a linked worktree's or a submodule's git directory below this one)."""
    parts = rel.split("/")
    while len(parts) > 2 and parts[0] in ("worktrees", "modules"):
        parts = parts[2:]
    rel = "/".join(parts)
    if rel in _TODO_FILES:
        for line in data.decode(errors="replace").splitlines():
            words = line.split()
            if words and words[0] in ("exec", "x"):
                return "a rebase todo with exec lines (the host's git would run them)"
    if rel in _STRATEGY_FILES:
        text = data.decode(errors="replace")
        # Git's keys are case-insensitive, and a key may follow its section header.
        names = re.findall(
            r"^\s*(?:\[[^\]]*\]\s*)?strategy\s*=\s*(\S+)", text, re.MULTILINE | re.IGNORECASE
        )
        if rel == "rebase-merge/strategy":
            names = text.split()
        if any(name not in _BUILTIN_STRATEGIES for name in names):
            return "a merge strategy that is not git's own (the host's git would run it)"
    return None


def _classify(rel: str) -> str | None:
    """None when the path may be copied back, else why it is refused."""
    parts = rel.split("/")
    top = parts[0]
    if top == "objects":
        return "alternates" if "/".join(parts[1:]) in _REFUSED_OBJECT_FILES else None
    if len(parts) == 1 and top in _TOP_FILES:
        return None
    if top in _TOP_DIRS and len(parts) > 1:
        return None
    if len(parts) == 1 and top.endswith(".lock"):
        return "stale lock"
    if top in ("worktrees", "modules") and len(parts) >= 3:
        rest = "/".join(parts[2:])
        if top == "worktrees" and rest in ("gitdir", "locked"):
            return None  # where the linked worktree lives, and its lock reason: data only
        if top == "worktrees" and rest == "commondir":
            return "commondir"  # allowed only with git's own content, checked on merge
        return _classify(rest)
    if top in _CONTROL_NAMES:
        return top
    return f"{top} is not git state"


def _open_dir_nofollow(base_fd: int, rel_dir: str, *, create: bool) -> int:
    """Open ``rel_dir`` below ``base_fd`` one component at a time, never through a symlink."""
    fd = os.dup(base_fd)
    for part in [p for p in rel_dir.split("/") if p]:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
        try:
            nxt = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _read_host(dir_fd: int, name: str) -> tuple[bytes, os.stat_result] | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{name} on the host is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def _write_host(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Atomically replace ``name`` in ``dir_fd`` (temp file + rename; never follows links)."""
    tmp = f".{name}.bash-sandbox-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode & 0o777,
        dir_fd=dir_fd,
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def gitlinks(index: bytes) -> set[str]:
    """Paths of the gitlink (submodule) entries of a git index (versions 2 and 3)."""
    if len(index) < 12 or index[:4] != b"DIRC":
        return set()
    version, count = struct.unpack(">II", index[4:12])
    if version not in (2, 3):
        return set()
    links: set[str] = set()
    pos = 12
    for _ in range(count):
        if pos + 62 > len(index):
            break
        mode = struct.unpack(">I", index[pos + 24 : pos + 28])[0]
        flags = struct.unpack(">H", index[pos + 60 : pos + 62])[0]
        name_start = pos + 62 + (2 if version == 3 and flags & 0x4000 else 0)
        end = index.find(b"\0", name_start)
        if end < 0:
            break
        if mode == _GITLINK:
            links.add(index[name_start:end].decode(errors="replace"))
        entry_len = end - pos + 1
        pos += (entry_len + 7) // 8 * 8
    return links


def merge_back(overlay: GitOverlay, started_ns: int) -> MergeReport:
    """Copy the allowed changes of ``overlay``'s upper layer into the host git directory."""
    report = MergeReport()
    placeholders = set(overlay.placeholders)
    try:
        base_fd = os.open(
            overlay.gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except OSError as exc:
        report.conflicts.append(f"{overlay.gitdir}: {exc.strerror}")
        return report
    try:
        for dirpath, dirnames, filenames in os.walk(overlay.upper):
            rel_dir = os.path.relpath(dirpath, overlay.upper)
            rel_dir = "" if rel_dir == "." else rel_dir
            for name in sorted(
                filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            ):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if rel in placeholders:
                    continue
                _merge_entry(
                    overlay,
                    base_fd,
                    rel_dir=rel_dir,
                    name=name,
                    rel=rel,
                    started_ns=started_ns,
                    report=report,
                )
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    finally:
        os.close(base_fd)
    return report


def _merge_entry(
    overlay: GitOverlay,
    base_fd: int,
    *,
    rel_dir: str,
    name: str,
    rel: str,
    started_ns: int,
    report: MergeReport,
) -> None:
    shown = os.path.join(overlay.gitdir, rel)
    src = os.path.join(overlay.upper, rel)
    st = os.lstat(src)
    why = _classify(rel)
    if why == "commondir" and stat.S_ISREG(st.st_mode) and _read_small(src) in ("../..\n", "../.."):
        why = None
    if why is not None:
        if why != "stale lock":
            report.refuse(shown, why)
        return
    if _is_whiteout(st):
        _merge_deletion(
            base_fd, rel_dir=rel_dir, name=name, shown=shown, started_ns=started_ns, report=report
        )
        return
    if not stat.S_ISREG(st.st_mode):
        report.refuse(shown, "not a regular file")
        return
    with open(src, "rb") as fh:
        data = fh.read()
    if (runs := _runs_code(rel, data)) is not None:
        report.refuse(shown, runs)
        return
    try:
        dir_fd = _open_dir_nofollow(base_fd, rel_dir, create=True)
    except OSError as exc:
        report.conflicts.append(f"{shown}: {exc.strerror or exc}")
        return
    try:
        current = _read_host(dir_fd, name)
        if current is not None and current[0] == data:
            return
        if rel.split("/", maxsplit=1)[0] == "objects" and current is not None:
            return  # content-addressed: an existing object is never rewritten
        if name == "index" and not rel_dir and current is not None:
            report.new_gitlinks = sorted(gitlinks(data) - gitlinks(current[0]))
        if current is not None and current[1].st_mtime_ns > started_ns:
            if rel.startswith("logs/") and data.startswith(current[0]):
                pass  # the host appended too: ours is a superset only if it starts with theirs
            else:
                report.conflicts.append(f"{shown} changed on the host during the command")
                return
        _write_host(dir_fd, name, data, st.st_mode)
        report.applied.append(rel)
    except OSError as exc:
        report.conflicts.append(f"{shown}: {exc.strerror or exc}")
    finally:
        os.close(dir_fd)


def _merge_deletion(
    base_fd: int, *, rel_dir: str, name: str, shown: str, started_ns: int, report: MergeReport
) -> None:
    if rel_dir.split("/", maxsplit=1)[0] == "objects":
        return  # pruning objects is never needed for correctness: keep them
    try:
        dir_fd = _open_dir_nofollow(base_fd, rel_dir, create=False)
    except OSError:
        return
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_mtime_ns > started_ns:
            report.conflicts.append(f"{shown} changed on the host during the command")
            return
        if stat.S_ISDIR(st.st_mode):
            _remove_tree_at(dir_fd, name)
        else:
            os.unlink(name, dir_fd=dir_fd)
        report.applied.append(f"-{shown}")
    except FileNotFoundError:
        pass
    except OSError as exc:
        report.conflicts.append(f"{shown}: {exc.strerror or exc}")
    finally:
        os.close(dir_fd)


def _remove_tree_at(dir_fd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _remove_tree_at(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
