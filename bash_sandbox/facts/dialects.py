"""Reading refusal messages in tool output: which path, which errno, which operation.

Pure text work, no policy and no filesystem: `find_refusal_messages(text)` returns every
message that names a path together with an errno of refusal, in the dialects real tools
speak. Which of them the sandbox caused is `facts.inference`'s business.

Dialects, tried in this order on each line (the first that yields a path wins):

1. Python: ``[Errno 30] Read-only file system: '/x'`` (and ``'/a' -> '/b'``: the target);
   also pip and pytest, which print Python's text (pytest on stdout).
2. Node and npm: ``EROFS: read-only file system, mkdir '/x'`` (the syscall is the operation).
3. Rust: ``... (os error 30) at path "/x"`` (rustc's temp dirs).
4. Java: ``/x (Read-only file system)`` and ``AccessDeniedException: /x``.
5. The C convention, ``prog: [context: ]PATH: strerror``, as coreutils, bash, git, gcc, ld,
   make, tar and Go print it: the last quoted name before the errno (``'x'``, curly quotes,
   ``"x"``, `` `x` ``), else the last ``: ``-separated segment when it is one word, else the
   last word of ``failed to open /x`` / ``mkdir /x`` style segments. tar's ``Cannot open``
   segment is skipped over.
6. Cargo and anyhow chains: an errno line without a path (``Read-only file system (os
   error 30)``) after ``Caused by:`` takes the quoted path of the ``failed to ...`` line
   above it.
7. ``git push`` to a local repository: receive-pack reports ``error: remote unpack failed:
   unable to create temporary object directory`` with no errno and no path; the
   repository is the ``To <url>`` line below it (or ``failed to push some refs to
   '<url>'``) when that URL is a local path or ``file://``. Its errno is `UNSTATED`.

A line that only says ``Permission denied`` (``raise SystemExit("Permission denied")``) has
no path and yields nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Literal

Access = Literal["write", "read", "unknown"]


def _code(name: str) -> str:
    # Node's bare codes: upper case, and a token of their own, not a piece of a path
    # ("/srv/ww-erofs-test/x" names no errno).
    return rf"(?-i:(?<![\w/.-]){name}(?![\w/-]|\.\w))"


# One errno per group; IGNORECASE because tools differ in case ("read-only file system").
_ERRNO = re.compile(
    rf"(?P<EROFS>read-only file system|{_code('EROFS')}|\(os error 30\)|\[Errno 30\])"
    rf"|(?P<EACCES>permission denied|{_code('EACCES')}|\(os error 13\)|\[Errno 13\]"
    r"|AccessDeniedException|insufficient permission)"
    rf"|(?P<EPERM>operation not permitted|{_code('EPERM')}|\(os error 1\)|\[Errno 1\])"
    rf"|(?P<EISDIR>is a directory|{_code('EISDIR')}|\(os error 21\)|\[Errno 21\])"
    rf"|(?P<ENOENT>no such file or directory|{_code('ENOENT')}|\(os error 2\)|\[Errno 2\])"
    rf"|(?P<EBUSY>device or resource busy|{_code('EBUSY')}|\(os error 16\)|\[Errno 16\])",
    re.IGNORECASE,
)

_PY_STR = r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\""
_PYTHON = re.compile(
    rf"\[Errno \d+\] [^:\n]*: (?P<a>{_PY_STR})(?: -> (?P<b>{_PY_STR}))?", re.IGNORECASE
)
_NODE = re.compile(r"\bE[A-Z]+: [^,\n]*, (?P<op>[a-z]+) '(?P<a>[^'\n]*)'(?: -> '(?P<b>[^'\n]*)')?")
_RUST_AT_PATH = re.compile(r"\(os error \d+\)\s+at path (?P<a>\"(?:[^\"\\\n]|\\.)*\")")
_JAVA_PAREN = re.compile(r"(?P<a>[^\s:()]+) \((?:read-only file system|permission denied)\)", re.I)
_JAVA_DENIED = re.compile(r"AccessDeniedException: (?P<a>\S+)")
_QUOTED = re.compile(
    r"'([^'\n]+)'|\u2018([^\u2019\n]+)\u2019|\"([^\"\n]+)\"|`([^`\n]+)`"
    r"|\u201c([^\u201d\n]+)\u201d"
)
# A cargo/anyhow context line: "failed to create directory `/x`".
_CONTEXT = re.compile(
    r"\b(?:failed to|could not|couldn't|unable to|cannot|can't)\b[^`'\"\u2018\n]*"
    r"(?:`([^`\n]+)`|'([^'\n]+)'|\"([^\"\n]+)\"|\u2018([^\u2019\n]+)\u2019|:? (/[^\s:]+)\s*$)",
    re.IGNORECASE,
)
_CAUSED_BY = re.compile(r"^\s*Caused by:\s*$")
_TAR_OPERATION = re.compile(r"^Cannot [a-z]+(?: [a-z]+)*$")
_FAILURE_PHRASE = re.compile(
    r"^(?:cannot|can't|could not|couldn't|unable to|failed to)\b", re.IGNORECASE
)
# A bare word that names a file rather than a thing: "out.txt", not "file".
_FILE_NAME = re.compile(r"\w\.\w")
# ... or a word that follows "file"/"directory" at the end: "cannot open output file main".
_NAMED_FILE = re.compile(r"\b(?:file|directory)\s+(\S+)$")
# Go's os.PathError and similar "op path" segments.
_SYSCALL_OPS = frozenset(
    {
        "open", "openat", "creat", "mkdir", "mkdirat", "rmdir", "remove", "unlink", "unlinkat",
        "rename", "renameat", "link", "symlink", "chmod", "chown", "lchown", "truncate", "utime",
        "utimes", "chtimes", "write", "stat", "lstat", "readlink", "opendir", "scandir", "mknod",
    }
)  # fmt: skip
_NOT_A_PATH = frozenset(
    {"error", "fatal", "warning", "warn", "err", "info", "note", "caused by", "e"}
)
_CONTEXT_LOOKBACK = 12

# A write the tool says failed without printing why (git push's remote unpack).
UNSTATED = "unstated"
_GIT_UNPACK = re.compile(
    r"^error: remote unpack failed: unable to create temporary object directory\s*$"
)
_GIT_PUSH_URL = re.compile(r"^To (?P<a>\S.*?)\s*$|failed to push some refs to '(?P<b>[^'\n]+)'")
# "To <url>" follows the unpack error directly; the summary line ends the push's report.
_GIT_PUSH_LOOKAHEAD = 24

_WRITE_WORDS = re.compile(
    r"\b(?:cannot (?:create|touch|remove|move|make|overwrite|change|mkdir|link|symlink|copy|"
    r"utime|open output)|changing (?:permissions|ownership)|"
    r"(?:failed|unable|could ?not|couldn't|can't) to (?:create|write|remove|rename|unlink|"
    r"lock|open .* for writing|copy|install|commit|mkdir|make|truncate|set)|"
    r"could not (?:lock|create|write|commit|remove)|couldn't (?:create|write)|"
    r"can't create|for writing|open(?:ing)? output|opening dependency file|"
    r"unable to (?:create|unlink|write)|insufficient permission for adding)\b",
    re.IGNORECASE,
)
_READ_WORDS = re.compile(
    r"\b(?:cannot (?:open directory|read|access|stat)|for reading|"
    r"(?:failed|unable|could not|couldn't|can't) (?:to )?(?:read|access|stat|open directory)|"
    r"reading directory)\b",
    re.IGNORECASE,
)
# Of those (and Node's), the ones that say what the access was; "open" does not.
_WRITE_SYSCALLS = _SYSCALL_OPS - {
    "open",
    "openat",
    "stat",
    "lstat",
    "readlink",
    "opendir",
    "scandir",
}
_WRITE_SYSCALLS |= {"copyfile", "futime"}
_READ_SYSCALLS = frozenset({"scandir", "opendir", "readlink", "stat", "lstat", "read"})


@dataclass(frozen=True)
class RefusalMessage:
    """One message naming ``path`` (as printed) with an errno of refusal."""

    path: str
    errno: str  # "EROFS", "EACCES", "EPERM", "EISDIR", "ENOENT", "EBUSY" or UNSTATED
    access: Access  # what the operation needed, when the wording says so
    operation: str | None  # e.g. "mkdir", "open" (Node, Go), else None
    line: str


def _unquote_python(text: str) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text[1:-1]
    return value if isinstance(value, str) else text[1:-1]


def _plausible(path: str) -> bool:
    return (
        0 < len(path) <= 4096
        and not any(ord(c) < 32 for c in path)
        and path.strip(".'\"`\u2018\u2019\u201c\u201d ") != ""
        and path.lower() not in _NOT_A_PATH
    )


def _access_of(text: str, operation: str | None) -> Access:
    if operation in _WRITE_SYSCALLS:
        return "write"
    if operation in _READ_SYSCALLS:
        return "read"
    if _WRITE_WORDS.search(text):
        return "write"
    if _READ_WORDS.search(text):
        return "read"
    return "unknown"


def _from_prefix(prefix: str) -> tuple[str, str | None] | None:
    """The C convention: ``prog: [context: ]PATH: `` before the errno text."""
    prefix = prefix.rstrip()
    prefix = prefix.removesuffix(":").rstrip().removesuffix("(").rstrip()
    segments = prefix.split(": ")
    # tar: "tar: out/x: Cannot open: Read-only file system"
    while len(segments) > 1 and _TAR_OPERATION.match(segments[-1].strip()):
        segments.pop()
    last = segments[-1].strip()
    quoted = _QUOTED.findall(last)
    if quoted:
        return next(g for g in quoted[-1] if g), None
    words = last.split()
    if len(segments) < 2:
        # "prog: Permission denied", "PermissionError: [Errno 13] ..." name no path; git's
        # "/ws/.git: Read-only file system" and gcc's "Cannot create temporary file in ./" do.
        if len(words) == 1 and words[0].startswith(("/", "./", "~/")):
            return words[0], None
        if len(words) > 1 and _FAILURE_PHRASE.match(last) and "/" in words[-1]:
            return words[-1], None
        return None
    if not words:
        return None
    if len(words) == 1:
        return words[0].strip("'\""), None
    first = words[0].lower()
    if first in _SYSCALL_OPS and len(words) >= 2:
        return words[-1], first  # Go: "mkdir /x", "rename /a /b"
    if "/" in words[-1] or (_FAILURE_PHRASE.match(last) and _FILE_NAME.search(words[-1])):
        return words[-1], None  # "cannot open output file /x/a.out", "cannot create out.txt"
    if _FAILURE_PHRASE.match(last) and (m := _NAMED_FILE.search(last)):
        return m.group(1), None  # ld: "cannot open output file main"
    return None


def _path_on_line(line: str, match: re.Match[str]) -> tuple[str, str | None] | None:
    if m := _PYTHON.search(line):
        return _unquote_python(m.group("b") or m.group("a")), None
    if m := _NODE.search(line):
        return m.group("b") or m.group("a"), m.group("op")
    if m := _RUST_AT_PATH.search(line):
        return _unquote_python(m.group("a")), None
    if m := _JAVA_PAREN.search(line):
        return m.group("a"), None
    if m := _JAVA_DENIED.search(line):
        return m.group("a"), None
    return _from_prefix(line[: match.start()])


def _context_path(lines: list[str], index: int) -> tuple[str, str] | None:
    """Cargo/anyhow: the ``failed to ... `path``` line above a ``Caused by:`` block, and it."""
    seen_caused_by = False
    for back in range(index - 1, max(-1, index - 1 - _CONTEXT_LOOKBACK), -1):
        text = lines[back]
        if _CAUSED_BY.match(text):
            seen_caused_by = True
            continue
        if seen_caused_by and not _ERRNO.search(text) and (m := _CONTEXT.search(text)):
            return next(g for g in m.groups() if g), text
    return None


def _local_repository(url: str) -> str | None:
    """The path of a push URL that names a local repository, else None (ssh, https)."""
    if url.startswith("file://"):
        path = url.removeprefix("file://")
        return path if path.startswith("/") else None
    if "://" in url:
        return None
    # scp-like "host:path" has a colon before any slash; a local path has none there.
    colon, slash = url.find(":"), url.find("/")
    if colon != -1 and (slash == -1 or colon < slash):
        return None
    return url


def _git_push_target(lines: list[str], index: int) -> str | None:
    """The local repository a failed ``git push`` reported at ``lines[index]`` went to."""
    for line in lines[index + 1 : index + 1 + _GIT_PUSH_LOOKAHEAD]:
        if _GIT_UNPACK.match(line):
            return None  # the next push's report: its own message covers it
        if m := _GIT_PUSH_URL.search(line):
            return _local_repository(m.group("a") or m.group("b"))
    return None


# coreutils mv: "cannot move 'SRC' to 'DST'" (quotes may be ' or the UTF-8 pair).
_MOVED = re.compile(r"cannot move ['\u2018]([^'\u2019]+)['\u2019] to ")


def find_refusal_messages(text: str) -> list[RefusalMessage]:
    """Every message in ``text`` that names a path and an errno of refusal, in order."""
    found: list[RefusalMessage] = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = _ERRNO.search(line)
        if match is None:
            if _GIT_UNPACK.match(line) and (repo := _git_push_target(lines, index)):
                found.append(RefusalMessage(repo, UNSTATED, "write", "push", line))
            continue
        errno = match.lastgroup or ""
        # The words saying what was attempted are on the same line, or on the context line.
        wording = line
        located = _path_on_line(line, match)
        if located is None and (context := _context_path(lines, index)) is not None:
            located, wording = (context[0], None), context[1]
        if located is None or not _plausible(located[0]):
            continue
        path, operation = located
        if errno == "EBUSY" and (moved := _MOVED.search(line)):
            path = moved.group(1)  # a rename refused EBUSY: the source is the mount point
        found.append(RefusalMessage(path, errno, _access_of(wording, operation), operation, line))
    return found
