"""What an allowed `.envrc` loads: the workspace files direnv runs on the user's next `cd`.

`.envrc` is a protected name, and direnv runs only an `.envrc` the user allowed (its allow
record hashes the file's path and content). But an allowed one commonly loads other files
through direnv's own directives, and direnv hashes only the `.envrc`: `source_env` and
`source_env_if_exists` (a file, or a directory's `.envrc`), `dotenv` and `dotenv_if_exists`
(a dotenv file, `.env` by default: its `LD_PRELOAD` runs code in every later host command),
and bash's `source` and `.`. A command that writes one of those runs its code in the user's
next shell that enters the directory. So each is covered read-only like the hook chain
(`git_hook_chain.py`): an existing one where it lies, a missing one held by an empty
directory placeholder (`[[ -f ]]` skips a directory; git never shows an empty one), its
parents pinned; a refused write names direnv.

Which `.envrc` files: each writable root's own, and every one inside a root that direnv's
allow records name (`$XDG_DATA_HOME/direnv/allow`, each holding the allowed file's path).
Each is read as bash splits simple commands (`shlex`, line by line, `;`, `&&`, `||`, `|`
and `if`/`then` prefixes); an argument bash would expand (`$VAR`, `~`, a glob, a command
substitution) cannot be followed: the run is `partial` and says which. Not covered:
`PATH_add`, `layout`, `use` (directories of the project's own tools: what a command builds
there runs later, as `npm test` from a hook runs the project's own code).

Answers are kept per file while its stamps are unchanged (`kept_answers.py`).
"""

from __future__ import annotations

import os
import shlex
import stat
import time

from bash_sandbox.git_hook_chain import ChainLink
from bash_sandbox.kept_answers import KeptAnswers
from policies.paths import within_any

# direnv's loaders, and what each loads from a directory (None: nothing, it wants a file).
_LOADERS: dict[str, str | None] = {
    "source_env": ".envrc",
    "source_env_if_exists": ".envrc",
    "dotenv": None,
    "dotenv_if_exists": None,
    "source": None,
    ".": None,
}
_DOTENV_DEFAULT = ".env"
# Words that may stand before a command's name on a line.
_PREFIXES = frozenset({"if", "then", "else", "elif", "do", "while", "until", "{", "!", "time"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&"})
_EXPANDS = frozenset("$`*?[~")
_ENVRC_MAX = 1 << 16
_ALLOW_MAX = 4096  # allow records read (each is one small file)

# Per `.envrc`: (path or word, is the word unresolvable) pairs its loaders name.
_PARSED: KeptAnswers[str, tuple[tuple[str, bool], ...]] = KeptAnswers(limit=256)
_ALLOWED: KeptAnswers[str, tuple[str, ...]] = KeptAnswers(limit=8)


def envrc_chain(roots: tuple[str, ...]) -> list[ChainLink]:
    """The files the `.envrc` files direnv would run inside ``roots`` load, as chain links:
    covered when they can be, named in the run's partial when not."""
    envrcs = dict.fromkeys(os.path.join(root, ".envrc") for root in roots)
    envrcs.update(dict.fromkeys(p for p in _allowed() if within_any(p, roots)))
    found: dict[str, ChainLink] = {}
    for envrc in envrcs:
        shown = _shown(envrc, roots)
        for target, unresolved in _loads(envrc):
            if unresolved:
                why = f"direnv: {shown} loads {target}, which cannot be resolved before it runs"
                found.setdefault(why, ChainLink(envrc, False, why, covered=False))
                continue
            if within_any(os.path.realpath(target), roots):
                why = f"direnv loads it from {shown}"
                found.setdefault(target, ChainLink(target, True, why))
    return list(found.values())


def _shown(path: str, roots: tuple[str, ...]) -> str:
    root = next((r for r in roots if within_any(path, (r,))), None)
    return os.path.relpath(path, root) if root is not None else path


def _loads(envrc: str) -> tuple[tuple[str, bool], ...]:
    """(target, unresolved) for each file ``envrc``'s loaders name; () when it is not a
    regular file (a link is the protected name's own business: flagged there)."""
    try:
        st = os.lstat(envrc)
    except OSError:
        return ()
    if not stat.S_ISREG(st.st_mode):
        return ()
    known = _PARSED.get(envrc)
    if known is not None:
        return known
    asked = time.time_ns()
    try:
        with open(envrc, "rb") as fh:
            text = fh.read(_ENVRC_MAX).decode(errors="replace")
    except OSError:
        return ()
    answer = tuple(_targets(text, os.path.dirname(envrc)))
    _PARSED.keep(envrc, (envrc,), asked, answer)
    return answer


def _targets(text: str, base: str) -> list[tuple[str, bool]]:
    found: list[tuple[str, bool]] = []
    for words in _commands(text):
        loader = words[0]
        if loader not in _LOADERS:
            continue
        args = words[1:] or ([_DOTENV_DEFAULT] if loader.startswith("dotenv") else [])
        # `source FILE ARGS...` loads only FILE; direnv's loaders take one path each.
        for arg in args[:1] if loader in ("source", ".") else args:
            if _EXPANDS & set(arg):
                found.append((arg, True))
                continue
            path = os.path.normpath(os.path.join(base, arg))
            inner = _LOADERS[loader]
            if inner is not None and os.path.isdir(path) and not os.path.islink(path):
                # A directory's `.envrc` (the directory is pinned, never made read-only).
                path = os.path.join(path, inner)
            found.append((path, False))
    return found


def _commands(text: str) -> list[list[str]]:
    """Each simple command's words, line by line (a backslash joins lines); a line bash
    would read differently (an open quote) is skipped, and so are its loaders."""
    commands: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in _SEPARATORS:
                if words:
                    commands.append(words)
                words = []
            elif words or (token not in _PREFIXES and "=" not in token):
                words.append(token)
    return commands


def _allow_dir() -> str:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.join(data, "direnv", "allow")


def _allowed() -> tuple[str, ...]:
    """The paths direnv's allow records name (each record's content is its `.envrc`'s
    path), kept while the allow directory is unchanged."""
    allow = _allow_dir()
    known = _ALLOWED.get(allow)
    if known is not None:
        return known
    asked = time.time_ns()
    try:
        names = os.listdir(allow)[:_ALLOW_MAX]
    except OSError:
        names = []
    paths: list[str] = []
    for name in names:
        try:
            with open(os.path.join(allow, name), "rb") as fh:
                path = os.fsdecode(fh.read(4096).strip())
        except OSError:
            continue
        if path.startswith("/"):
            paths.append(path)
    answer = tuple(dict.fromkeys(paths))
    _ALLOWED.keep(allow, (allow,), asked, answer)
    return answer
