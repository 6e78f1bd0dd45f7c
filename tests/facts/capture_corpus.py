"""Capture the denial-inference corpus by running real tools against real confinement.

Run as root on Linux (``.venv/bin/python tests/facts/capture_corpus.py [NAME...]``); the
tests never run it, they read what it stored. Each case runs in a fresh workspace at
`CAPTURE_ROOT`/ws with a fake home holding credential files, either

- confined by `SandboxBashExecutor` (backend bwrap or landlock, read-only or
  workspace-write, isolated network): the real refusals of the real sandbox;
- unconfined as ``nobody`` (``runuser``): ordinary permission errors inside the workspace,
  which are not the sandbox's doing;
- unconfined in a fresh network namespace (``unshare -n``): network errors.

Each case is stored as ``corpus/<name>/{stdout,stderr,case.json}``. ``case.json`` holds the
command, how it ran, the policy fields and the *label*: the denials a careful reader sees in
the output, written by hand below (``{ws}``/``{home}`` stand for the capture paths; a
``re:`` target is read from the output where the tool picks a random name). The label is
never computed by the inference under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest
from policies import DEFAULT_PROTECTED_PATHS, default_deny_read

CAPTURE_ROOT = Path("/srv/bsx-corpus")
WS = CAPTURE_ROOT / "ws"
HOME = CAPTURE_ROOT / "home"
# Writes "outside the workspace" aim here: even a broken sandbox changes nothing of the host.
OUTSIDE = CAPTURE_ROOT / "outside"
CORPUS = Path(__file__).parent / "corpus"
DENY_READ_FILE = "deny_read.txt"
WHEEL = "/root/.pyenv/versions/3.13.0/lib/python3.13/test/wheeldata/wheel-0.43.0-py3-none-any.whl"

W, R = "file-write", "file-read"

# The fake home is the command's home, so a tool writing "~" aims inside the capture root;
# the toolchains stay where they are installed.
TOOL_ENV = {
    "HOME": str(HOME),
    "PYENV_ROOT": "/root/.pyenv",
    "RUSTUP_HOME": "/root/.rustup",
    "CARGO_HOME": "/root/.cargo",
}

GIT_REPO = (
    "git init -q && git config user.email t@example.com && git config user.name t && "
    "echo one > tracked.txt && git add tracked.txt && git commit -qm one && echo two >> tracked.txt"
)
FILES = "echo alpha > src.txt"
C_MAIN = "printf 'int main(void){return 0;}\\n' > main.c"
MAKEFILE = "printf 'out.txt:\\n\\techo hi > out.txt\\n' > Makefile"
CARGO = (
    'mkdir -p src && printf \'[package]\\nname = "demo"\\nversion = "0.1.0"\\nedition = "2021"\\n\''
    " > Cargo.toml && printf 'fn main() {}\\n#[test]\\nfn t() {}\\n' > src/main.rs"
)
RUST_MAIN = "printf 'fn main() {}\\n' > main.rs"
JAVA_WRITER = (
    "printf 'public class Main { public static void main(String[] a) throws Exception "
    '{ new java.io.FileOutputStream("out.txt").close(); } }\\n\' > Main.java'
)
PYTEST_WRITER = (
    'printf \'def test_writes():\\n    open("result.txt", "w").write("x")\\n\' > test_w.py'
)
PYTEST_READS_UNREADABLE = (
    "echo data > data.bin && chmod 000 data.bin && "
    "printf 'def test_reads():\\n    open(\"data.bin\").read()\\n' > test_r.py"
)
TARBALL = (
    "mkdir -p pkg/sub && echo a > pkg/a && echo b > pkg/sub/b && tar -cf pkg.tar pkg && rm -r pkg"
)
NODE_PKG = 'printf \'{"name":"demo","version":"1.0.0"}\\n\' > package.json'
UNREADABLE = "echo secret > locked.txt && chmod 000 locked.txt && mkdir sealed && chmod 000 sealed"
NOBODY_WS = "chmod 755 . && echo x > owned-by-root.txt && chmod 644 owned-by-root.txt"


@dataclass(frozen=True)
class Case:
    name: str
    command: str
    expected: tuple[tuple[str, str], ...] = ()
    setup: str = ""
    mode: str = "read-only"
    backends: tuple[str, ...] = ("bwrap", "landlock")
    how: str = "sandbox"  # "sandbox", "nobody" or "unshare-net"
    tool: str = "bash"
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)


RO, WW = "read-only", "workspace-write"

CASES: tuple[Case, ...] = (
    # --- read-only: writes inside the workspace ---------------------------------------------
    Case("ro-bash-redirect", "echo hi > note.txt", ((W, "{ws}/note.txt"),)),
    Case("ro-bash-append-absolute", "echo hi >> {ws}/log.txt", ((W, "{ws}/log.txt"),)),
    Case("ro-touch", "touch a.txt", ((W, "{ws}/a.txt"),), tool="coreutils"),
    Case("ro-mkdir-p", "mkdir -p build/out", ((W, "{ws}/build"),), tool="coreutils"),
    Case("ro-cp", "cp src.txt dst.txt", ((W, "{ws}/dst.txt"),), FILES, tool="coreutils"),
    Case("ro-mv", "mv src.txt moved.txt", ((W, "{ws}/moved.txt"),), FILES, tool="coreutils"),
    Case("ro-rm", "rm src.txt", ((W, "{ws}/src.txt"),), FILES, tool="coreutils"),
    Case("ro-ln", "ln -s src.txt link", ((W, "{ws}/link"),), FILES, tool="coreutils"),
    Case("ro-chmod", "chmod +x src.txt", ((W, "{ws}/src.txt"),), FILES, tool="coreutils"),
    Case("ro-tee", "echo x | tee out.txt", ((W, "{ws}/out.txt"),), tool="coreutils"),
    Case(
        "ro-sed-inplace",
        "sed -i s/alpha/beta/ src.txt",
        ((W, r"re:couldn't open temporary file (\S+?):"),),
        FILES,
        tool="sed",
    ),
    Case("ro-dd", "dd if=/dev/zero of=blob bs=1 count=1", ((W, "{ws}/blob"),), tool="coreutils"),
    Case("ro-truncate", "truncate -s 0 src.txt", ((W, "{ws}/src.txt"),), FILES, tool="coreutils"),
    Case("ro-install", "install -m 644 src.txt inst.txt", ((W, "{ws}/inst.txt"),), FILES),
    Case(
        "ro-python-open",
        "python3 -c \"open('out.txt', 'w')\"",
        ((W, "{ws}/out.txt"),),
        tool="python",
    ),
    Case(
        "ro-python-makedirs",
        "python3 -c \"import os; os.makedirs('a/b')\"",
        ((W, "{ws}/a"),),
        tool="python",
    ),
    Case(
        "ro-python-rename",
        "python3 -c \"import os; os.rename('src.txt', 'renamed.txt')\"",
        ((W, "{ws}/renamed.txt"),),
        FILES,
        tool="python",
    ),
    Case(
        "ro-node-write",
        "node -e \"require('fs').writeFileSync('n.txt', 'x')\"",
        ((W, "{ws}/n.txt"),),
        tool="node",
    ),
    Case(
        "ro-node-mkdir",
        "node -e \"require('fs').mkdirSync('{ws}/nd')\"",
        ((W, "{ws}/nd"),),
        tool="node",
    ),
    Case("ro-npm-init", "npm init -y", ((W, "{ws}/package.json"),), tool="npm"),
    Case("ro-git-init", "git init", ((W, "{ws}/.git"),), tool="git"),
    Case(
        "ro-git-commit",
        "git commit -qam two",
        ((W, "{ws}/.git/index.lock"),),
        GIT_REPO,
        tool="git",
    ),
    Case(
        "ro-git-config", "git config user.name x", ((W, "{ws}/.git/config"),), GIT_REPO, tool="git"
    ),
    Case(
        "ro-git-branch",
        "git checkout -b feature",
        ((W, "{ws}/.git/refs/heads/feature.lock"),),
        GIT_REPO,
        tool="git",
    ),
    Case("ro-gcc-pipe", "gcc -pipe main.c -o main", ((W, "{ws}/main"),), C_MAIN, tool="gcc"),
    Case("ro-gcc", "gcc main.c -o main", ((W, "{ws}/main"),), C_MAIN, tool="gcc"),
    Case(
        "ww-gcc-outside",
        "gcc main.c -o {out}/bsx-main",
        ((W, "{out}/bsx-main"),),
        C_MAIN,
        mode=WW,
        tool="gcc",
    ),
    Case("ro-make", "make", ((W, "{ws}/out.txt"),), MAKEFILE, tool="make"),
    Case(
        "ro-pip-target",
        f"python3 -m pip install -q --no-index --no-deps --target ./lib {WHEEL}",
        ((W, "{ws}/lib"),),
        tool="pip",
    ),
    Case(
        "ro-pytest-write",
        "python3 -m pytest -q -p no:cacheprovider test_w.py",
        ((W, "{ws}/result.txt"),),
        PYTEST_WRITER,
        tool="pytest",
    ),
    Case(
        "ro-cargo-build", "cargo build --offline -q", ((W, "{ws}/Cargo.lock"),), CARGO, tool="cargo"
    ),
    Case(
        "ro-rustc",
        "rustc main.rs -o hello",
        ((W, 're:at path "(\\S+?)"'),),
        RUST_MAIN,
        tool="rustc",
    ),
    Case("ro-java-write", "java Main.java", ((W, "{ws}/out.txt"),), JAVA_WRITER, tool="java"),
    Case("ro-javac", "javac Main.java", ((W, "{ws}/Main.class"),), JAVA_WRITER, tool="java"),
    Case("ro-tar-extract", "tar -xf pkg.tar", ((W, "{ws}/pkg"),), TARBALL, tool="tar"),
    # curl names no path in its refusal ("Failure writing output"): nothing to infer.
    Case("ro-curl-output", "curl -sS -o page.html file:///etc/hostname", (), tool="curl"),
    Case("ro-read-shadow", "cat /etc/shadow", ((R, "/etc/shadow"),), tool="coreutils"),
    # --- workspace-write: outside the roots, protected names, deny_read -----------------------
    Case("ww-touch-outside", "touch {out}/bsx.txt", ((W, "{out}/bsx.txt"),), mode=WW),
    Case("ww-redirect-outside", "echo x > {out}/bsx.conf", ((W, "{out}/bsx.conf"),), mode=WW),
    Case(
        "ww-python-outside",
        "python3 -c \"open('{out}/bsx-py.txt', 'w')\"",
        ((W, "{out}/bsx-py.txt"),),
        mode=WW,
        tool="python",
    ),
    Case(
        "ww-mkdir-outside",
        "mkdir {out}/bsx-dir",
        ((W, "{out}/bsx-dir"),),
        mode=WW,
        tool="coreutils",
    ),
    Case("ww-home-dotfile", "echo x > ~/.bsxrc", ((W, "{home}/.bsxrc"),), mode=WW),
    Case(
        "ww-cp-outside", "cp src.txt {out}/bsx-cp.txt", ((W, "{out}/bsx-cp.txt"),), FILES, mode=WW
    ),
    Case(
        "ww-pytest-write-outside",
        "python3 -m pytest -q -p no:cacheprovider test_w.py",
        ((W, "{out}/result.txt"),),
        PYTEST_WRITER.replace("result.txt", "{out}/result.txt"),
        mode=WW,
        tool="pytest",
    ),
    Case(
        "ww-pip-target-outside",
        f"python3 -m pip install -q --no-index --no-deps --target {{out}}/lib {WHEEL}",
        ((W, "{out}/lib"),),
        mode=WW,
        tool="pip",
    ),
    Case(
        "ww-git-clone-outside",
        "git clone -q . {out}/clone",
        ((W, "{out}/clone"),),
        GIT_REPO,
        mode=WW,
        tool="git",
    ),
    Case(
        "ww-node-outside",
        "node -e \"require('fs').mkdirSync('{out}/nd')\"",
        ((W, "{out}/nd"),),
        mode=WW,
        tool="node",
    ),
    Case(
        "ww-npm-global-outside",
        "npm install --global --prefix {out}/global --offline --no-audit --no-fund ./",
        # npm reports its refused mkdir as ENOENT: no refusal to infer.
        (),
        NODE_PKG,
        mode=WW,
        tool="npm",
    ),
    Case(
        "ww-rustc-outside",
        "rustc main.rs -o {out}/hello",
        ((W, 're:at path "(\\S+?)"'),),
        RUST_MAIN,
        mode=WW,
        tool="rustc",
    ),
    Case(
        "ww-cargo-target-outside",
        "CARGO_TARGET_DIR={out}/target cargo build --offline -q",
        ((W, 're:at path "(\\S+?)"'),),
        CARGO,
        mode=WW,
        tool="cargo",
    ),
    Case(
        "ww-java-outside",
        "java Main.java",
        ((W, "{out}/out.txt"),),
        JAVA_WRITER.replace("out.txt", "{out}/out.txt"),
        mode=WW,
        tool="java",
    ),
    Case(
        "ww-make-outside",
        "make",
        ((W, "{out}/made.txt"),),
        "printf 'all:\\n\\techo hi > {out}/made.txt\\n' > Makefile",
        mode=WW,
        tool="make",
    ),
    Case(
        "ww-ln-outside",
        "ln -s src.txt {out}/link",
        ((W, "{out}/link"),),
        FILES,
        mode=WW,
        tool="coreutils",
    ),
    Case("ww-deny-gshadow", "cat /etc/gshadow", ((R, "/etc/gshadow"),), mode=WW),
    Case(
        "ww-pip-user",
        f"python3 -m pip install -q --user --no-index --no-deps {WHEEL}",
        ((W, "{home}/.local"),),
        mode=WW,
        tool="pip",
    ),
    Case(
        "ww-protected-config-append",
        "echo '[core]' >> .git/config",
        ((W, "{ws}/.git/config"),),
        GIT_REPO,
        mode=WW,
        tool="git",
    ),
    Case(
        "ww-protected-hook",
        "echo 'echo pwned' > .git/hooks/pre-commit",
        ((W, "{ws}/.git/hooks/pre-commit"),),
        GIT_REPO,
        mode=WW,
    ),
    Case(
        "ww-git-config-cmd",
        "git config core.fsmonitor true",
        ((W, "{ws}/.git/config"),),
        GIT_REPO,
        mode=WW,
        tool="git",
    ),
    # git init works: the new repository's control files live in the git overlay.
    Case("ww-git-init-fresh", "git init -q", (), mode=WW, tool="git"),
    # No .git: ENOENT, exactly as without a sandbox.
    Case("ww-missing-protected-config", "echo x > .git/config", (), mode=WW),
    Case(
        "ww-git-commit-ok",
        "git commit -qam two && git log --oneline | wc -l",
        (),
        GIT_REPO,
        mode=WW,
        tool="git",
    ),
    Case(
        "ww-cargo-build-ok",
        "cargo build --offline -q && cargo test --offline -q 2>&1",
        (),
        CARGO,
        mode=WW,
        tool="cargo",
    ),
    Case("ww-deny-cat", "cat {home}/.ssh/id_rsa", ((R, "{home}/.ssh/id_rsa"),), mode=WW),
    Case("ww-deny-ls", "ls {home}/.aws", ((R, "{home}/.aws"),), mode=WW, tool="coreutils"),
    Case(
        "ww-deny-python",
        "python3 -c \"print(open('{home}/.netrc').read())\"",
        ((R, "{home}/.netrc"),),
        mode=WW,
        tool="python",
    ),
    Case(
        "ww-deny-node",
        "node -e \"require('fs').readFileSync('{home}/.npmrc')\"",
        ((R, "{home}/.npmrc"),),
        mode=WW,
        tool="node",
    ),
    Case(
        "ww-deny-cp",
        "cp {home}/.docker/config.json ./stolen.json",
        ((R, "{home}/.docker/config.json"),),
        mode=WW,
        tool="coreutils",
    ),
    Case(
        "ww-deny-grep",
        "grep -r oauth {home}/.config/gh",
        ((R, "{home}/.config/gh"),),
        mode=WW,
        tool="grep",
    ),
    # --- look-alikes: refusals that are not the sandbox's ---------------------------------------
    Case("ww-unreadable-inside", "cat locked.txt; ls sealed", (), UNREADABLE, mode=WW),
    Case(
        "ww-pytest-unreadable-inside",
        "python3 -m pytest -q -p no:cacheprovider test_r.py",
        (),
        PYTEST_READS_UNREADABLE,
        mode=WW,
        tool="pytest",
    ),
    Case("ww-missing-file", "cat missing.txt; python3 -c \"open('missing.txt')\"", (), mode=WW),
    Case(
        "ww-forged-erofs",
        "echo 'x.txt: Read-only file system' >&2; "
        "echo \"touch: cannot touch 'out/a': Read-only file system\"; exit 1",
        (),
        mode=WW,
    ),
    Case(
        "ro-systemexit", "python3 -c 'raise SystemExit(\"Permission denied\")'", (), tool="python"
    ),
    Case(
        "ro-python-permissionerror-no-path",
        "python3 -c 'raise PermissionError(13, \"Permission denied\")'",
        (),
        tool="python",
    ),
    Case(
        "ww-loopback-refused",
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 9))\"; curl -sS http://127.0.0.1:9/",
        (),
        mode=WW,
        tool="python",
    ),
    Case("ww-curl-no-network", "curl -sS https://example.com/", (), mode=WW, tool="curl"),
    Case("ww-git-ls-remote", "git ls-remote https://github.com/git/git", (), mode=WW, tool="git"),
    Case(
        "ww-pip-download",
        "python3 -m pip download --no-cache-dir -q -d dl left-pad-nonexistent",
        (),
        mode=WW,
        tool="pip",
    ),
    Case("ww-npm-view", "npm view left-pad version", (), NODE_PKG, mode=WW, tool="npm"),
    Case(
        "nobody-touch-inside",
        "touch new.txt; mkdir d; echo x > owned-by-root.txt; python3 -c \"open('p.txt', 'w')\"",
        (),
        NOBODY_WS,
        mode=WW,
        how="nobody",
        backends=("none",),
    ),
    Case(
        "nobody-read-inside",
        "cat locked.txt; ls sealed; node -e \"require('fs').readFileSync('locked.txt')\"",
        (),
        UNREADABLE,
        mode=WW,
        how="nobody",
        backends=("none",),
    ),
    Case(
        "nobody-git-inside",
        "git status; git commit -qam x",
        (),
        GIT_REPO + " && chmod -R go-w .",
        mode=WW,
        how="nobody",
        backends=("none",),
        tool="git",
    ),
    Case(
        "unshare-git-ls-remote",
        "git ls-remote https://github.com/git/git; curl -sS https://pypi.org/simple/",
        (),
        mode=WW,
        how="unshare-net",
        backends=("none",),
        tool="git",
    ),
)


def _fill(text: str) -> str:
    return text.replace("{ws}", str(WS)).replace("{home}", str(HOME)).replace("{out}", str(OUTSIDE))


def _reset_workspace() -> None:
    if WS.exists():
        for dirpath, dirnames, _ in os.walk(WS):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o755)
        shutil.rmtree(WS)
    WS.mkdir(parents=True)


def _make_home() -> None:
    shutil.rmtree(HOME, ignore_errors=True)
    OUTSIDE.mkdir(parents=True, exist_ok=True)
    for rel, content in {
        ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n",
        ".aws/credentials": "[default]\naws_secret_access_key = fake\n",
        ".netrc": "machine example.com login u password fake\n",
        ".npmrc": "//registry.npmjs.org/:_authToken=fake\n",
        ".config/gh/hosts.yml": "github.com:\n  oauth_token: fake\n",
        ".docker/config.json": '{"auths": {}}\n',
        ".bashrc": "# ordinary\n",
    }.items():
        path = HOME / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def _run_setup(setup: str) -> None:
    if setup:
        subprocess.run(["bash", "-c", _fill(setup)], cwd=WS, check=True, timeout=120)


async def _run_confined(backend: str, mode: str, command: str) -> tuple[str, str, int | None]:
    async with SandboxBashExecutor(
        backend=backend,
        mode=mode,
        workspace_root=str(WS),
        deny_read=default_deny_read(str(HOME)),
        timeout_ms=120_000,
    ) as executor:
        result = await executor.run(
            executor.resolve(BashExecRequest(command=command, workdir=str(WS), env=TOOL_ENV))
        )
    return result.stdout.text, result.stderr.text, result.exit_code


def _run_unconfined(how: str, command: str) -> tuple[str, str, int | None]:
    if how == "nobody":
        argv = ["runuser", "-u", "nobody", "--", "bash", "-c", command]
    else:
        argv = ["unshare", "-n", "--", "bash", "-c", command]
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **TOOL_ENV}
    # check=False: these commands fail on purpose; their output is what we keep.
    done = subprocess.run(
        argv, check=False, cwd=WS, capture_output=True, text=True, timeout=120, env=env
    )
    return done.stdout, done.stderr, done.returncode


def _label(case: Case, stdout: str, stderr: str) -> list[dict[str, str]]:
    labels = []
    for kind, written in case.expected:
        target = _fill(written)
        if written.startswith("re:"):
            found = re.search(written[3:], stderr + stdout)
            if found is None:
                raise SystemExit(f"{case.name}: label pattern {written!r} not in the output")
            target = os.path.normpath(os.path.join(WS, found.group(1)))
        labels.append({"kind": kind, "target": target})
    return labels


def capture(case: Case, backend: str) -> Path:
    _reset_workspace()
    _run_setup(case.setup)
    command = _fill(case.command)
    if case.how == "sandbox":
        stdout, stderr, exit_code = asyncio.run(_run_confined(backend, case.mode, command))
    else:
        stdout, stderr, exit_code = _run_unconfined(case.how, command)
    name = case.name if backend == "none" else f"{case.name}--{backend}"
    out = CORPUS / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "stdout").write_text(stdout)
    (out / "stderr").write_text(stderr)
    record = {
        "command": command,
        "setup": case.setup,
        "tool": case.tool,
        "how": case.how,
        "backend": None if backend == "none" else backend,
        "exit_code": exit_code,
        "policy": {
            "mode": case.mode,
            "workspace_root": str(WS),
            "writable_roots": [],
            "protected_paths": list(DEFAULT_PROTECTED_PATHS),
            # The same long list for every case: stored once, in DENY_READ_FILE.
            "deny_read": f"@{DENY_READ_FILE}",
        },
        "workdir": str(WS),
        "expected": _label(case, stdout, stderr),
    }
    (out / "case.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return out


def main(names: list[str]) -> int:
    if os.geteuid() != 0:
        print("capture as root: runuser and the fake layout need it", file=sys.stderr)
        return 2
    _make_home()
    CORPUS.mkdir(exist_ok=True)
    (CORPUS / DENY_READ_FILE).write_text("".join(f"{p}\n" for p in default_deny_read(str(HOME))))
    try:
        for case in CASES:
            if names and case.name not in names:
                continue
            for backend in case.backends:
                print(f"{case.name} [{backend}] ...", flush=True)
                capture(case, backend)
    finally:
        _reset_workspace()
        shutil.rmtree(CAPTURE_ROOT, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
