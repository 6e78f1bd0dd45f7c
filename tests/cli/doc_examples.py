"""The examples of docs/cli.md, run for real: checked by a test, rewritten on request.

Every ```console block of the page is a transcript: a `$ ` line is a command, the lines up
to the next command are what it printed (stdout and stderr as one terminal would show
them) followed by `[exit N]`. `<!-- doc-setup: COMMAND -->` comments run unseen before the
block that follows them (they create files that a visible `$ cat` then shows). The commands
run in order with `bash` in a fresh directory standing for `/tmp/demo` (the name is
replaced both ways, in commands and in what they print): HOME is
`/tmp/demo/home`, the working directory `/tmp/demo/app`, and the installed `bash-sandbox`
comes first on PATH. ```text blocks (doctor, Ctrl-C, a terminal) are not run.

    python -m tests.cli.doc_examples --write   # refresh the outputs in docs/cli.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
DEMO = "/tmp/demo"
SETUP = re.compile(r"<!-- doc-setup: (?P<command>.*) -->")


@dataclass
class Example:
    command: str
    expected: list[str]
    first_line: int  # index of the `$ ` line in the page


@dataclass
class Page:
    lines: list[str]
    # (line index, setup command) and examples, in page order.
    steps: list[tuple[int, str | Example]] = field(default_factory=list)


def parse(text: str) -> Page:
    page = Page(text.splitlines())
    in_console = False
    current: Example | None = None
    for index, line in enumerate(page.lines):
        if not in_console:
            setup = SETUP.fullmatch(line.strip())
            if setup:
                page.steps.append((index, setup["command"]))
            elif line.strip() == "```console":
                in_console = True
            continue
        if line.strip() == "```":
            in_console, current = False, None
        elif line.startswith("$ "):
            current = Example(line[2:], [], index)
            page.steps.append((index, current))
        elif current is not None:
            current.expected.append(line)
    for _, step in page.steps:
        # The blank line between two examples separates them; it is not output.
        while isinstance(step, Example) and step.expected and not step.expected[-1]:
            step.expected.pop()
    return page


def demo_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "TMPDIR")}
    env["HOME"] = str(root / "home")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal width
    # The CLI's own state dirs stay in the demo tree (the commands do not use TMPDIR here).
    env["TMPDIR"] = str(root / "tmp")
    return env


def run_page(page: Page, root: Path) -> list[tuple[Example, list[str]]]:
    """Run every step in ``root`` (standing for /tmp/demo); returns (example, actual)."""
    for sub in ("app", "home", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = demo_env(root)
    cwd = root / "app"
    results: list[tuple[Example, list[str]]] = []
    for _, step in page.steps:
        command = (step if isinstance(step, str) else step.command).replace(DEMO, str(root))
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
        if isinstance(step, str):
            if done.returncode != 0:
                raise RuntimeError(f"doc-setup failed: {command}: {done.stdout!r}")
            continue
        text = done.stdout.decode(errors="replace").replace(str(root), DEMO)
        actual = [*text.splitlines(), f"[exit {done.returncode}]"]
        results.append((step, actual))
    return results


def mismatches(results: list[tuple[Example, list[str]]]) -> list[str]:
    out = []
    for example, actual in results:
        if example.expected != actual:
            out.append(
                f"line {example.first_line + 1}: $ {example.command}\n"
                f"  documented: {example.expected}\n  printed:    {actual}"
            )
    return out


def rewrite(page: Page, results: list[tuple[Example, list[str]]]) -> str:
    lines = list(page.lines)
    # From the bottom up, so earlier indices stay valid.
    for example, actual in reversed(results):
        start = example.first_line + 1
        end = start + len(example.expected)
        followed_by_example = end < len(lines) and lines[end].startswith("$ ")
        lines[start:end] = [*actual, ""] if followed_by_example else actual
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/cli.md in place")
    args = parser.parse_args()
    page = parse(DOC.read_text())
    with tempfile.TemporaryDirectory(prefix="bash-sandbox-doc-") as tmp:
        results = run_page(page, Path(tmp) / "demo")
    problems = mismatches(results)
    if args.write:
        DOC.write_text(rewrite(page, results))
        print(f"rewrote {len(problems)} of {len(results)} examples in {DOC}")
        return 0
    print("\n".join(problems) or f"all {len(results)} examples match")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
