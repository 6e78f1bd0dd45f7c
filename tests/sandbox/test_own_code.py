"""The sandbox's own installation inside a writable root (a harness run from the project's
`.venv`): read-only to every command, so nothing a command plants there runs in the next
harness process. Real backends; the next harness is a real interpreter started from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import bash_sandbox

_HARNESS = """
import asyncio, json, sys
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest
async def main():
    ws, backend, command = sys.argv[1:4]
    ex = SandboxBashExecutor(backend=backend, workspace_root=ws)
    spec = ex.resolve(BashExecRequest(command=command, workdir=ws, sandbox_mode="workspace-write"))
    r = await ex.run(spec)
    await ex.aclose()
    print(r.stdout.text, end="")
    facts = r.sandbox
    denials = [[d.target, d.reason] for d in facts.denials]
    print(json.dumps([r.exit_code, denials, str(facts.enforcement), list(facts.warnings)]))
asyncio.run(main())
"""


def _harness(
    python: Path | str,
    *flags: str,
    project: Path,
    backend: str,
    command: str,
    cwd: Path | None = None,
) -> tuple[list[str], list[list[str]], str, list[str]]:
    """One workspace-write ``command`` in ``project`` through a harness started as
    `python [flags] -c ...` (in ``cwd``): its output lines, its denials (target, reason),
    its enforcement and its warnings."""
    done = subprocess.run(
        [str(python), *flags, "-c", _HARNESS, str(project), backend, command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    *output, last = done.stdout.strip().splitlines()
    _, denials, enforcement, warnings = json.loads(last)
    return output, denials, enforcement, warnings


def _venv(path: Path, *paths: Path | str) -> tuple[Path, Path]:
    """A venv at ``path`` whose interpreter also imports ``paths`` (a `.pth`, as `pip
    install` or an editable install leaves one): (its python, its site-packages)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60
    )
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    (Path(purelib) / "harness.pth").write_text("".join(f"{p}\n" for p in paths))
    return python, Path(purelib)


def _project_venv(project: Path) -> tuple[Path, Path]:
    """A venv in ``project`` whose interpreter imports this checkout and its dependencies."""
    source = Path(bash_sandbox.__file__).resolve().parents[1]
    return _venv(project / ".venv", source, sysconfig.get_paths()["purelib"])


def test_a_pth_planted_in_the_harnesss_own_venv_never_runs(backend: str, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    python, purelib = _project_venv(project)
    other = project / "other-env"  # a venv the harness does not run from stays writable
    other.mkdir()
    marker = tmp_path / "pwned"
    plant = f"import os; open({str(marker)!r}, 'w').write('ran')"
    command = f"echo {plant!r} > {purelib}/zz.pth; echo ok > other-env/x"
    _, denials, enforcement, _ = _harness(python, project=project, backend=backend, command=command)
    assert [t for t, _ in denials] == [f"{purelib}/zz.pth"]
    assert enforcement.endswith("full")
    assert "the sandbox's own installation" in denials[0][1]
    assert (other / "x").read_text() == "ok\n"
    # The next harness process (any interpreter start from that venv) runs nothing planted.
    subprocess.run([str(python), "-c", "pass"], check=True, timeout=60)
    assert not (purelib / "zz.pth").exists()
    assert not marker.exists()


def test_an_editable_installs_source_tree_imports_nothing_a_command_planted(
    backend: str, tmp_path: Path
) -> None:
    # The workspace is the source tree of an editable install (its `.pth` puts the tree on
    # `sys.path`): a `sitecustomize.py` a command wrote there ran in the next harness
    # process (red team). The tree stays writable; the names `site` imports at start do not.
    project = tmp_path / "proj"
    project.mkdir()
    source = Path(bash_sandbox.__file__).resolve().parents[1]
    for name in ("bash_sandbox", "bash_local", "bash_seam", "policies", "bash_sandbox_audit"):
        shutil.copytree(source / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The dependencies, then the tree, as an editable install's `.pth` adds it.
    python, _ = _venv(tmp_path / "venv", sysconfig.get_paths()["purelib"], project)
    marker = tmp_path / "pwned"
    plant = f"import os; open({str(marker)!r}, 'w').write('ran')"
    command = (
        f"echo {plant!r} > sitecustomize.py; echo {plant!r} > usercustomize.py; echo ok > x;"
        # No directory at a package's name (setuptools' flat-layout discovery counted them as
        # packages), and removing the held names is answered as done (`git clean -fdx`).
        " [ -d sitecustomize ] || echo no-package-dirs;"
        " rm -f sitecustomize.py usercustomize.py && rm -rf sitecustomize && echo removed"
    )
    output, denials, enforcement, warnings = _harness(
        python, "-I", project=project, backend=backend, command=command
    )
    # Any other module name there cannot be held: the run says so, naming the directory.
    assert enforcement.endswith("partial")
    assert any(f"the harness imports from {project}" in w for w in warnings), warnings
    assert sorted(t for t, _ in denials) == [
        f"{project}/sitecustomize.py",
        f"{project}/usercustomize.py",
    ]
    assert (project / "x").read_text() == "ok\n"  # the tree itself stays writable
    assert "no-package-dirs" in output and "removed" in output, output
    subprocess.run([str(python), "-c", "pass"], check=True, timeout=60)
    assert not (project / "sitecustomize.py").exists()
    assert not marker.exists()


def test_a_harness_started_in_the_workspace_imports_no_package_a_command_made_there(
    backend: str, tmp_path: Path
) -> None:
    # `python -m bash_sandbox.cli` (or `-c`) started in the workspace puts that directory
    # first on `sys.path`: a `bash_sandbox/` a command made there ran in the next harness
    # process (red team). Its names are held; anything else there cannot be: partial.
    project = tmp_path / "proj"
    project.mkdir()
    marker = tmp_path / "pwned"
    plant = f"import os; open({str(marker)!r}, 'w').write('ran')"
    command = f"mkdir -p bash_sandbox; echo {plant!r} > bash_sandbox/__init__.py; echo ok > x"
    _, _, enforcement, warnings = _harness(
        sys.executable, project=project, backend=backend, command=command, cwd=project
    )
    assert enforcement.endswith("partial")
    assert any(f"the harness imports from {project}" in w for w in warnings), warnings
    assert (project / "x").read_text() == "ok\n"
    assert not (project / "bash_sandbox").exists()  # held by a file while the command ran
    subprocess.run(
        [sys.executable, "-c", "import bash_sandbox"], cwd=project, check=True, timeout=60
    )
    assert not marker.exists()
