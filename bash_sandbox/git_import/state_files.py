"""The small files of git's state besides refs, objects and the index: pseudo-refs, message
files, and the rebase, am and sequencer state the host's `git <op> --continue` acts on.

Each is read from the command's layer, checked, and re-serialized from its parsed form
(never copied as it is): pseudo-refs are lines of object ids; message files are text git
only shows or uses as a message; a todo list holds only git's own commands (no `exec`);
`sequencer/opts` is read with git's config parser (`git config --file --list -z`) and only
its known keys kept, a merge strategy only when it is one of git's own. Anything else in
those directories is refused: a name the host's git might act on is never guessed at.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from bash_sandbox.git_import.gitcmd import GitError, git
from policies.paths import within_any

MAX_TEXT = 8 << 20

# Files holding object ids, one a line (MERGE_HEAD may hold several).
PSEUDO_REFS = frozenset(
    {
        "ORIG_HEAD",
        "MERGE_HEAD",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "REBASE_HEAD",
        "BISECT_HEAD",
        "AUTO_MERGE",
        "BISECT_EXPECTED_REV",
        "MERGE_AUTOSTASH",
    }
)
# Text git reads as a message, a mode word or a list of names, never as code or a path.
MESSAGES = frozenset(
    {
        "COMMIT_EDITMSG",
        "MERGE_MSG",
        "MERGE_MODE",
        "SQUASH_MSG",
        "TAG_EDITMSG",
        "BISECT_LOG",
        "BISECT_NAMES",
        "BISECT_START",
        "BISECT_TERMS",
        "BISECT_ANCESTORS_OK",
    }
)
# Written by git for itself, or dropped on purpose (fetch results are refetched).
IGNORED = frozenset({"FETCH_HEAD", "gc.pid", "gc.log", "index.lock", "HEAD.lock"})
STATE_DIRS = frozenset({"rebase-merge", "rebase-apply", "sequencer"})

_TODO = frozenset(
    {"rebase-merge/git-rebase-todo", "rebase-merge/git-rebase-todo.backup",
     "rebase-merge/done", "sequencer/todo", "sequencer/done"}
)  # fmt: skip
_TODO_COMMANDS = frozenset(
    {"pick", "p", "reword", "r", "edit", "e", "squash", "s", "fixup", "f", "break", "b",
     "drop", "d", "label", "l", "reset", "t", "merge", "m", "noop", "update-ref", "u",
     "revert"}
)  # fmt: skip
BUILTIN_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
_REBASE_MERGE = frozenset(
    {"git-rebase-todo", "git-rebase-todo.backup", "done", "head-name", "onto", "orig-head",
     "interactive", "msgnum", "end", "message", "author-script", "amend", "stopped-sha",
     "strategy", "strategy_opts", "allow_rerere_autoupdate", "gpg_sign_opt", "signoff",
     "quiet", "verbose", "drop_redundant_commits", "keep_redundant_commits",
     "reschedule-failed-exec", "no-reschedule-failed-exec", "update-refs", "rewritten-list",
     "rewritten-pending", "current-fixups", "squash-onto", "patch", "autostash",
     "committer-date-is-author-date", "ignore-date", "root", "message-squash",
     "message-fixup", "dropped", "refs-to-check", "cdate_is_adate", "no-verify"}
)  # fmt: skip
_REBASE_APPLY = frozenset(
    {"next", "last", "applying", "patch", "final-commit", "info", "msg", "msg-clean", "keep",
     "threeway", "quiet", "sign", "utf8", "rebasing", "orig-head", "onto", "head-name",
     "abort-safety", "original-commit", "author-script", "scissors", "no_inbody_headers",
     "messageid", "quoted-cr", "apply-opt", "dirtyindex", "empty", "rewritten",
     "committer-date-is-author-date", "ignore-date", "autostash"}
)  # fmt: skip
_SEQUENCER = frozenset({"todo", "done", "opts", "head", "abort-safety"})
# `sequencer/opts` keys git's sequencer reads (`populate_opts_cb`), lower-cased.
_OPTS_KEYS = frozenset(
    {"options.no-commit", "options.edit", "options.allow-empty", "options.allow-empty-message",
     "options.keep-redundant-commits", "options.drop-redundant-commits", "options.signoff",
     "options.record-origin", "options.allow-ff", "options.mainline", "options.strategy",
     "options.strategy-option", "options.allow-rerere-auto", "options.default-msg-cleanup",
     "options.gpg-sign", "options.reschedule-failed-exec"}
)  # fmt: skip
# Passed to `git apply` / a signing program: never the command's.
_ONLY_EMPTY = frozenset({"rebase-apply/apply-opt"})
# Even a bare `-S` has the user's `git rebase --continue` sign the command's commits with the
# user's key: any value is refused, as `options.gpg-sign` is.
_SIGNING = frozenset({"rebase-merge/gpg_sign_opt"})
_PATCH = re.compile(r"[0-9]{4,}")


class StateRefused(Exception):
    """A state file the host's git would act on differently from a plain copy: refused."""


def parse_oids(data: bytes, hexlen: int) -> list[str]:
    """Object ids, one a line (a pseudo-ref); anything else is refused."""
    text = data.decode("ascii", errors="strict") if data.isascii() else None
    if text is None:
        raise StateRefused("not an object id")
    lines = [line for line in text.split("\n") if line]
    pattern = re.compile(f"[0-9a-f]{{{hexlen}}}")
    if not lines or len(lines) > 64 or not all(pattern.fullmatch(line) for line in lines):
        raise StateRefused("not a list of object ids")
    return lines


def parse_reflog(
    data: bytes, hexlen: int, drop: frozenset[str] = frozenset()
) -> tuple[bytes, list[str]]:
    """A reflog, each entry parsed (`<old> <new> <ident> <time> <tz>[\t<message>]`) and
    written back, without the entries naming an object in ``drop``; with the object ids
    it names."""
    entry = re.compile(
        rb"([0-9a-f]{%d}) ([0-9a-f]{%d}) ([^<>\n]*<[^<>\n]*>) ([0-9]{1,12}) ([+-][0-9]{4})"
        rb"(\t[^\n]*)?" % (hexlen, hexlen)
    )
    out: list[bytes] = []
    oids: dict[str, None] = {}
    zero = "0" * hexlen
    for line in check_text(data).split(b"\n"):
        if not line:
            continue
        match = entry.fullmatch(line)
        if match is None:
            raise StateRefused("not a reflog")
        pair = [o for o in (match.group(1).decode(), match.group(2).decode()) if o != zero]
        if drop.intersection(pair):
            continue
        oids.update(dict.fromkeys(pair))
        out.append(b" ".join(match.group(1, 2, 3, 4, 5)) + (match.group(6) or b"") + b"\n")
    return b"".join(out), list(oids)


@dataclass(frozen=True)
class ReflogEntry:
    """One line of a reflog, read leniently (the host's own reflogs are read too)."""

    line: bytes  # as it stands, without its newline
    oids: tuple[str, ...]  # old and new, the null id left out
    time: int | None  # seconds since the epoch (what `git reflog expire` judges it by)


def reflog_entries(data: bytes, hexlen: int) -> list[ReflogEntry]:
    """The entries of a reflog, each with the ids git's reachability walk takes from it."""
    strict = re.compile(
        rb"[0-9a-f]{%d} [0-9a-f]{%d} [^<>\n]*<[^<>\n]*> ([0-9]{1,12}) [+-][0-9]{4}(?:\t[^\n]*)?"
        % (hexlen, hexlen)
    )
    ids = re.compile(rb"([0-9a-f]{%d}) ([0-9a-f]{%d}) " % (hexlen, hexlen))
    zero = "0" * hexlen
    found: list[ReflogEntry] = []
    for line in data.split(b"\n"):
        pair = ids.match(line)
        if pair is None:
            continue
        whole = strict.fullmatch(line)
        oids = tuple(o.decode() for o in pair.groups() if o.decode() != zero)
        found.append(ReflogEntry(line, oids, int(whole.group(1)) if whole else None))
    return found


def reflog_oids(data: bytes, hexlen: int) -> set[str]:
    """Every object id a reflog names, old and new of each entry (git's reachability walk
    takes both), read where git reads them: the two ids that start each line. Lenient (the
    host's own reflogs are read too); the null id left out."""
    entry = re.compile(rb"^([0-9a-f]{%d}) ([0-9a-f]{%d}) " % (hexlen, hexlen), re.MULTILINE)
    found = {oid.decode() for pair in entry.findall(data) for oid in pair}
    found.discard("0" * hexlen)
    return found


def canonical_gitdir(data: bytes) -> str | None:
    """The `.git` file a linked worktree's `gitdir` (``data``, as the command wrote it) names,
    when every reader agrees on it: absolute, one line, no NUL, and its own `realpath` (no
    `.` or `..`, no doubled slash, no symlink, no `/proc/<pid>/root`). The executor's own
    worktree protections read `gitdir` lexically, host git through the kernel: a value they
    would resolve differently is refused (None)."""
    named = data.rstrip(b" \t\n\r\v\f")
    if not named.startswith(b"/") or any(c in named for c in b"\0\n\r"):
        return None
    path = os.fsdecode(named)
    if os.path.normpath(path) != path or os.path.realpath(path) != path:
        return None
    return path


def checked_out_branch(data: bytes) -> str | None:
    """The branch a `BISECT_START` or a rebase's `head-name` holds checked out, read as git's
    `get_branch` reads it (`worktree.c`): `refs/heads/<name>` or a short name; an object id,
    `detached HEAD` or another ref name none."""
    value = data.rstrip(b"\n").decode(errors="surrogateescape")
    if not value or value == "detached HEAD" or re.fullmatch("[0-9a-f]{40}|[0-9a-f]{64}", value):
        return None
    if value.startswith("refs/"):
        return value if value.startswith("refs/heads/") else None
    return f"refs/heads/{value}"


def gitdir_named(data: bytes) -> bytes:
    """What a linked worktree's `gitdir` file (``data``) names, read as git reads it
    (`get_linked_worktree`: trailing blanks cut from the whole file, then the C string up
    to a NUL)."""
    return data.rstrip(b" \t\n\r\v\f").partition(b"\0")[0]


def worktree_inside(data: bytes, roots: Iterable[str]) -> bool:
    """Whether a linked worktree's `gitdir` file (``data``) names a place inside ``roots``
    (`gitdir_named`), every link in it resolved as host git would follow it."""
    named = gitdir_named(data)
    if not named.startswith(b"/"):
        return False
    return within_any(os.path.realpath(os.fsdecode(named)), tuple(roots))


def check_bisect_start(data: bytes) -> bytes:
    """`BISECT_START`: the branch or commit `git bisect reset` checks out again, which git
    passes to `git checkout` as a word: one that begins with `-` would be an option
    (`-f` throws away the user's uncommitted work)."""
    value = data.strip()
    if not value or value.startswith(b"-") or any(c in value for c in b" \t\r\n\0"):
        raise StateRefused("not a branch or a commit to return to")
    return value + b"\n"


def check_text(data: bytes) -> bytes:
    if len(data) > MAX_TEXT or b"\0" in data:
        raise StateRefused("not a bounded text file")
    return data


def _todo(data: bytes) -> bytes:
    for line in check_text(data).decode(errors="replace").splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] in ("exec", "x"):
            raise StateRefused("a todo list with exec lines (the host's git would run them)")
        if words[0] not in _TODO_COMMANDS:
            raise StateRefused(f"a todo list with the unknown command {words[0]!r}")
    return data


def _quote(value: str) -> str:
    if "\n" in value or "\0" in value:
        raise StateRefused("a multi-line option value")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _opts(path: str) -> bytes:
    """`sequencer/opts`: parsed by git's config parser, known keys re-serialized."""
    try:
        listed = git("/nonexistent", "config", "--file", path, "--list", "-z").stdout
    except GitError as exc:
        raise StateRefused(f"sequencer options git cannot parse ({exc.stderr.strip()})") from exc
    out = ["[options]\n"]
    for item in listed.split(b"\0"):
        if not item:
            continue
        key, _, value = item.decode(errors="strict").partition("\n")
        if key not in _OPTS_KEYS:
            raise StateRefused(f"the sequencer option {key!r} is not one git's sequencer reads")
        if key == "options.strategy" and value not in BUILTIN_STRATEGIES:
            raise StateRefused(
                "a merge strategy that is not git's own (the host's git would run it)"
            )
        if key == "options.gpg-sign":
            raise StateRefused("a signing key chosen by the command")
        out.append(f"\t{key.split('.', 1)[1]} = {_quote(value)}\n")
    return "".join(out).encode()


@dataclass(frozen=True)
class CheckedFile:
    rel: str  # within the admin dir, e.g. `rebase-merge/onto`
    data: bytes


# Files git reads as one object id (`onto`, `orig-head`, ...); `stopped-sha` may be abbreviated.
_OID_FILES = frozenset(
    {"rebase-merge/onto", "rebase-merge/orig-head", "rebase-merge/squash-onto",
     "rebase-merge/amend", "rebase-merge/autostash", "rebase-apply/onto",
     "rebase-apply/orig-head", "rebase-apply/abort-safety", "rebase-apply/original-commit",
     "rebase-apply/autostash", "sequencer/head", "sequencer/abort-safety"}
)  # fmt: skip
_OID = re.compile(rb"[0-9a-f]{40}|[0-9a-f]{64}")
_SHORT_OID = re.compile(rb"[0-9a-f]{4,64}")
_HEAD_NAMES = frozenset({"rebase-merge/head-name", "rebase-apply/head-name"})


def _branch(name: bytes) -> bool:
    """A local branch's full name, as git's own `check-ref-format` reads it: git finishing
    or aborting a rebase writes to the ref a state file names (`head-name`, `update-refs`),
    and any name git's format allows is a path under the git directory (`shallow`,
    `info/grafts`, `refs/replace/*`)."""
    if not name.startswith(b"refs/heads/") or len(name) > 4096:
        return False
    done = git("/nonexistent", "check-ref-format", os.fsdecode(name), check=False)
    return done.returncode == 0


def _head_name(data: bytes) -> bytes:
    value = check_text(data).strip()
    if value != b"detached HEAD" and not _branch(value):
        raise StateRefused("head-name is neither a local branch nor `detached HEAD`")
    return value + b"\n"


def _update_refs(data: bytes) -> bytes:
    """`rebase-merge/update-refs`: a branch, its object id before, its object id after, per
    three lines (`sequencer_get_update_refs_state`); re-written from what was read."""
    lines = check_text(data).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) % 3 or len(lines) > 3 * 1024:
        raise StateRefused("update-refs is not a list of (branch, before, after)")
    for i in range(0, len(lines), 3):
        ref, before, after = lines[i : i + 3]
        if not _branch(ref) or not (_OID.fullmatch(before) and _OID.fullmatch(after)):
            raise StateRefused("update-refs names something other than a branch and two ids")
    return b"".join(line + b"\n" for line in lines)


# The state files whose branches host git moves when the rebase ends (`named_branches`):
# a todo's `update-ref` lines too (`git rebase --edit-todo` adds each to `update-refs`).
BRANCH_FILES = frozenset({*_HEAD_NAMES, "rebase-merge/update-refs", *_TODO})


def named_branches(rel: str, data: bytes) -> list[str]:
    """The branches a checked state file of `BRANCH_FILES` (``rel``) names."""
    lines = data.decode(errors="surrogateescape").split("\n")
    if rel in _HEAD_NAMES:
        return [lines[0]] if lines[0] != "detached HEAD" else []
    if rel in _TODO:
        names = [w[1] for w in map(str.split, lines) if len(w) > 1 and w[0] in ("update-ref", "u")]
        return [*names, *(f"refs/heads/{n}" for n in names if not n.startswith("refs/"))]
    return lines[0:-1:3]


def _oid_file(rel: str, data: bytes) -> bytes:
    value = check_text(data).strip()
    pattern = _SHORT_OID if rel.endswith("stopped-sha") else _OID
    if not value and rel.endswith("abort-safety"):
        return b""  # git writes it empty where there was no HEAD
    if not pattern.fullmatch(value):
        raise StateRefused(f"{rel} is not an object id")
    return value + b"\n"


def check_state_file(rel: str, path: str, data: bytes) -> CheckedFile:
    """One file of a state directory (``rel`` = `<dir>/<name>`), checked and re-serialized."""
    top, _, name = rel.partition("/")
    known = {"rebase-merge": _REBASE_MERGE, "rebase-apply": _REBASE_APPLY, "sequencer": _SEQUENCER}
    if "/" in name or not (
        name in known[top] or (top == "rebase-apply" and _PATCH.fullmatch(name))
    ):
        raise StateRefused(f"{rel} is not a file git keeps there")
    if rel in _TODO:
        return CheckedFile(rel, _todo(data))
    if rel == "sequencer/opts":
        return CheckedFile(rel, _opts(path))
    if rel in _HEAD_NAMES:
        return CheckedFile(rel, _head_name(data))
    if rel == "rebase-merge/update-refs":
        return CheckedFile(rel, _update_refs(data))
    if rel in _OID_FILES or rel == "rebase-merge/stopped-sha":
        return CheckedFile(rel, _oid_file(rel, data))
    strategy = data.decode(errors="replace").strip()
    if rel == "rebase-merge/strategy" and strategy not in BUILTIN_STRATEGIES:
        raise StateRefused("a merge strategy that is not git's own (the host's git would run it)")
    if rel in _ONLY_EMPTY and data.strip():
        raise StateRefused(f"{rel} passes options to git apply")
    if rel in _SIGNING and data.strip():
        raise StateRefused("signing chosen by the command")
    return CheckedFile(rel, check_text(data))
