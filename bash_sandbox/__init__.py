"""Confined execution: `SandboxBashExecutor` with bubblewrap, Landlock and Seatbelt backends."""

from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor

__all__ = ["SandboxBashConfig", "SandboxBashExecutor", "SandboxUnavailableError"]
