"""Files the host runs without being asked, protected by default in every writable root.

Editors, direnv, agent tools and shells run what these name when the user opens the
folder, enters it, starts a session or a shell: a command that writes one runs its code
later, outside the sandbox, with the user's full rights. So each is a default protected
name (read-only in every writable root, also while it does not exist yet), with the reason
a denial shows. `unprotected_paths` in the policy (or the executor's config) lifts one.

Shell start-up files are protected where they exist in a root, and also when missing only
in a root that is a home directory (elsewhere a missing `.bashrc` runs nothing); the rest
are protected whether or not they exist. A missing auto-run name is held by an empty
read-only *directory* placeholder, whatever its kind: git ignores empty directories, so
`git status` and `git add -A` in the workspace never see them (on the host either); the
command's own git also ignores them where it has an overlay (`host_view.py`). A shell
start-up file missing in a home is held by an empty file (bash reads it as nothing).
"""

from __future__ import annotations

import functools
import os
import pwd
import stat
from dataclasses import dataclass
from types import MappingProxyType

from policies.paths import within, within_set

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
        ".factory": "Factory's droid runs its hooks at session start and starts the MCP "
        "servers it names",
        ".openhands": "OpenHands runs its setup.sh at the start of every session",
        ".trae": "TRAE starts the MCP servers its mcp.json names",
        ".junie": "JetBrains Junie starts the MCP servers its mcp/mcp.json names",
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

# Other version control systems' repository configs: host tools (an IDE's `hg status` on
# open, the user's next `jj log`) run what they name. Held while missing only where their
# repository directory exists (`needs_placeholder`): a placeholder `.hg` would make every
# workspace look like a Mercurial repository.
VCS_CONFIG_PATHS: MappingProxyType[str, str] = MappingProxyType(
    {
        ".hg/hgrc": "Mercurial runs the hooks it names (an IDE's `hg status` on open)",
        ".hg/hgrc-not-shared": "Mercurial reads it with .hg/hgrc and runs the hooks it names",
        ".hg/requires": "Mercurial reads a shared repository's config through it (`shared` "
        "with .hg/sharedpath) and runs that config's hooks",
        ".hg/sharedpath": "Mercurial reads the config of the repository it names and runs "
        "its hooks",
        ".hgsub": "Mercurial opens the subrepositories it names, with their configs and "
        "extensions (`hg diff`, `hg summary`, `hg update`)",
        ".jj/repo/config.toml": "Jujutsu runs the pager, editors and tools it names",
        ".jj/repo": "a Jujutsu workspace's file naming the repository whose config it runs",
        ".jj/repo/config-id": "Jujutsu reads the repository's config through it",
        ".jj/workspace-config-id": "Jujutsu reads the workspace's config through it",
        ".jj/workspace-config.toml": "Jujutsu runs the pager, editors and tools it names "
        "(taken over where .jj/workspace-config-id is missing)",
        ".sl/config": "Sapling runs the hooks it names",
        ".sl/requires": "Sapling reads a shared repository's config through it",
        ".sl/sharedpath": "Sapling reads the config of the repository it names and runs its hooks",
    }
)
# Protected only as a file where one exists, never held while missing: a directory there is
# the repository itself, written by the tool (the main Jujutsu workspace's `.jj/repo`; a
# secondary workspace's is a file naming it), and jj makes its config ids itself.
# A name beside its repository's directory, held only where that exists.
_REPOSITORY_DIR = {".hgsub": ".hg"}
FILE_ONLY_PATHS = frozenset({".jj/repo", ".jj/repo/config-id", ".jj/workspace-config-id"})

# Files a tool runs once the user trusted them by path (mise's `[env] _.source`, hooks and
# tasks on entering the directory): a trusted one a command rewrites runs; a new one asks for
# trust first, so a missing one is not held (no placeholder in every workspace).
TRUSTED_CONFIG_PATHS: MappingProxyType[str, str] = MappingProxyType(
    {
        "mise.toml": "mise runs the env scripts and hooks of a trusted config on entering",
        ".mise.toml": "mise runs the env scripts and hooks of a trusted config on entering",
        "mise.local.toml": "mise runs the env scripts and hooks of a trusted config on entering",
        ".mise.local.toml": "mise runs the env scripts and hooks of a trusted config on entering",
        ".mise": "mise runs the env scripts and hooks of a trusted config on entering",
        ".config/mise": "mise runs the env scripts and hooks of a trusted config on entering",
    }
)

DEFAULT_AUTORUN_PATHS: tuple[str, ...] = (
    *AUTORUN_PATHS,
    *SHELL_RC_PATHS,
    *VCS_CONFIG_PATHS,
    *TRUSTED_CONFIG_PATHS,
)


@dataclass(frozen=True)
class HomePath:
    """A name in a home directory the host runs or obeys later: ``is_dir`` its kind,
    ``hold``: held by a placeholder while missing (else covered only where it exists)."""

    is_dir: bool
    hold: bool
    reason: str


_RUNS_ON_PATH = "its programs are on the user's PATH"
# A home's own environment: protected wherever a writable root holds it (a workspace that is
# the home, a root `~/.config` or `/home`), apart from the root itself. Broad entries cover
# a home root; the specific ones below them cover a root that is one of those directories.
HOME_PATHS: MappingProxyType[str, HomePath] = MappingProxyType(
    {
        ".config": HomePath(True, True, "programs read their settings and start-up entries "
                            "from it (git, direnv, systemd, editors, bash-sandbox itself)"),
        ".config/bash-sandbox": HomePath(True, True, "bash-sandbox reads its own "
                                         "configuration from it"),
        ".config/git": HomePath(True, True, "host git reads its config from it in every "
                                "repository"),
        ".config/direnv": HomePath(True, True, "direnv reads its whitelist and direnvrc "
                                   "from it"),
        ".config/systemd": HomePath(True, True, "systemd starts the user services it names"),
        ".config/autostart": HomePath(True, True, "the desktop session starts what it names"),
        ".config/environment.d": HomePath(True, True, "the user's session takes the "
                                          "variables it sets"),
        ".local": HomePath(True, True, "it holds programs on the user's PATH, Python's user "
                           "site-packages and direnv's allow records"),
        ".local/bin": HomePath(True, True, _RUNS_ON_PATH),
        ".local/lib": HomePath(True, True, "Python runs the .pth files of the user's "
                               "site-packages"),
        ".local/share": HomePath(True, True, "direnv's allow records, installed tools and "
                                 "desktop entries live in it"),
        ".local/state": HomePath(True, True, "agents keep their session logs in it"),
        ".cache": HomePath(True, True, "host tools reuse what their caches hold"),
        "bin": HomePath(True, True, "a login shell puts it on the user's PATH"),
        ".gitconfig": HomePath(False, True, "host git reads it in every repository"),
        ".bash_aliases": HomePath(False, True, "the user's .bashrc sources it"),
        ".bashrc.d": HomePath(True, True, "the user's .bashrc sources it"),
        ".pam_environment": HomePath(False, True, "the login sets the variables it names"),
        ".npmrc": HomePath(False, True, "npm takes the scripts' shell and options from it"),
        ".claude.json": HomePath(True, True, "Claude Code starts the MCP servers it names"),
        ".vimrc": HomePath(False, True, "vim runs it"),
        ".exrc": HomePath(False, True, "vim and ex run it where there is no .vimrc"),
        ".gvimrc": HomePath(False, True, "gvim runs it"),
        ".vim": HomePath(True, True, "vim runs its plugins"),
        ".emacs": HomePath(False, True, "Emacs runs it"),
        ".emacs.el": HomePath(False, True, "Emacs runs it"),
        ".emacs.d": HomePath(True, True, "Emacs runs its init files"),
        ".gdbinit": HomePath(False, True, "gdb runs it"),
        ".lldbinit": HomePath(False, True, "lldb runs it"),
        ".screenrc": HomePath(False, True, "screen runs the commands it names"),
        ".irbrc": HomePath(False, True, "irb runs it"),
        ".ghci": HomePath(False, True, "ghci runs it"),
        ".julia/config": HomePath(True, True, "Julia runs its startup.jl"),
        ".mavenrc": HomePath(False, True, "mvn sources it"),
        ".hgrc": HomePath(False, True, "Mercurial runs the hooks it names"),
        ".direnvrc": HomePath(False, True, "direnv sources it before every .envrc"),
        ".tmux.conf": HomePath(False, True, "tmux runs the commands it names"),
        ".pdbrc": HomePath(False, True, "pdb runs it"),
        ".psqlrc": HomePath(False, True, "psql runs its \\! commands"),
        ".sqliterc": HomePath(False, True, "sqlite3 runs its .shell commands"),
        ".inputrc": HomePath(False, True, "readline takes its key bindings"),
        ".curlrc": HomePath(False, True, "curl takes its options (output files)"),
        ".wgetrc": HomePath(False, True, "wget takes its options (output files)"),
        ".lessfilter": HomePath(False, True, "lesspipe runs it on every file less opens"),
        ".mailcap": HomePath(False, True, "programs open files with the commands it names"),
        ".selected_editor": HomePath(False, True, "sensible-editor runs the editor it names"),
        ".tcshrc": HomePath(False, True, "tcsh runs it"),
        ".kshrc": HomePath(False, True, "ksh runs it"),
        ".gemrc": HomePath(False, True, "gem takes its sources and options"),
        ".ipython": HomePath(True, True, "IPython runs its startup files"),
        ".jupyter": HomePath(True, True, "Jupyter runs its config files"),
        ".vscode-server": HomePath(True, False, "VS Code's remote server runs its extensions"),
        ".npm-global": HomePath(True, False, _RUNS_ON_PATH),
        ".bundle": HomePath(True, False, "bundler takes its config"),
        # Files a dotfiles manager links one by one (a link into a root is protected there).
        ".config/git/config": HomePath(False, False, "host git reads it in every repository"),
        ".config/git/ignore": HomePath(False, False, "host git reads it in every repository"),
        ".config/git/attributes": HomePath(False, False, "host git runs the filters it names"),
        ".config/direnv/direnvrc": HomePath(False, False, "direnv sources it"),
        ".config/direnv/direnv.toml": HomePath(False, False, "direnv's whitelist"),
        ".config/fish/config.fish": HomePath(False, False, "fish runs it"),
        ".config/nvim/init.lua": HomePath(False, False, "Neovim runs it"),
        ".config/nvim/init.vim": HomePath(False, False, "Neovim runs it"),
        ".ssh/config": HomePath(False, False, "ssh runs its ProxyCommand and Match exec"),
        ".ssh/rc": HomePath(False, False, "sshd runs it at every login"),
        ".ssh/authorized_keys": HomePath(False, False, "sshd lets in the keys it lists"),
        ".cargo/config.toml": HomePath(False, False, "cargo runs the wrappers and runners "
                                       "it names"),
        ".m2/settings.xml": HomePath(False, False, "Maven takes its repositories and "
                                     "profiles"),
        ".gnupg/gpg-agent.conf": HomePath(False, False, "gpg-agent runs the programs it "
                                          "names"),
        ".yarnrc": HomePath(False, True, "yarn runs the yarn-path it names"),
        ".yarnrc.yml": HomePath(False, True, "yarn runs the yarnPath it names"),
        ".condarc": HomePath(False, True, "conda installs from the channels it names"),
        ".pip": HomePath(True, False, "pip installs from the indexes its config names"),
        ".pydistutils.cfg": HomePath(False, True, "Python's build tools take options "
                                     "from it"),
        ".xinitrc": HomePath(False, True, "the X session runs it"),
        ".xprofile": HomePath(False, True, "the X session runs it"),
        ".xsession": HomePath(False, True, "the X session runs it"),
        ".xsessionrc": HomePath(False, True, "the X session runs it"),
        ".Xresources": HomePath(False, True, "the X session loads it (xterm's commands)"),
        ".xbindkeysrc": HomePath(False, True, "xbindkeys runs the commands it binds"),
        ".bash_completion": HomePath(False, True, "bash-completion sources it in every "
                                     "interactive shell"),
        ".perldb": HomePath(False, True, "perl -d runs it"),
        ".pryrc": HomePath(False, True, "pry runs it"),
        ".octaverc": HomePath(False, True, "Octave runs it"),
        ".sbclrc": HomePath(False, True, "SBCL runs it"),
        ".guile": HomePath(False, True, "Guile runs it"),
        ".muttrc": HomePath(False, True, "mutt runs the commands it names"),
        ".zcompdump": HomePath(False, False, "zsh's compinit sources it"),
        ".p10k.zsh": HomePath(False, False, "the user's .zshrc sources it"),
        ".fzf.bash": HomePath(False, False, "the user's .bashrc sources it"),
        ".fzf.zsh": HomePath(False, False, "the user's .zshrc sources it"),
        ".oh-my-zsh": HomePath(True, False, "the user's .zshrc sources its plugins"),
        "miniconda3": HomePath(True, False, _RUNS_ON_PATH),
        "anaconda3": HomePath(True, False, _RUNS_ON_PATH),
        "miniforge3": HomePath(True, False, _RUNS_ON_PATH),
        ".ghcup": HomePath(True, False, _RUNS_ON_PATH),
        ".krew": HomePath(True, False, _RUNS_ON_PATH),
        ".dotnet": HomePath(True, False, _RUNS_ON_PATH),
        ".opam": HomePath(True, False, "the user's shell sources its opam-init"),
        ".docker": HomePath(True, True, "docker runs the credential helpers its config "
                            "names"),
        ".kube": HomePath(True, True, "kubectl runs the exec plugins its config names"),
        ".aws": HomePath(True, True, "the AWS tools run the credential_process it names"),
        ".ssh": HomePath(True, True, "ssh runs its config's ProxyCommand, sshd lets in its "
                         "authorized_keys and runs its rc"),
        ".gnupg": HomePath(True, True, "gpg runs the programs its config names"),
        ".m2": HomePath(True, True, "Maven runs the plugins and extensions its settings and "
                        "repository hold"),
        ".gradle": HomePath(True, True, "Gradle runs its init scripts"),
        ".npm": HomePath(True, False, "npm installs what its cache holds"),
        ".cargo": HomePath(True, True, f"cargo runs what its config names and builds what "
                           f"its registry holds; {_RUNS_ON_PATH}"),
        ".rustup": HomePath(True, False, _RUNS_ON_PATH),
        ".pyenv": HomePath(True, False, _RUNS_ON_PATH),
        ".rbenv": HomePath(True, False, _RUNS_ON_PATH),
        ".nvm": HomePath(True, False, _RUNS_ON_PATH),
        ".volta": HomePath(True, False, _RUNS_ON_PATH),
        ".bun": HomePath(True, False, _RUNS_ON_PATH),
        ".deno": HomePath(True, False, _RUNS_ON_PATH),
        ".asdf": HomePath(True, False, _RUNS_ON_PATH),
        ".sdkman": HomePath(True, False, _RUNS_ON_PATH),
        "go": HomePath(True, True, f"{_RUNS_ON_PATH} (go install)"),
        ".terraformrc": HomePath(False, True, "Terraform installs the providers it names"),
        ".terraform.d": HomePath(True, True, "Terraform runs the provider plugins it holds"),
        ".mozilla": HomePath(True, True, "Firefox runs the extensions and user.js of its "
                             "profiles"),
        ".pki": HomePath(True, True, "Chromium and NSS tools trust the certificates its "
                         "nssdb holds"),
    }
)  # fmt: skip


_XDG = {
    "XDG_CONFIG_HOME": {
        n.removeprefix(".config/"): e
        for n, e in HOME_PATHS.items()
        if n.startswith(".config/") and e.hold
    },
    "XDG_DATA_HOME": {"direnv": HomePath(True, True, "direnv's allow records")},
}


Found = tuple[str, HomePath]
# home_paths' last answers, each with the lstat kind of every path it looked at: where no
# link was followed, the answer is that of those kinds (one lstat each to check, against the
# walk of every home name a spawn paid: 0.6 ms of a read-only `true`).
_KEPT: dict[tuple[object, ...], tuple[tuple[tuple[str, int | None], ...], tuple[Found, ...]]] = {}
_KEPT_MAX = 16


def home_paths(roots: tuple[str, ...], unprotected: tuple[str, ...] = ()) -> list[Found]:
    """The `HOME_PATHS` of every home (this user's and each account's) that lie inside one
    of ``roots`` (real paths), each with its entry; not a root itself, not one
    ``unprotected`` names (relative to its root, or to its home)."""
    home = os.path.expanduser("~")
    key = (
        roots,
        unprotected,
        home,
        os.path.realpath(home),
        *(os.environ.get(v) for v in _XDG),
    )
    kept = _KEPT.get(key)
    if kept is not None and all(_kind(path, {}) == kind for path, kind in kept[0]):
        return list(kept[1])
    kinds: dict[str, int | None] = {}
    found, followed = _home_paths(roots, unprotected, kinds)
    if not followed:
        if len(_KEPT) >= _KEPT_MAX:
            _KEPT.pop(next(iter(_KEPT)))
        _KEPT[key] = (tuple(kinds.items()), tuple(found))
    return found


def _home_paths(
    roots: tuple[str, ...], unprotected: tuple[str, ...], kinds: dict[str, int | None]
) -> tuple[list[Found], bool]:
    """`home_paths`, the kinds it looked up in ``kinds``, and whether it followed a link
    (its answer then depends on where the link leads, not only on kinds)."""
    followed = False
    found: dict[str, HomePath] = {}
    for home in _homes(os.path.expanduser("~")):
        for root in roots:
            if not (within(home, root) or within(root, home)):
                continue  # most roots: a project somewhere, nothing of a home's own
            for name, entry in HOME_PATHS.items():
                path = os.path.join(home, name)
                if path == root or not within(path, root):
                    continue
                if name in unprotected or os.path.relpath(path, root) in unprotected:
                    continue
                found.setdefault(path, entry)
    # Where the environment says a home's settings live (`XDG_CONFIG_HOME` outside
    # `~/.config`: bash-sandbox's own config there, git's; direnv's allow records).
    for variable, names in _XDG.items():
        base = os.environ.get(variable)
        if not base or not os.path.isabs(base):
            continue
        for name, entry in names.items():
            path = os.path.normpath(os.path.join(base, name))
            if any(within(path, r) and path != r for r in roots):
                found.setdefault(path, entry)
    # A name of a home whose path leads through a link into a root (a dotfiles manager's
    # layout: `~/.bash_aliases -> ~/dotfiles/bash/.bash_aliases`, or stow's folded tree
    # `~/.ssh -> dotfiles/ssh` for `.ssh/config`, the workspace `~/dotfiles`): what the
    # host reads through it lies in the root, and is protected there (a red team's). This
    # user's home for every root (dotfiles kept anywhere); each account's home, as above,
    # where it holds a root or lies in one (root's executor, a workspace in alice's home).
    linked = {**HOME_PATHS, **{n: HomePath(False, False, r) for n, r in SHELL_RC_PATHS.items()}}
    own = os.path.realpath(os.path.expanduser("~"))
    # The account's own home too where HOME says otherwise (a harness's temporary HOME):
    # ssh and sshd read the account's (a red team's stow links there were not followed).
    owned = {own, *_account_home()}
    for home in sorted({*_homes(os.path.expanduser("~")), *owned}):
        if home not in owned and not any(within(home, r) or within(r, home) for r in roots):
            continue  # a service account's home: a lstat of each name there, every spawn
        if _kind(home, kinds) != stat.S_IFDIR:
            continue  # `/nonexistent`
        for name, entry in linked.items():
            if not _through_link(home, name, kinds):
                continue
            followed = True
            target = os.path.realpath(os.path.join(home, name))
            if target in roots or not any(within(target, r) for r in roots):
                continue
            if (
                name in unprotected
                or os.path.relpath(target, _root_of(target, roots)) in unprotected
            ):
                continue
            shown = f"~/{name}" if home == own else os.path.join(home, name)
            why = f"{entry.reason} ({shown} links here)"
            found.setdefault(target, HomePath(entry.is_dir, True, why))
            # A link on the way that lies in a root (`dotfiles/ssh -> ssh-real`) can be
            # re-pointed by a command in one rename: named, so the run says it cannot be
            # covered (a link is no mount point), as a protected name that is a link is.
            for link in _links_on_way(os.path.join(home, name)):
                if any(within(link, r) and link != r for r in roots):
                    found.setdefault(link, HomePath(entry.is_dir, True, why))
    # Below a broad entry that is always covered (`.config` in a home root): covered with it.
    # (Its ancestors looked up: each name against each held one was 8 ms of a home's spawn.)
    held = {p for p, e in found.items() if e.hold}
    return [(p, e) for p, e in found.items() if not within_set(os.path.dirname(p), held)], followed


@functools.cache
def _account_home() -> tuple[str, ...]:
    """The real path of this uid's home as its passwd entry names it (none: no entry)."""
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return ()
    return (os.path.realpath(home),) if home not in ("", "/") else ()


def _links_on_way(path: str, limit: int = 40) -> list[str]:
    """Every symbolic link resolving ``path`` goes through, in order (as `realpath` walks
    it; at most ``limit``): the links whose re-pointing changes where it leads."""
    found: list[str] = []
    pending = [p for p in path.split("/") if p]
    current = "/"
    while pending and len(found) < limit:
        part = pending.pop(0)
        if part in (".", ""):
            continue
        candidate = os.path.dirname(current) if part == ".." else os.path.join(current, part)
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            return found  # missing from here on: nothing more to follow
        if not is_link:
            current = candidate
            continue
        found.append(candidate)
        try:
            value = os.readlink(candidate)
        except OSError:
            return found
        if value.startswith("/"):
            current = "/"
        pending[:0] = [p for p in value.split("/") if p]
    return found


def _kind(path: str, kinds: dict[str, int | None]) -> int | None:
    """The lstat kind of ``path`` (None: missing), asked once per `home_paths` call: the
    names of a home share their first components (`.config`, `.local`)."""
    if path not in kinds:
        try:
            kinds[path] = stat.S_IFMT(os.lstat(path).st_mode)
        except OSError:
            kinds[path] = None
    return kinds[path]


def _through_link(home: str, name: str, kinds: dict[str, int | None]) -> bool:
    """Whether ``home``/``name`` is a link or leads through one below ``home``."""
    path = home
    for part in name.split("/"):
        path = os.path.join(path, part)
        kind = _kind(path, kinds)
        if kind == stat.S_IFLNK:
            return True
        if kind != stat.S_IFDIR:
            return False  # missing, or a file: nothing below it
    return False


def _root_of(path: str, roots: tuple[str, ...]) -> str:
    return next(r for r in roots if within(path, r))


UNPROTECT_KEY = "unprotected_paths"


def autorun_reason(name: str) -> str | None:
    """Why ``name`` (a protected name) is protected by default, if it is an auto-run name."""
    return (
        AUTORUN_PATHS.get(name)
        or SHELL_RC_PATHS.get(name)
        or VCS_CONFIG_PATHS.get(name)
        or TRUSTED_CONFIG_PATHS.get(name)
    )


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
    a shell start-up file only in a home directory (see the module docstring), another
    version control system's config only in its repository, a config trusted by path never.
    ``real_root``: ``root`` resolved, where the caller has it (once a spawn, not per name)."""
    if name in TRUSTED_CONFIG_PATHS or name in FILE_ONLY_PATHS:
        return False
    if name in VCS_CONFIG_PATHS:
        # Only in a repository: its directory a real one (one lstat, kept with the kinds).
        first = name.split("/", maxsplit=1)[0]
        top = os.path.join(root, _REPOSITORY_DIR.get(first, first))
        try:
            return stat.S_ISDIR(os.lstat(top).st_mode)
        except OSError:
            return False
    if name not in SHELL_RC_PATHS:
        return True
    return (real_root or os.path.realpath(root)) in _homes(os.path.expanduser("~"))


def directory_placeholder(name: str) -> bool:
    """Whether a missing ``name`` is held by a directory even when it names a file: an
    auto-run name (git shows no empty directory, to the host's git either: an empty file
    placeholder got committed by the user's `git add -A` while a command ran). Not a shell
    start-up file, held in a home only: bash reads an empty file as nothing, and a
    directory there made every login shell complain."""
    return name in AUTORUN_PATHS or name in VCS_CONFIG_PATHS or name == ".config/fish"


def protected_label(name: str) -> str:
    """The reason a refused write to protected ``name`` reports: an auto-run name says what
    runs it and which key lifts it."""
    why = autorun_reason(name)
    if why is None:
        return f"protected name {name}"
    return f"protected name {name}: {why}; {UNPROTECT_KEY} lifts it"
