"""What a tool call returns: MCP structured content for programs, a short text for the model.

Every result carries the same facts twice. ``structuredContent`` holds them whole: exit status
(``exit_code``, ``signal``, ``timed_out``), the bounded output as `CollectedOutput` (the tail
when truncated, plus the private spill file holding the complete stream) and the
`SandboxFacts`. The text is what a model reads: the output, one status line, and the denial
marker whenever the facts say the sandbox refused something. Failures are tool errors
(``isError``) with the error's ``code`` and a message that says what to do next.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from bash_sandbox.cli.render import json_safe, one_line
from bash_sandbox.facts import git_outcome_text, result_markers
from bash_seam import BashProcess, BashProcessRead, BashRunResult, CollectedOutput, SandboxFacts
from policies import NetworkMode, SandboxMode, network_denial_marker, sandbox_denial_marker


def _tool_result(
    text: str, structured: dict[str, Any], *, is_error: bool = False
) -> types.CallToolResult:
    # A path the command chose may hold bytes that are not UTF-8 (surrogates here): the
    # server's JSON writer failed on them and the whole server went down (a red team's).
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json_safe(text))],
        structured_content=json_safe(structured),
        is_error=is_error,
    )


def error_result(code: str, message: str) -> types.CallToolResult:
    """A refused or failed call: nothing ran (or it could not be started). On one line: a
    message may name a directory the command made (a red team's put `[exit 0]` at the first
    column through one)."""
    return _tool_result(
        f"error {code}: {one_line(message)}",
        {"error": {"code": code, "message": message}},
        is_error=True,
    )


def denial_markers(facts: SandboxFacts | None) -> list[str]:
    """The marker lines for what the sandbox refused, as `bash-sandbox run` prints them."""
    if facts is None:
        return []
    # The contract's generic lines first (harnesses match them), then one line per denial.
    markers: list[str] = []
    if facts.denied:
        markers.append(sandbox_denial_marker(facts.mode))
    if facts.network_denied:
        markers.append(network_denial_marker())
    # What the import did and what the sandbox says about itself, as the CLI prints them: a
    # conflict's keep-ref was in the structured content only (a red team's).
    markers += result_markers(facts)
    markers += [f"[{git_outcome_text(o)}]" for o in facts.git]
    markers += [f"[warning: {w}]" for w in facts.warnings]
    # One line each: a refused path the command chose may hold a line break.
    return [one_line(m) for m in markers]


def _truncation_note(name: str, output: CollectedOutput) -> str | None:
    if not output.truncated:
        return None
    where = (
        f"; the whole stream is kept outside the sandbox at {output.spill_path}"
        if output.spill_path
        else ""
    )
    return f"[{name} truncated: only its tail is shown{where}]"


def _status_line(
    exit_code: int | None, signal: str | None, *, timed_out: bool = False, timeout_ms: int = 0
) -> str:
    if timed_out:
        return f"[timed out after {timeout_ms} ms; the command was killed]"
    if signal is not None:
        return f"[killed by {signal}]"
    if exit_code is not None:
        return f"[exit {exit_code}]"
    return "[no exit status]"


def _quoted(output: str) -> str:
    """The command's output as the model reads it: every line indented, after every break
    `str.splitlines` knows, so only the server's own lines start at the first column (a
    guard matching lines that begin like them fell to each new lookalike a red team found:
    a zero-width space inside the word, a Cyrillic letter, an escape sequence)."""
    return "".join(_INDENT + line for line in output.splitlines(keepends=True))


_INDENT = "  "


def _join_output(stdout: str, stderr: str) -> str:
    text = _quoted(stdout)
    if stderr:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "[stderr]\n" + _quoted(stderr)
    return text


def _lines(*parts: str | None) -> str:
    kept = [p.rstrip("\n") for p in parts if p]
    return "\n".join(kept) if kept else "(no output)"


def run_result(
    result: BashRunResult, *, mode: SandboxMode, network: NetworkMode
) -> types.CallToolResult:
    """The result of `bash_run`; a nonzero exit is a result, not a tool error."""
    structured = result.model_dump(mode="json") | {
        "sandbox_mode": mode.value,
        "network": network.value,
    }
    text = _lines(
        _join_output(result.stdout.text, result.stderr.text),
        _status_line(
            result.exit_code,
            result.signal,
            timed_out=result.timed_out,
            timeout_ms=result.timeout_ms,
        ),
        _truncation_note("stdout", result.stdout),
        _truncation_note("stderr", result.stderr),
        *denial_markers(result.sandbox),
    )
    return _tool_result(text, structured)


def process_facts(process: BashProcess) -> dict[str, Any]:
    """A background process as structured content."""
    return {
        "id": process.id,
        "command": process.command,
        "status": process.status,
        "exit_code": process.exit_code,
        "signal": process.signal,
        "sandbox": process.sandbox.model_dump(mode="json") if process.sandbox else None,
    }


def _process_status(process: BashProcess) -> str:
    if process.status == "running":
        return f"[{process.id} is running]"
    return f"[{process.id} {process.status}] " + _status_line(process.exit_code, process.signal)


def start_result(
    process: BashProcess,
    *,
    mode: SandboxMode,
    network: NetworkMode,
    published: dict[int, str] | None = None,
) -> types.CallToolResult:
    structured = process_facts(process) | {"sandbox_mode": mode.value, "network": network.value}
    if published:
        structured["published"] = {str(port): url for port, url in published.items()}
    text = _lines(
        f"started {process.id} (sandbox mode {mode.value}, network {network.value}); "
        "read its output with bash_read",
        *(
            f"sandbox port {port} is reachable from the host at {url} while it runs"
            for port, url in (published or {}).items()
        ),
        _process_status(process) if process.status != "running" else None,
    )
    return _tool_result(text, structured)


def read_result(process: BashProcess, read: BashProcessRead) -> types.CallToolResult:
    structured = process_facts(process) | read.model_dump(mode="json")
    lossy = (
        "[part of the output was skipped (more than the output cap since the last read); "
        "the whole streams are kept outside the sandbox]"
        if read.lossy
        else None
    )
    finished = process.status != "running"
    text = _lines(
        # Each stream guarded apart: the real `[stderr]` line stays the server's own.
        _join_output(read.stdout_delta, read.stderr_delta),
        lossy,
        _process_status(process),
        *(denial_markers(process.sandbox) if finished else []),
    )
    return _tool_result(text, structured)


def kill_result(process: BashProcess, *, killed: bool) -> types.CallToolResult:
    structured = process_facts(process) | {"killed": killed}
    verb = "killed" if killed else "had already finished"
    return _tool_result(f"{process.id} {verb}\n{_process_status(process)}", structured)


def _first_line(command: str, limit: int = 80) -> str:
    first = command.strip().split("\n", 1)[0]
    line = one_line(first)
    return line if len(line) <= limit and first == command.strip() else line[:limit] + " ..."


def list_result(processes: list[BashProcess]) -> types.CallToolResult:
    structured = {"processes": [process_facts(p) for p in processes]}
    if not processes:
        return _tool_result("no background commands", structured)
    lines = [f"{p.id}  {p.status:<9}  {_first_line(p.command)}" for p in processes]
    return _tool_result("\n".join(lines), structured)
