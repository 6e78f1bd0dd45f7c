"""A command's git writes without the executor: the host git directory overlaid in a private
mount namespace (as the sandbox mounts it), the import run on what landed in the upper
layer, and checks made with the host's own git from outside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bash_seam import GitImportOutcome

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@e",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@e",
}


def host_git(repo: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {args}: {done.stderr}")
    return done.stdout


def make_repo(path: Path, files: int = 1) -> Path:
    path.mkdir(parents=True)
    host_git(path, "init", "-q", "-b", "main")
    for i in range(files):
        (path / f"f{i}.txt").write_text(f"file {i}\n")
    host_git(path, "add", ".")
    host_git(path, "commit", "-qm", "start")
    return path


class Overlay:
    """One overlaid git directory with its state dir laid out as the executor's:
    ``state/git/1/{upper,work,import}``."""

    def __init__(
        self,
        repo: Path,
        state: Path,
        *,
        gitdir: Path | None = None,
        roots: list[str] | None = None,
        main_inside: bool | None = None,
    ) -> None:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("mounting an overlay needs root and unshare")
        self.repo = repo
        self.gitdir = str(gitdir or repo / ".git")  # another: a separate git dir
        self.state = state
        base = state / "git" / "1"
        self.upper = base / "upper"
        self.work = base / "work"
        self.upper.mkdir(parents=True)
        self.work.mkdir()
        from bash_sandbox.git_import import begin

        if roots is None:
            roots = [os.path.realpath(repo)]  # the repo is the root
        begin(self.gitdir, str(self.upper), roots, main_inside=main_inside)

    def run(self, script: str) -> str:
        """``script`` in the repository, its `.git` the overlay (host `.git` untouched)."""
        mount = (
            f"mount -t overlay overlay -o lowerdir={self.gitdir},upperdir={self.upper},"
            f"workdir={self.work} {self.gitdir}"
        )
        done = subprocess.run(
            ["unshare", "-m", "sh", "-ec", f"{mount}\ncd {self.repo}\n{script}"],
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def import_in_child(self, crash: str | None = None) -> int:
        """The import in a child process (a harness the crash hook can kill)."""
        code = (
            "import sys; from bash_sandbox.git_import import import_changes, load_snapshot\n"
            f"snap = load_snapshot({str(self.upper)!r})\n"
            "r = import_changes(snap)\n"
            "print(r.outcome.status.value if r.outcome else 'none')\n"
        )
        env = dict(os.environ)
        env.pop("BASH_SANDBOX_GIT_IMPORT_CRASH", None)
        if crash:
            env["BASH_SANDBOX_GIT_IMPORT_CRASH"] = crash
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=False
        )
        return done.returncode


def fsck_clean(repo: Path) -> None:
    done = subprocess.run(
        ["git", "fsck", "--full", "--no-dangling"],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def reachable(repo: Path, oid: str) -> bool:
    """Whether ``oid`` is reachable from some ref of ``repo`` (a branch or a keep-ref)."""
    refs = host_git(repo, "for-each-ref", "--format=%(objectname)").split()
    for ref in refs:
        done = subprocess.run(
            ["git", "merge-base", "--is-ancestor", oid, ref],
            cwd=repo,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0:
            return True
    return False


def commits_on_both_sides(ov: Overlay, repo: Path) -> tuple[str, str, GitImportOutcome | None]:
    """The command commits on `main` in the overlay, then the host commits on `main` too;
    the import runs. (the command's commit, the host's, the import's outcome)"""
    ov.run("echo sandbox >> f0.txt && git commit -qam sandbox")
    ours = (ov.upper / "refs" / "heads" / "main").read_text().strip()
    (repo / "host.txt").write_text("host\n")
    host_git(repo, "add", "host.txt")
    host_git(repo, "commit", "-qm", "host")
    theirs = host_git(repo, "rev-parse", "main").strip()
    from bash_sandbox.git_import import import_changes, load_snapshot

    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    return ours, theirs, import_changes(snap).outcome
