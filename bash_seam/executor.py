"""The abstract executor seam: callers hold a `BashExecutor` and never know which one.

Like an httpx transport, each implementation (local, sandboxed) owns how a command runs;
the caller only resolves a request, runs or starts the spec, and reads results.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from types import TracebackType
from typing import Literal, Self

from bash_seam.models import (
    BashExecRequest,
    BashExecSpec,
    BashProcessRead,
    BashRunResult,
    SandboxFacts,
)
from policies import SandboxMode

ProcessStatus = Literal["running", "completed", "killed"]


class BashProcess(abc.ABC):
    """Handle on a background command started by `BashExecutor.start()`."""

    id: str
    command: str
    owner: str | None

    @property
    @abc.abstractmethod
    def status(self) -> ProcessStatus: ...

    @property
    @abc.abstractmethod
    def exit_code(self) -> int | None: ...

    @property
    @abc.abstractmethod
    def signal(self) -> str | None: ...

    @property
    @abc.abstractmethod
    def sandbox(self) -> SandboxFacts | None:
        """Stamped before `wait()` returns; `None` from a non-sandboxing executor."""

    @abc.abstractmethod
    async def wait(self) -> None:
        """Return once the process has settled. Never raises."""

    @abc.abstractmethod
    def read_output(self) -> BashProcessRead:
        """Consume and return the output produced since the previous read."""

    @abc.abstractmethod
    def kill(self) -> bool:
        """Kill the process group; False when it had already finished. Idempotent."""


TaskDoneListener = Callable[[BashProcess], None]


class BashExecutor(abc.ABC):
    """Runs bash commands. Foreground via `run()`, background via `start()`."""

    @property
    def sandbox_mode(self) -> SandboxMode | None:
        """The default confinement mode; `None` means this executor does not sandbox."""
        return None

    @abc.abstractmethod
    def resolve(self, request: BashExecRequest) -> BashExecSpec: ...

    @abc.abstractmethod
    async def run(self, spec: BashExecSpec) -> BashRunResult: ...

    @abc.abstractmethod
    async def start(self, spec: BashExecSpec) -> BashProcess: ...

    @abc.abstractmethod
    def get(self, process_id: str) -> BashProcess:
        """The background process with this id; unknown id raises `KeyError`."""

    @abc.abstractmethod
    def list(self) -> list[BashProcess]: ...

    @abc.abstractmethod
    def owner_of(self, process_id: str) -> str | None:
        """The opaque owner stored at `start()`; unknown id raises `KeyError`."""

    @abc.abstractmethod
    def read_output(self, process_id: str) -> BashProcessRead:
        """Consuming read of a background process; unknown id raises `KeyError`."""

    @abc.abstractmethod
    def kill(self, process_id: str) -> bool:
        """Kill a background process; unknown id raises `KeyError`."""

    @abc.abstractmethod
    def on_task_done(self, listener: TaskDoneListener) -> Callable[[], None]:
        """Call ``listener`` once per finished process, never after `aclose()`.

        Returns a disposer that unsubscribes it.
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Kill every live process group and wait for them."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
