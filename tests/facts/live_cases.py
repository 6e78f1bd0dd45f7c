"""The labelled live corpus: real commands, and the denials and hints their results carry.

Each case runs through the real `SandboxBashExecutor` (see `test_live_corpus.py`) in a fresh
layout made by the test::

    ROOT/ws/              the workspace (the only writable root in workspace-write)
    ROOT/ws/locked        mode 000: refused by ordinary permissions (inside the workspace)
    ROOT/outside/         outside every writable root
    ROOT/outside/secret.txt, ROOT/outside/secrets/key     in deny_read

Commands and paths use placeholders the test fills in: ``{ws}``, ``{outside}``, ``{py}``
(the base interpreter: standard library only), ``{venv_py}`` (the interpreter with pytest),
``{port}`` (a host TCP listener nothing in the sandbox can reach) and ``{nameserver}`` (each
of the host's resolvers, as the supervisor names them). A label is the set of
``(kind, target)`` pairs of denials, with the evidence where only one source can see it, the
hints (what the output or the host points at, without evidence: printed text never makes a
denial, so until the supervisor sees write-intent opens every file refusal a tool prints is
a hint, and ``denied`` stays false for it), plus the result's flags; ``shows`` pins the
premise (the tool really printed that dialect), and ``absent``/``unchanged``/``serves`` say
what the test checks on the host afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Serves = Literal["unix-stream", "unix-dgram", "tcp"]
Stream = Literal["stdout", "stderr"]


Fact = Literal["denial", "hint"]


@dataclass(frozen=True)
class Expected:
    """One denial the result must list, or one hint (what the output or the host points at:
    printed text never makes a denial). A relative hint target is as the tool printed it."""

    kind: str
    target: str
    evidence: str | None = None  # None: whichever source saw it (denials only)
    fact: Fact = "denial"
    # A hint's denials (shell patterns) once the supervisor witnesses write intent
    # (`tests.facts.evidence.WRITE_INTENT_WITNESSED`); the hint then goes, unless it `stays`
    # (the witnessed path is another one than the tool printed).
    witnessed: tuple[str, ...] = ()
    stays: bool = False


def _hint(kind: str, target: str, *witnessed: str, stays: bool = False) -> Expected:
    return Expected(kind, target, fact="hint", witnessed=witnessed, stays=stays)


@dataclass(frozen=True)
class LiveCase:
    name: str
    mode: Literal["read-only", "workspace-write"]
    command: str
    expected: tuple[Expected, ...] = ()
    denied: bool = False
    network_denied: bool = False
    exit_zero: bool = False  # the premise: how the command ends
    # Any one of these (stream, text) pairs shows the tool printed the dialect in question.
    shows: tuple[tuple[Stream, str], ...] = ()
    setup: str = ""  # run by the host in ROOT/ws before the command
    files: tuple[tuple[str, str], ...] = ()  # (path under ROOT, text) written before setup
    serves: Serves | None = None  # a host server at {outside}/host.sock or on {port}
    absent: tuple[str, ...] = ()  # host paths that must not exist afterwards
    unchanged: tuple[str, ...] = ()  # host paths whose content must be what it was
    tool: str = "bash"  # the program the case needs on PATH
    optional: bool = False  # a tool this host may lack (the case is then skipped)


GIT_REPO = (
    "git init -q -b main . && echo a > a && git add a && git commit -qm one"
    " && git init -q --bare {outside}/remote.git && git remote add origin {outside}/remote.git"
)

PYTEST_OUTSIDE = """\
from pathlib import Path


def test_writes_the_report():
    Path("{outside}/report.txt").write_text("ok")
"""

PYTEST_INSIDE = """\
from pathlib import Path


def test_reads_the_fixture():
    assert Path("locked").read_text() == "L"
"""

CARGO_TOML = '[package]\nname = "report"\nversion = "0.1.0"\nedition = "2021"\n'
CARGO_TEST = """\
#[cfg(test)]
mod tests {
    #[test]
    fn writes_the_report() {
        let path = "{outside}/report-rs.txt";
        if let Err(e) = std::fs::write(path, "ok") {
            panic!("cannot write {path}: {e}");
        }
    }
}
"""

GO_MOD = "module report\n\ngo 1.20\n"
GO_TEST = """\
package report

import (
\t"os"
\t"testing"
)

func TestWritesTheReport(t *testing.T) {
\tif err := os.WriteFile("{outside}/report-go.txt", []byte("ok"), 0o644); err != nil {
\t\tt.Fatal(err)
\t}
}
"""

_WRITE = "file-write"
_READ = "file-read"

DENIALS: tuple[LiveCase, ...] = (
    LiveCase(
        "ro-bash-write-outside",
        "read-only",
        "echo x > {outside}/ro.txt",
        (_hint(_WRITE, "{outside}/ro.txt", "{outside}/ro.txt"),),
        shows=(("stderr", "Read-only file system"),),
        absent=("{outside}/ro.txt",),
    ),
    LiveCase(
        "ro-bash-write-workspace",
        "read-only",
        "echo x > note.txt",
        (_hint(_WRITE, "note.txt", "{ws}/note.txt"),),
        absent=("{ws}/note.txt",),
    ),
    LiveCase(
        "ww-bash-write-outside",
        "workspace-write",
        "echo x > {outside}/ww.txt",
        (_hint(_WRITE, "{outside}/ww.txt", "{outside}/ww.txt"),),
        absent=("{outside}/ww.txt",),
    ),
    LiveCase(
        "ww-mkdir-relative-outside",
        "workspace-write",
        "mkdir ../outside/build",
        (_hint(_WRITE, "../outside/build", "{outside}/build"),),
        shows=(("stderr", "cannot create directory"),),
        absent=("{outside}/build",),
    ),
    LiveCase(
        "ww-python-write-outside",
        "workspace-write",
        "{py} -c \"open('{outside}/py.txt', 'w')\"",
        (_hint(_WRITE, "{outside}/py.txt", "{outside}/py.txt"),),
        shows=(("stderr", "[Errno 30] Read-only file system"),),
        absent=("{outside}/py.txt",),
        tool="python3",
    ),
    LiveCase(
        "ww-node-erofs-outside",
        "workspace-write",
        "node -e \"require('fs').writeFileSync('{outside}/n.txt', 'x')\"",
        (_hint(_WRITE, "{outside}/n.txt", "{outside}/n.txt"),),
        shows=(("stderr", "EROFS: read-only file system, open '{outside}/n.txt'"),),
        absent=("{outside}/n.txt",),
        tool="node",
    ),
    LiveCase(
        "ro-node-eacces-deny-read",
        "read-only",
        "node -e \"process.stdout.write(require('fs').readFileSync('{outside}/secret.txt'))\"",
        (_hint(_READ, "{outside}/secret.txt"),),
        shows=(("stderr", "EACCES: permission denied, open '{outside}/secret.txt'"),),
        tool="node",
    ),
    LiveCase(
        "ww-node-eacces-mkdir-deny-read",
        "workspace-write",
        "node -e \"require('fs').mkdirSync('{outside}/secrets/d')\"",
        (_hint(_WRITE, "{outside}/secrets/d", "{outside}/secrets/d"),),
        shows=(("stderr", "EACCES: permission denied, mkdir '{outside}/secrets/d'"),),
        absent=("{outside}/secrets/d",),
        tool="node",
    ),
    LiveCase(
        "ro-cat-deny-read",
        "read-only",
        "cat {outside}/secret.txt",
        (_hint(_READ, "{outside}/secret.txt"),),
        shows=(("stderr", "Permission denied"),),
    ),
    LiveCase(
        "ww-pytest-write-outside-on-stdout",
        "workspace-write",
        "{venv_py} -m pytest -q -p no:cacheprovider test_report.py",
        (_hint(_WRITE, "{outside}/report.txt", "{outside}/report.txt"),),
        shows=(("stdout", "[Errno 30] Read-only file system: '{outside}/report.txt'"),),
        files=(("ws/test_report.py", PYTEST_OUTSIDE),),
        absent=("{outside}/report.txt",),
        tool="python3",
    ),
    LiveCase(
        "ww-cargo-test-write-outside-on-stdout",
        "workspace-write",
        "cargo test -q --offline",
        (
            # cargo also locks its own package cache in the read-only home.
            _hint(_WRITE, "{outside}/report-rs.txt", "{outside}/report-rs.txt", "*/.cargo/.*"),
        ),
        shows=(("stdout", "Read-only file system (os error 30)"),),
        files=(("ws/Cargo.toml", CARGO_TOML), ("ws/src/lib.rs", CARGO_TEST)),
        absent=("{outside}/report-rs.txt",),
        tool="cargo",
        optional=True,
    ),
    LiveCase(
        "ww-go-test-write-outside-on-stdout",
        "workspace-write",
        "go test ./...",
        (_hint(_WRITE, "{outside}/report-go.txt", "{outside}/report-go.txt"),),
        shows=(("stdout", "read-only file system"),),
        files=(("ws/go.mod", GO_MOD), ("ws/report_test.go", GO_TEST)),
        absent=("{outside}/report-go.txt",),
        tool="go",
        optional=True,
    ),
    LiveCase(
        "ww-npm-view-resolver-refused",
        "workspace-write",
        "npm view left-pad version",
        (
            Expected("network-resolve", "{nameserver}", "supervisor"),
            _hint("network-resolve", "registry.npmjs.org"),
        ),
        network_denied=True,
        shows=(("stderr", "EAI_AGAIN"), ("stderr", "ENOTFOUND")),
        tool="npm",
    ),
    LiveCase(
        "ww-git-push-outside",
        "workspace-write",
        "git push origin HEAD:main",
        (
            # receive-pack's refused temporary directory has a random name.
            _hint(
                _WRITE,
                "{outside}/remote.git",
                "{outside}/remote.git/objects/tmp_objdir-incoming-*",
                stays=True,
            ),
        ),
        shows=(("stderr", "remote unpack failed"),),
        setup=GIT_REPO,
        unchanged=("{outside}/remote.git",),
        tool="git",
    ),
    LiveCase(
        "ro-socket-vsock",
        "read-only",
        "{py} -c 'import socket; socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)'",
        (Expected("socket", "AF_VSOCK type 1", "supervisor"),),
        denied=True,
        tool="python3",
    ),
    LiveCase(
        "ro-socket-unix-datagram",
        "read-only",
        "{py} -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)"
        '.sendto(b"x", "{outside}/host.sock")\'',
        (Expected("socket", "AF_UNIX type 2", "supervisor"),),
        denied=True,
        serves="unix-dgram",
        tool="python3",
    ),
    LiveCase(
        "ro-socket-host-unix-stream",
        "read-only",
        "{py} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{outside}/host.sock\")'",
        (Expected("socket", "{outside}/host.sock", "supervisor"),),
        denied=True,
        serves="unix-stream",
        tool="python3",
    ),
    LiveCase(
        "ww-curl-host-unix-stream",
        "workspace-write",
        "curl -sS --max-time 3 --unix-socket {outside}/host.sock http://localhost/",
        (Expected("socket", "{outside}/host.sock", "supervisor"),),
        denied=True,
        serves="unix-stream",
        tool="curl",
    ),
    LiveCase(
        # Exit 0 with a lost write: .git/config is covered read-only, git's rename of
        # config.lock over it fails (EBUSY), git says so and still exits 0. The supervisor
        # sees the rename onto the covered name (a hint read from the output before).
        "ww-git-branch-track-exit-0",
        "workspace-write",
        "git branch --track feature main",
        (Expected(_WRITE, "{ws}/.git/config", "supervisor"),),
        exit_zero=True,
        shows=(("stderr", "could not write config file .git/config"),),
        setup=GIT_REPO,
        unchanged=("{ws}/.git/config",),
        tool="git",
    ),
    LiveCase(
        "ww-git-config-refused",
        "workspace-write",
        "git config user.name Someone",
        (Expected(_WRITE, "{ws}/.git/config", "supervisor"),),
        denied=True,
        setup=GIT_REPO,
        unchanged=("{ws}/.git/config",),
        tool="git",
    ),
    LiveCase(
        # Exit 0 and not a word on stderr: only the overlay's copy-back knows.
        "ww-git-info-exclude-exit-0",
        "workspace-write",
        "echo build/ >> .git/info/exclude",
        (Expected(_WRITE, "{ws}/.git/info/exclude", "overlay"),),
        exit_zero=True,
        setup=GIT_REPO,
        unchanged=("{ws}/.git/info/exclude",),
        tool="git",
    ),
    LiveCase(
        "ww-git-config-worktree-exit-0",
        "workspace-write",
        "git config --file .git/config.worktree core.hooksPath hooks",
        (Expected(_WRITE, "{ws}/.git/config.worktree", "overlay"),),
        exit_zero=True,
        setup=GIT_REPO,
        absent=("{ws}/.git/config.worktree",),
        tool="git",
    ),
)

HINTS_AND_GROUPS: tuple[LiveCase, ...] = (
    LiveCase(
        # The exact forgery: a path the policy refuses, printed by the command itself.
        "ro-forged-erofs-line-is-a-hint",
        "read-only",
        "echo 'bash: /etc/x: Read-only file system' >&2; exit 1",
        (_hint(_WRITE, "/etc/x"),),
        shows=(("stderr", "bash: /etc/x: Read-only file system"),),
        absent=("/etc/x",),
    ),
    LiveCase(
        # After `cd`, bash names the file relative to sub/: never joined to the start.
        "ro-cd-then-relative-write",
        "read-only",
        "cd sub && echo x > rel.txt",
        (_hint(_WRITE, "rel.txt", "{ws}/sub/rel.txt"),),
        shows=(("stderr", "rel.txt: Read-only file system"),),
        setup="mkdir sub",
        absent=("{ws}/sub/rel.txt", "{ws}/rel.txt"),
    ),
    LiveCase(
        # Exit 0 and not a word: the write into a submodule's hooks lands in the overlay and
        # is discarded; only the copy-back knows.
        "ww-git-submodule-hook-exit-0",
        "workspace-write",
        "echo evil > .git/modules/sm/hooks/pre-commit",
        (Expected(_WRITE, "{ws}/.git/modules/sm/hooks/pre-commit", "overlay"),),
        exit_zero=True,
        setup=GIT_REPO
        + " && git init -q -b main {outside}/subsrc"
        + " && git -C {outside}/subsrc commit -q --allow-empty -m s"
        + " && git -c protocol.file.allow=always submodule -q add {outside}/subsrc sm"
        + " && git commit -qm sm",
        absent=("{ws}/.git/modules/sm/hooks/pre-commit",),
        tool="git",
    ),
    LiveCase(
        # The host serves {port} on its loopback; the sandbox's own loopback refuses.
        "ww-curl-loopback-the-host-serves",
        "workspace-write",
        "curl -sS --max-time 3 http://127.0.0.1:{port}/",
        (_hint("network-connect", "127.0.0.1:{port}"),),
        shows=(("stderr", "127.0.0.1 port {port}"),),
        serves="tcp",
        tool="curl",
    ),
    LiveCase(
        # Nothing listens on the sandbox's own loopback; the host does on that port. Python
        # prints no address: the supervisor's record of the refused connect names it.
        "ww-python-loopback-the-host-serves",
        "workspace-write",
        "{py} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3)'",
        (_hint("network-connect", "127.0.0.1:{port}"),),
        shows=(("stderr", "Connection refused"),),
        serves="tcp",
        tool="python3",
    ),
    LiveCase(
        # The supervisor saw the resolver refused; the output names what was looked up.
        "ww-curl-resolve-names-the-host",
        "workspace-write",
        "curl -sS --max-time 5 https://example.com/",
        (
            Expected("network-resolve", "{nameserver}", "supervisor"),
            _hint("network-resolve", "example.com"),
        ),
        network_denied=True,
        shows=(("stderr", "Could not resolve host: example.com"),),
        tool="curl",
    ),
)

LOOK_ALIKES: tuple[LiveCase, ...] = (
    LiveCase(
        "ro-system-exit-permission-denied",
        "read-only",
        "{py} -c 'raise SystemExit(\"Permission denied\")'",
        shows=(("stderr", "Permission denied"),),
        tool="python3",
    ),
    LiveCase(
        "ww-forged-read-only-inside-workspace",
        "workspace-write",
        'echo "x: Read-only file system" >&2; exit 1',
        shows=(("stderr", "x: Read-only file system"),),
    ),
    LiveCase(
        # The sandbox has no capabilities (CapEff 0, also as root), so mode 000 refuses.
        "ww-unix-permissions-inside-workspace",
        "workspace-write",
        "cat locked; echo more >> locked",
        shows=(("stderr", "locked: Permission denied"),),
        unchanged=("{ws}/locked",),
    ),
    LiveCase(
        "ww-pytest-unix-permissions-inside-workspace",
        "workspace-write",
        "{venv_py} -m pytest -q -p no:cacheprovider test_fixture.py",
        shows=(("stdout", "[Errno 13] Permission denied: 'locked'"),),
        files=(("ws/test_fixture.py", PYTEST_INSIDE),),
        tool="python3",
    ),
    LiveCase(
        "ro-success-prints-permission-denied",
        "read-only",
        'echo "Permission denied"; ls locked-dir 2>&1; echo done',
        exit_zero=True,
        shows=(("stdout", "cannot open directory 'locked-dir': Permission denied"),),
        setup="mkdir locked-dir && chmod 000 locked-dir",
    ),
    LiveCase(
        "ro-missing-file-outside",
        "read-only",
        "cat {outside}/missing.txt",
        shows=(("stderr", "No such file or directory"),),
    ),
)

LIVE_CASES = DENIALS + HINTS_AND_GROUPS + LOOK_ALIKES
