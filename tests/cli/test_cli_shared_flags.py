"""`run` and `mcp` take the same flags from one declaration; the CLI imports form no circle."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from bash_sandbox.cli import main
from bash_sandbox.cli.arguments import build_parser
from bash_sandbox.cli.settings import SETTINGS

CLI_DIR = Path(__file__).resolve().parents[2] / "bash_sandbox" / "cli"
RUN_ONLY = {"--json", "--publish", "--stdin", "-h", "--help"}  # MCP: per call (bash_start, stdin)
MCP_ONLY = {"--allow-escalation-to", "--allow-network-escalation", "-h", "--help"}


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser("test")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = sub.choices[name]
    chosen.format_help()  # adds a deferred subcommand's flags
    return chosen


def _options(name: str) -> dict[str, argparse.Action]:
    return {o: a for a in _subparser(name)._actions for o in a.option_strings}


def test_mcp_takes_every_flag_run_takes_and_the_same_way() -> None:
    run, mcp = _options("run"), _options("mcp")
    assert set(run) - RUN_ONLY == set(mcp) - MCP_ONLY
    for option in set(run) - RUN_ONLY:
        assert run[option].help == mcp[option].help, option
        assert run[option].dest == mcp[option].dest, option
    # Every shared flag is a declared setting; nothing was added beside the declaration.
    assert {s.option for s in SETTINGS} == set(run) - RUN_ONLY - {"--config"}


def test_help_shows_the_models_defaults() -> None:
    text = " ".join(_subparser("mcp").format_help().split())
    assert "memory, e.g. 2G (default: 8G)" in text
    assert "(default: 120000 ms)" in text


@pytest.mark.parametrize("subcommand", ["run", "mcp"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "1M"], "argument --memory: 1M is below the minimum of 16M"),
        (["--memory", "lots"], "expected a size such as 512M"),
        (["--timeout-ms", "soon"], "expected a duration such as 500ms"),
        (["--max-processes", "3"], "below the minimum of 8"),
        (["--backend", "docker"], "invalid choice 'docker'"),
    ],
)
def test_both_subcommands_refuse_a_bad_value_the_same_way(
    subcommand: str, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main([subcommand, *args, "--", "true"] if subcommand == "run" else [subcommand, *args]) == 2
    )
    assert message in capsys.readouterr().err


def test_mcp_flags_reach_the_servers_config(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from bash_sandbox.cli.mcp_server import build_settings

    workspace = tmp_path / "ws"
    extra = tmp_path / "cache"
    workspace.mkdir()
    extra.mkdir()
    args = build_parser("test").parse_args(
        [
            "mcp",
            "--workspace",
            str(workspace),
            "--mode",
            "workspace-write",
            "--memory",
            "2G",
            "--max-processes",
            "64",
            "--timeout-ms",
            "30s",
            "--writable-root",
            str(extra),
            "--allow-domain",
            "pypi.org",
        ]
    )
    config = build_settings(args).config
    assert config.mode.value == "workspace-write"
    assert config.limits.memory_bytes == 2 << 30
    assert config.limits.processes == 64
    assert config.timeout_ms == 30_000
    assert str(extra.resolve()) in config.writable_roots
    assert config.allow_domains == ("pypi.org",)


# -- the import graph --------------------------------------------------------------------------


def _cli_module(name: str) -> str | None:
    if name == "bash_sandbox.cli" or name.startswith("bash_sandbox.cli."):
        return name
    return None


def _import_graph() -> dict[str, set[str]]:
    """Module -> the `bash_sandbox.cli` modules it imports, function-level imports included
    (a lazy import still closes a circle once it runs)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(CLI_DIR.glob("*.py")):
        module = "bash_sandbox.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                # `from bash_sandbox.cli import main` names the submodule when there is one.
                names += [
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if (CLI_DIR / f"{alias.name}.py").exists() and node.module == "bash_sandbox.cli"
                ]
            edges |= {m for n in names if (m := _cli_module(n)) is not None and m != module}
        graph[module] = edges
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_cli_modules_import_each_other_without_a_circle() -> None:
    graph = _import_graph()
    # The package's own `__init__` re-exports `main` lazily; leave it out so the walk sees
    # the modules themselves (nothing imports the package to reach a sibling).
    graph.pop("bash_sandbox.cli", None)
    assert graph["bash_sandbox.cli.mcp_command"], "the walk found no edges: the test is blind"
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


# The front doors above the CLI: the console script, the warm daemon and its spares.
ABOVE_THE_CLI = frozenset({"entry.py", "warm/daemon.py", "warm/spare.py"})


def test_nothing_below_the_cli_imports_it() -> None:
    root = CLI_DIR.parent
    upward = []
    for path in root.rglob("*.py"):
        if CLI_DIR in path.parents or str(path.relative_to(root)) in ABOVE_THE_CLI:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _cli_module(node.module):
                upward.append(f"{path.relative_to(root)} imports {node.module}")
    assert upward == []
