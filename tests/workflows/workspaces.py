"""Realistic workspaces for the workflow suite, and the outside checks run after each test.

Builders write a project the way a developer would have it on disk (a Python package with
its own venv, a Node project with `node_modules`, a C project with a Makefile, a git
repository), all on the host and before any sandbox runs, so the host view afterwards can be
compared with the view before: `WorkspaceAudit` says which paths appeared, vanished or
changed, and the test names the ones its commands were meant to write.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bash_seam import BashProcess, BashRunResult

# git identity for commits made on the host while building fixtures (never the user's).
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Workflow Fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "Workflow Fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


@dataclass(frozen=True)
class Entry:
    """What one path is, as far as "did a command change it" goes."""

    kind: str  # "dir" | "file" | "link" | "other"
    size: int
    mtime_ns: int
    target: str | None = None


def snapshot(root: Path) -> dict[str, Entry]:
    """Every path below ``root`` (relative, `/`-separated) with its kind, size and mtime."""
    found: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = Entry("link", 0, 0, os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = Entry("dir", 0, 0)
            elif os.path.isfile(path):
                found[rel] = Entry("file", st.st_size, st.st_mtime_ns)
            else:
                found[rel] = Entry("other", 0, 0)
    return found


class WorkspaceAudit:
    """The host view of a workspace before the commands, compared with the view after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before = snapshot(root)

    def unexpected_changes(self, expected: Iterable[str] = ()) -> list[str]:
        """Paths that appeared, vanished or changed and match none of the ``expected``
        globs (`*` spans directories). Mount points a sandbox left behind (an empty `.git`,
        an empty `.env`) show up here as created paths."""
        patterns = list(expected)
        after = snapshot(self.root)
        changes: list[str] = []
        for rel, entry in after.items():
            old = self.before.get(rel)
            if old is None:
                kind = (
                    "empty dir"
                    if entry.kind == "dir" and not os.listdir(self.root / rel)
                    else entry.kind
                )
                change = f"created {rel} ({kind})"
            elif old != entry and entry.kind != "dir":
                change = f"changed {rel}"
            else:
                continue
            if not any(fnmatch.fnmatchcase(rel, p) for p in patterns):
                changes.append(change)
        for rel in self.before:
            if rel not in after and not any(fnmatch.fnmatchcase(rel, p) for p in patterns):
                changes.append(f"removed {rel}")
        return sorted(changes)


def host_tree_digest(path: Path) -> dict[str, tuple[int, int]]:
    """A host directory's files (size, mtime), e.g. `~/.npm`: to prove it was not touched."""
    if not path.exists():
        return {}
    return {rel: (entry.size, entry.mtime_ns) for rel, entry in snapshot(path).items()} | {
        ".": (0, path.stat().st_mtime_ns)
    }


# -- Python ----------------------------------------------------------------------------------

PY_PACKAGE = '''"""A tiny package under test."""


def add(a: int, b: int) -> int:
    return a + b
'''

PY_TESTS = """import subprocess
import sys

from calc import add


def test_add():
    assert add(2, 3) == 5


def test_tmp_path_is_writable(tmp_path):
    (tmp_path / "scratch.txt").write_text("ok")
    assert (tmp_path / "scratch.txt").read_text() == "ok"


def test_subprocess_runs():
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert out.stdout == "42\\n"
"""

MULTIPROCESSING_CHECK = """import concurrent.futures
import multiprocessing


def square(x):
    return x * x


if __name__ == "__main__":
    with multiprocessing.Pool(2) as pool:
        assert pool.map(square, range(5)) == [0, 1, 4, 9, 16]
    queue = multiprocessing.Queue()
    queue.put("item")
    assert queue.get(timeout=20) == "item"
    lock = multiprocessing.Lock()
    with lock:
        pass
    with concurrent.futures.ProcessPoolExecutor(2) as executor:
        assert list(executor.map(square, range(3))) == [0, 1, 4]
    print("multiprocessing ok")
"""


def make_venv(root: Path) -> Path:
    """A venv at ``root/.venv`` that sees this test run's packages (pytest, pip) through a
    `.pth` file: no network, no copy, and its own `sys.prefix` to install into."""
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    (site / "outer-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def build_python_project(root: Path) -> None:
    (root / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "0.1.0"\n')
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text(PY_PACKAGE)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(PY_TESTS)
    (root / "mp_check.py").write_text(MULTIPROCESSING_CHECK)
    make_venv(root)


def build_wheel(directory: Path, name: str = "tinywheel", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, written as the zip the wheel spec describes."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"GREETING = 'hello from a wheel'\n",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        ),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: workflow-fixture\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


# -- Node ------------------------------------------------------------------------------------


def npm_host(args: list[str], cwd: Path, cache: Path) -> None:
    """npm on the host for fixtures, with a throw-away cache: `~/.npm` is never touched."""
    subprocess.run(
        ["npm", *args, "--cache", str(cache), "--offline", "--no-audit", "--no-fund"],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=120,
    )


def pack_node_package(directory: Path, cache: Path, name: str, greeting: str) -> Path:
    """`npm pack` of a one-file package; returns the tarball."""
    source = directory / f"src-{name}"
    source.mkdir()
    (source / "package.json").write_text(
        f'{{"name": "{name}", "version": "1.0.0", "main": "index.js"}}\n'
    )
    (source / "index.js").write_text(f"exports.greet = (who) => `{greeting}, ${{who}}`;\n")
    npm_host(["pack", "--pack-destination", str(directory)], source, cache)
    return directory / f"{name}-1.0.0.tgz"


def build_node_project(root: Path, tarball: Path, cache: Path) -> None:
    (root / "package.json").write_text(
        '{"name": "app", "version": "1.0.0", "private": true,\n'
        ' "scripts": {"test": "node test.js"}}\n'
    )
    (root / "test.js").write_text(
        "const { greet } = require('tiny-greet');\n"
        "if (greet('test') !== 'hello, test') process.exit(1);\n"
        "console.log('node test ok');\n"
    )
    npm_host(["install", str(tarball)], root, cache)


# -- C ---------------------------------------------------------------------------------------


def build_c_project(root: Path) -> None:
    (root / "main.c").write_text(
        '#include <stdio.h>\nint main(void) { puts("hello from c"); return 0; }\n'
    )
    (root / "Makefile").write_text("hello: main.c\n\t$(CC) -O1 -o $@ main.c\n")


# -- Rust, Go, CMake, a web page ------------------------------------------------------------


def build_rust_project(root: Path) -> None:
    """A binary crate with a unit test and no dependencies (so it builds offline), with its
    lock file as `cargo` writes it (format 3: read by every cargo since 1.53)."""
    (root / "src").mkdir()
    (root / "Cargo.toml").write_text(
        '[package]\nname = "hello"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n'
    )
    (root / "Cargo.lock").write_text(
        "# This file is automatically @generated by Cargo.\n"
        "# It is not intended for manual editing.\nversion = 3\n\n"
        '[[package]]\nname = "hello"\nversion = "0.1.0"\n'
    )
    (root / "src" / "main.rs").write_text(
        "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\n"
        'fn main() {\n    println!("hello from rust {}", add(2, 3));\n}\n\n'
        "#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n"
        "        assert_eq!(super::add(2, 3), 5);\n    }\n}\n"
    )


def build_go_project(root: Path) -> None:
    """A Go module with a test and no dependencies."""
    (root / "go.mod").write_text("module example.com/hello\n\ngo 1.19\n")
    (root / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc Add(a, b int) int { return a + b }\n\n'
        'func main() { fmt.Println("hello from go", Add(2, 3)) }\n'
    )
    (root / "main_test.go").write_text(
        'package main\n\nimport "testing"\n\n'
        'func TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatal("Add")\n\t}\n}\n'
    )


def build_cmake_project(root: Path) -> None:
    """A C program built with CMake, with one CTest test that runs it."""
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(hello C)\n"
        "add_executable(hello hello.c)\nenable_testing()\nadd_test(NAME runs COMMAND hello)\n"
    )
    (root / "hello.c").write_text(
        '#include <stdio.h>\nint main(void) { puts("hello from cmake"); return 0; }\n'
    )


# What the page's script writes: in the DOM only when a browser ran it.
PAGE_RENDERED = "rendered by the page's script"


def build_web_page(root: Path) -> None:
    """A page whose heading its own script rewrites (a browser that ran it shows the new text)."""
    (root / "index.html").write_text(
        '<!doctype html><html><head><title>demo</title></head><body><h1 id="t">static</h1>'
        f'<script>document.getElementById("t").textContent = "{PAGE_RENDERED}";</script>'
        "</body></html>\n"
    )


# -- git -------------------------------------------------------------------------------------


def git_host(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, **GIT_ENV),
        timeout=60,
    )
    return done.stdout


def build_git_repository(root: Path) -> None:
    """A repository with history on `main` and a `topic` branch to rebase."""
    git_host(root, "init", "-q", "-b", "main")
    # The identity lives in the repo config, so commands inside can commit as usual.
    git_host(root, "config", "user.name", "Workflow Agent")
    git_host(root, "config", "user.email", "agent@example.invalid")
    (root / "README.md").write_text("# demo\n")
    git_host(root, "add", "README.md")
    git_host(root, "commit", "-qm", "initial")
    git_host(root, "switch", "-qc", "topic")
    (root / "topic.txt").write_text("topic work\n")
    git_host(root, "add", "topic.txt")
    git_host(root, "commit", "-qm", "topic work")
    git_host(root, "switch", "-q", "main")
    (root / "main.txt").write_text("main work\n")
    git_host(root, "add", "main.txt")
    git_host(root, "commit", "-qm", "main work")


def remove_tree(path: Path) -> None:
    """Delete a test's project tree, also directories a command left without write access."""
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def have(*tools: str) -> bool:
    return all(shutil.which(tool) for tool in tools)


# Shell after `cache=$(...)`: the tool's cache dir can be made and written (tools create it
# lazily), and its path is printed for the host-side check.
CACHE_IS_WRITABLE = 'mkdir -p "$cache" && test -w "$cache" && echo "cache=$cache"'


def free_host_port() -> int:
    """A loopback port free on the host now (a server started in the sandbox takes it in
    the executor's own network namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_server(url: str, seconds: int = 60) -> str:
    """Shell that waits, from inside, until ``url`` answers: bounded by time, not by a
    count of tries (on a loaded machine a server's start and each `curl` are slow), each
    try bounded too; exits 97 saying so when the server never answered."""
    return (
        f"end=$((SECONDS + {seconds})); "
        f"until curl -sf --max-time 5 -o /dev/null {url}; do "
        "[ $SECONDS -lt $end ] || { echo 'the server never answered' >&2; exit 97; }; "
        "sleep 0.05; done"
    )


def describe_process(process: BashProcess) -> str:
    """A background command's state and output tail, for an assertion message."""
    out = process.read_output().delta[-400:]
    return f"; the server: {process.status}, exit {process.exit_code}, output {out!r}"


def describe(result: BashRunResult) -> str:
    """A failed run in one line for the assertion message: status and the first error line."""
    lines = [line.strip() for line in result.stderr.text.splitlines() if line.strip()]
    noise = ("Traceback", "File ", "^", "warnings.warn")
    first = next((line for line in lines if not line.startswith(noise)), "")
    last = lines[-1] if lines else ""
    facts = result.sandbox
    denied = f", denied={facts.denied}, network_denied={facts.network_denied}" if facts else ""
    return (
        f"exit={result.exit_code} signal={result.signal} timed_out={result.timed_out}{denied}; "
        f"first stderr line: {first!r}; last: {last!r}; stdout tail: {result.stdout.text[-300:]!r}"
    )
