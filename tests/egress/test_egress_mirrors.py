"""The user's package mirrors reach sandboxed pip, uv and npm, without their credentials.

The mirror is a real upstream on the host's 127.0.0.1, named `registry.test` by a temp hosts
file; the user's pip.conf and .npmrc live in a temp HOME (with a password in the index URL
and an `_authToken` line). Judged from outside: the upstream's request log (the path, and no
Authorization header) and the result's warnings.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from bash_seam import BashExecRequest
from tests.egress.conftest import ExecutorFactory
from tests.egress.servers import UpstreamServer, make_simple_index, npm_packument

SECRET = "s3cret-never-in-the-sandbox"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PIP_CONFIG_FILE", "NPM_CONFIG_USERCONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("npm_config_userconfig", raising=False)
    return path


async def test_pip_uses_the_mirror_of_the_users_pip_conf_without_its_password(
    make_pinned_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    root = tmp_path / "index"
    wheel = make_simple_index(root)
    with UpstreamServer(root) as index:
        conf = home / ".config" / "pip" / "pip.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text(
            "[global]\n"
            f"index-url = http://alice:{SECRET}@registry.test:{index.port}/simple/\n"
            "trusted-host = registry.test\n"
        )
        ws = tmp_path / "ws"
        ex = make_pinned_executor(allow_domains=("registry.test",), mode="workspace-write")
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input"]
        argv += ["--disable-pip-version-check", "-d", str(ws / "dest"), "egress-probe"]
        command = shlex.join(argv) + '; env | grep -c "' + SECRET + '" || true'
        result = await ex.run(ex.resolve(BashExecRequest(command=command, timeout_ms=90_000)))
        assert "/simple/egress-probe/" in [r.path for r in index.requests], result.stderr.text
        assert all("authorization" not in r.headers for r in index.requests)
    served = (root / "simple" / "egress-probe" / wheel).read_bytes()
    assert hashlib.sha256((ws / "dest" / wheel).read_bytes()).digest() == (
        hashlib.sha256(served).digest()
    )
    assert result.stdout.text.strip().endswith("0")  # the command's env never held it
    assert result.sandbox is not None
    assert any(w.startswith(f"PIP_INDEX_URL (from {conf})") for w in result.sandbox.warnings)


def _uv() -> str | None:
    """The uv of the test environment (a test extra), by absolute path."""
    found = Path(sys.executable).with_name("uv")
    return str(found) if found.exists() else shutil.which("uv")


@pytest.mark.skipif(_uv() is None, reason="uv not installed")
async def test_uv_uses_the_mirror_of_the_users_environment_without_its_password(
    make_pinned_executor: ExecutorFactory,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "index"
    wheel = make_simple_index(root)
    with UpstreamServer(root) as index:
        monkeypatch.setenv(
            "UV_DEFAULT_INDEX", f"http://alice:{SECRET}@registry.test:{index.port}/simple/"
        )
        ws = tmp_path / "ws"
        ex = make_pinned_executor(allow_domains=("registry.test",), mode="workspace-write")
        argv = [str(_uv()), "pip", "install", "--no-deps", "--no-config", "--python"]
        argv += [sys.executable, "--target", str(ws / "dest"), "egress-probe"]
        command = shlex.join(argv) + '; env | grep -c "' + SECRET + '" || true'
        result = await ex.run(ex.resolve(BashExecRequest(command=command, timeout_ms=90_000)))
        paths = [r.path for r in index.requests]
        assert "/simple/egress-probe/" in paths, result.stdout.text + result.stderr.text
        assert all("authorization" not in r.headers for r in index.requests)
        assert any(p.endswith(wheel) for p in paths)  # the wheel came from the mirror
    assert result.stdout.text.strip().endswith("0")  # the command's env never held it
    assert result.sandbox is not None
    assert any(w.startswith("UV_DEFAULT_INDEX") for w in result.sandbox.warnings)


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm not installed")
async def test_npm_uses_the_registry_of_the_users_npmrc_and_never_its_token(
    make_pinned_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    site = tmp_path / "npm"
    site.mkdir()
    with UpstreamServer(site) as registry:
        base = registry.url("registry.test", "/")
        tarball = registry.url("registry.test", "/egress-probe/-/egress-probe-1.2.3.tgz")
        registry.route("/egress-probe", npm_packument("egress-probe", "1.2.3", tarball))
        npmrc = home / ".npmrc"
        npmrc.write_text(f"registry={base}\n//registry.test:{registry.port}/:_authToken={SECRET}\n")
        npmrc.chmod(0o600)
        ex = make_pinned_executor(allow_domains=("registry.test",))
        env = {"npm_config_update_notifier": "false", "npm_config_audit": "false"}
        command = "npm view egress-probe version"
        request = BashExecRequest(command=command, env=env, timeout_ms=90_000)
        result = await ex.run(ex.resolve(request))
        assert result.exit_code == 0, result.stdout.text + result.stderr.text
        assert result.stdout.text.strip() == "1.2.3"
        assert [r.path for r in registry.requests] == ["/egress-probe"]
        assert all("authorization" not in r.headers for r in registry.requests)
    assert result.sandbox is not None
    assert any("_authToken not passed" in w for w in result.sandbox.warnings)
    assert SECRET not in repr(result)


async def test_without_an_allowlist_a_refused_command_is_told_the_mirrors_host(
    make_pinned_executor: ExecutorFactory, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.corp.test/simple/")
    ex = make_pinned_executor()
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "-d", "/tmp/d"]
    argv += ["--disable-pip-version-check", "egress-probe"]
    request = BashExecRequest(command=shlex.join(argv), timeout_ms=90_000)
    result = await ex.run(ex.resolve(request))
    assert result.exit_code != 0
    assert result.sandbox is not None and result.sandbox.network_denied
    assert any(
        "package mirror configured at pypi.corp.test" in w for w in result.sandbox.warnings
    ), result.sandbox.warnings
