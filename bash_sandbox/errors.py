"""`SandboxUnavailableError`: confinement could not be guaranteed, so nothing ran unconfined."""

from __future__ import annotations

from policies import SandboxMode


class SandboxUnavailableError(Exception):
    """No backend can enforce ``mode`` here, or the runner failed. The command did not run
    unconfined. Next step: `bash-sandbox doctor` says which layer is missing on this host."""

    code = "SANDBOX_UNAVAILABLE"

    def __init__(self, mode: SandboxMode | str, detail: str) -> None:
        self.mode = SandboxMode(mode)
        self.detail = detail
        super().__init__(
            f"sandbox unavailable for {self.mode.value} mode: {detail} "
            "(run `bash-sandbox doctor` to see what this host can enforce)"
        )
