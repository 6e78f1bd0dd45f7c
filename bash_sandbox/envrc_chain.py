"""What an allowed `.envrc` loads: the workspace files direnv runs on the user's next `cd`.

`.envrc` is a protected name, and direnv runs only an `.envrc` the user allowed (its allow
record is named by a hash of the file's path and content). But an allowed one commonly loads
other files through direnv's own directives, and direnv hashes only the `.envrc`:
`source_env` and `source_env_if_exists` (a file, or a directory's `.envrc`), `source_up` and
`source_up_if_exists` (the first `.envrc`, or the named file, in a directory above), and
`dotenv` and `dotenv_if_exists` (a dotenv file, `.env` by default: its `LD_PRELOAD` runs code
in every later host command). A command that writes one of those runs its code in the
user's next shell that enters the directory. So each is covered read-only like the hook
chain (`git_hook_chain.py`): an existing one where it lies, a missing one held by an empty
file placeholder while its directory exists (`cp .env.example .env` is then refused on
`.env` itself; nothing is made where the directory is missing: the run is `partial` and
says so), its parents pinned; a refused write names direnv and `unprotected_paths`, which
lifts it. A loaded `.envrc` is read in turn (bounded); `source_up` holds the name in every
directory above.

Which `.envrc` files: every one inside a root that direnv would run as it is now (the allow
record its hash names exists; `$XDG_DATA_HOME/direnv/allow`), and the `exact` entries of
direnv's whitelist (trusted whatever they hold: covered themselves). A root under a
whitelist `prefix` runs every `.envrc` in it unasked: the run is `partial`. Without direnv
(no allow records) nothing here applies.

Each file is read line by line as bash splits simple commands (`shlex`: `;`, `&&`, `||`,
`|`, and `if`/`then`/`builtin`/`command` prefixes). What this reading cannot follow makes the
run `partial` and says which, never silently `full`: a loader's argument bash would expand
(`$VAR`, `~`, a glob), or a line that names a loader but holds a substitution, a
here-document, an open quote (a string over several lines) or a continuation. Not covered:
bash's own `source`/`.`/`eval`, `PATH_add`, `layout`, `use` (the project's own scripts and
tool directories, `.venv/bin/activate` among them: what a command builds there runs later,
as `npm test` from a hook runs the project's own code).

Answers are kept per file while its stamps are unchanged (`kept_answers.py`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import time

from bash_sandbox.git_hook_chain import ChainLink
from bash_sandbox.kept_answers import KeptAnswers
from bash_sandbox.safe_read import read_regular
from policies.autorun import UNPROTECT_KEY
from policies.paths import within, within_any

# direnv's loaders, and what each loads from a directory (None: nothing, it wants a file).
_LOADERS: dict[str, str | None] = {
    "source_env": ".envrc",
    "source_env_if_exists": ".envrc",
    "dotenv": None,
    "dotenv_if_exists": None,
}
_UP_LOADERS = frozenset({"source_up", "source_up_if_exists"})
_SHELL_LOADERS = frozenset({"source_env", "source_env_if_exists", *_UP_LOADERS})
_DOTENV_DEFAULT = ".env"
_ENVRC = ".envrc"
# Words that may stand before a command's name on a line.
_PREFIXES = frozenset(
    {"if", "then", "else", "elif", "do", "while", "until", "{", "!", "time", "builtin", "command"}
)
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&"})
_EXPANDS = frozenset("$`*?[~<>")
# Constructs that load or run what this reading cannot see.
_OPAQUE = ("$(", "`", "<(", ">(", "<<")
_NAMES = (*_LOADERS, *_UP_LOADERS)
_ENVRC_MAX = 1 << 16
_ALLOW_MAX = 4096  # allow records read (each is one small file)
_DEPTH, _FILES = 4, 64  # how far loaded shell files are followed

# Per file: (path or word, is the word unresolvable) pairs its loaders name, and the shell
# files among them (read in turn), as (path, base directory of its relative names).
_Parsed = tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, str], ...]]
_PARSED: KeptAnswers[tuple[str, str], _Parsed] = KeptAnswers(limit=256)
_ALLOWED: KeptAnswers[str, tuple[str, ...]] = KeptAnswers(limit=8)
_WHITELIST: KeptAnswers[str, tuple[tuple[str, ...], tuple[str, ...]]] = KeptAnswers(limit=8)


def envrc_chain(roots: tuple[str, ...], unprotected: tuple[str, ...] = ()) -> list[ChainLink]:
    """The files the `.envrc` files direnv would run inside ``roots`` load, as chain links:
    covered when they can be, named in the run's partial when not. ``unprotected``: names
    relative to a root that the policy lifts (`unprotected_paths`)."""
    found: dict[str, ChainLink] = {}
    prefixes, exact = _whitelist()
    for prefix in prefixes:
        if any(within(r, prefix) or within(prefix, r) for r in roots):
            why = f"direnv's whitelist prefix {prefix} runs every .envrc in it, unasked"
            found.setdefault(why, ChainLink(prefix, False, why, covered=False))
    lifted = {os.path.normpath(os.path.join(r, n)) for r in roots for n in unprotected}
    # Only what direnv runs: an `.envrc` allowed as it is now (its record's name is the hash
    # of its path and content), and the whitelist's exact entries. One above a root counts
    # too: direnv runs it in the root's directories (none of their own, or `source_up`), and
    # what it loads from inside the root is the command's to write (a red team's monorepo).
    envrcs = dict.fromkeys(
        p
        for p in _allowed()
        if (within_any(p, roots) or _above_a_root(os.path.dirname(p), roots)) and _allowed_now(p)
    )
    for path in exact:
        if within_any(path, roots) and path not in lifted:
            # Trusted whatever it holds: the file itself is covered like what it loads.
            why = f"direnv's whitelist runs it, whatever it holds; {UNPROTECT_KEY} lifts it"
            found.setdefault(path, ChainLink(path, False, why))
            envrcs[path] = None
    queue = [(envrc, os.path.dirname(envrc), envrc, 0) for envrc in envrcs]
    seen: set[str] = set()
    while queue and len(seen) < _FILES:
        path, base, origin, depth = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        shown = _shown(origin, roots)
        targets, shells = _loads(path, base)
        for target, unresolved in targets:
            if unresolved:
                why = f"direnv: {shown} loads {target}, which cannot be followed before it runs"
                found.setdefault(why, ChainLink(origin, False, why, covered=False))
                continue
            if target in lifted or not within_any(os.path.realpath(target), roots):
                continue
            if not os.path.lexists(target) and not os.path.isdir(os.path.dirname(target)):
                # Nothing is made on the host for it (a placeholder's parents would be new
                # directories the user's tools then find: `.venv/bin`).
                why = (
                    f"direnv: {shown} loads {_shown(target, roots)}, in a directory that does "
                    "not exist yet (a command could make both)"
                )
                found.setdefault(why, ChainLink(target, False, why, covered=False))
                continue
            why = f"direnv loads it from {shown}; {UNPROTECT_KEY} lifts it"
            found.setdefault(target, ChainLink(target, False, why))
        if depth < _DEPTH:
            queue += [(shell, shell_base, origin, depth + 1) for shell, shell_base in shells]
        elif shells:
            # Not followed further: what they load is not covered, and the run says so.
            why = f"direnv: {shown} loads files more than {_DEPTH} levels deep, not followed"
            found.setdefault(why, ChainLink(origin, False, why, covered=False))
    if queue:
        why = f"direnv: the .envrc files load more than {_FILES} files; the rest not followed"
        found.setdefault(why, ChainLink(queue[0][2], False, why, covered=False))
    return list(found.values())


def _allowed_now(envrc: str) -> bool:
    """Whether direnv would run ``envrc`` as it is: its allow record is named by the SHA-256
    of its absolute path, a newline and its content (direnv's `fileHash`)."""
    try:
        content = read_regular(envrc, _ENVRC_MAX + 1)
    except OSError:
        return False
    if len(content) > _ENVRC_MAX:
        return False
    digest = hashlib.sha256(os.fsencode(envrc) + b"\n" + content).hexdigest()
    return os.path.exists(os.path.join(_allow_dir(), digest))


def _above_a_root(directory: str, roots: tuple[str, ...]) -> bool:
    return any(within(r, directory) for r in roots)


def _shown(path: str, roots: tuple[str, ...]) -> str:
    root = next((r for r in roots if within(path, r)), None)
    return os.path.relpath(path, root) if root is not None else path


def _loads(path: str, base: str) -> _Parsed:
    """What the shell file at ``path`` loads (relative names from ``base``); nothing when it
    is not a regular file (a link is the protected name's own business: flagged there)."""
    try:
        st = os.lstat(path)
    except OSError:
        return (), ()
    if not stat.S_ISREG(st.st_mode):
        return (), ()
    key = (path, base)
    known = _PARSED.get(key)
    if known is not None:
        return known
    asked = time.time_ns()
    try:
        text = read_regular(path, _ENVRC_MAX).decode(errors="replace")
    except OSError:
        return (), ()
    answer = _targets(text, base, os.path.dirname(path))
    _PARSED.keep(key, (path,), asked, answer)
    return answer


def _targets(text: str, base: str, here: str) -> _Parsed:
    """(targets, shell files to read next) of one file's text. ``base``: where its relative
    names lead (bash's working directory); ``here``: the file's own directory (direnv's
    `source_up` starts above the `.envrc` it runs in)."""
    found: list[tuple[str, bool]] = []
    shells: list[tuple[str, str]] = []
    for words, unread in _commands(text):
        if unread is not None:
            found.append((unread, True))
            continue
        loader = words[0]
        if loader in _UP_LOADERS:
            name = words[1] if len(words) > 1 else _ENVRC
            if _EXPANDS & set(name) or "/" in name:
                found.append((name, True))
                continue
            above = os.path.dirname(here)
            while True:
                found.append((os.path.join(above, name), False))
                shells.append((os.path.join(above, name), above))
                if above == "/":
                    break
                above = os.path.dirname(above)
            continue
        if loader not in _LOADERS:
            continue
        args = words[1:] or ([_DOTENV_DEFAULT] if loader.startswith("dotenv") else [])
        for arg in args:
            if _EXPANDS & set(arg):
                found.append((arg, True))
                continue
            path = os.path.normpath(os.path.join(base, arg))
            inner = _LOADERS[loader]
            if inner is not None and os.path.isdir(path) and not os.path.islink(path):
                # A directory's `.envrc` (the directory is pinned, never made read-only).
                path = os.path.join(path, inner)
            found.append((path, False))
            if loader in _SHELL_LOADERS:
                shells.append((path, os.path.dirname(path)))  # run from its own directory
    return tuple(found), tuple(shells)


def _commands(text: str) -> list[tuple[list[str], str | None]]:
    """Each simple command's words, physical line by physical line; a line that mentions a
    loader but cannot be read as bash would (an open quote, a continuation, a
    substitution, a here-document) gives ``([], why)`` instead."""
    commands: list[tuple[list[str], str | None]] = []
    for line in text.splitlines():
        mentions = any(name in line for name in _NAMES)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            if mentions:
                commands.append(([], f"a line bash reads past its end ({line.strip()[:60]!r})"))
            continue
        code = " ".join(tokens)
        if mentions and any(o in line for o in _OPAQUE) and any(n in code for n in _NAMES):
            commands.append(([], f"a substitution ({line.strip()[:60]!r})"))
            continue
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in _SEPARATORS:
                if words:
                    commands.append((words, None))
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


def _whitelist() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """direnv's `[whitelist]` (`prefix`, `exact`) from its config, as direnv reads it
    (TOML); ((), ()) without one."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    files = tuple(os.path.join(config, "direnv", n) for n in ("direnv.toml", "config.toml"))
    key = "\0".join(files)
    known = _WHITELIST.get(key)
    if known is not None:
        return known
    asked = time.time_ns()
    prefixes: list[str] = []
    exact: list[str] = []
    for path in files:
        if not os.path.exists(path):
            continue
        import tomllib  # only where direnv is configured: the CLI's cold path never loads it

        try:
            with open(path, "rb") as fh:
                table = tomllib.load(fh).get("whitelist", {})
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if not isinstance(table, dict):
            continue
        for value, into in ((table.get("prefix"), prefixes), (table.get("exact"), exact)):
            if isinstance(value, list):
                into += [os.path.expanduser(v) for v in value if isinstance(v, str)]
        break  # direnv reads the first one it finds
    exact = [os.path.join(p, _ENVRC) if os.path.isdir(p) else p for p in exact]
    answer = (
        tuple(p for p in prefixes if p.startswith("/")),
        tuple(e for e in exact if e[:1] == "/"),
    )
    _WHITELIST.keep(key, files, asked, answer)
    return answer
