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
        # The child's failed setup step, when it reported one (`backends/child_failure.py`).
        self.failure: object | None = None
        super().__init__(
            f"sandbox unavailable for {self.mode.value} mode: {detail} "
            "(run `bash-sandbox doctor` to see what this host can enforce)"
        )


class ViewChangedError(SandboxUnavailableError):
    """A path the command's view mounts vanished between surveying the host and mounting it
    (nothing ran). The executor takes the view again, once, before raising this."""

    code = "SANDBOX_UNAVAILABLE"
