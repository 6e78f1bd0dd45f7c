"""`PolicyError`: a policy could not be resolved from what the caller or the config supplied."""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy input is unusable: a missing or relative workspace root, an invalid path list.

    Nothing was run. The message names the offending value and what to change; ``detail``
    carries the same reason without the advice, for logs and JSON output. ``code`` is
    ``POLICY_INVALID`` unless a more specific one says what went wrong (for example
    ``WRITABLE_ROOT_MISSING`` or ``SESSION_LOG_IN_WRITABLE_ROOT``).
    """

    code = "POLICY_INVALID"

    def __init__(self, detail: str, *, hint: str | None = None, code: str | None = None) -> None:
        self.detail = detail
        self.hint = hint
        if code is not None:
            self.code = code
        super().__init__(f"{detail} ({hint})" if hint else detail)


class SessionLogError(OSError):
    """A session log path that must not be used: nothing was read from or written to it.

    ``code`` says what is wrong with the file and the message says what to do; the file
    itself is left exactly as it was (never truncated, never followed if it is a symlink).
    It is an `OSError` because, like one, it means "this file cannot be opened as asked".
    """

    def __init__(self, path: str, detail: str, *, code: str, hint: str) -> None:
        self.path = path
        self.detail = detail
        self.code = code
        self.hint = hint
        super().__init__(f"session log {path}: {detail} ({hint})")
