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
