"""The executor seam: the abstract `BashExecutor` and the vocabulary every executor speaks."""

from bash_seam.abort import AbortController, AbortSignal
from bash_seam.errors import (
    AbortedBeforeStartError,
    BashExecError,
    EnvChannelError,
    InvalidRequestError,
    ShellNotFoundError,
    WorkdirError,
)
from bash_seam.executor import BashExecutor, BashProcess, ProcessStatus, TaskDoneListener
from bash_seam.models import (
    DSH_ENV_PREFIX,
    BashExecRequest,
    BashExecSpec,
    BashProcessRead,
    BashRunResult,
    CollectedOutput,
    DenialEvidence,
    DenialKind,
    SandboxDenial,
    SandboxFacts,
)

__all__ = [
    "DSH_ENV_PREFIX",
    "AbortController",
    "AbortSignal",
    "AbortedBeforeStartError",
    "BashExecError",
    "BashExecRequest",
    "BashExecSpec",
    "BashExecutor",
    "BashProcess",
    "BashProcessRead",
    "BashRunResult",
    "CollectedOutput",
    "DenialEvidence",
    "DenialKind",
    "EnvChannelError",
    "InvalidRequestError",
    "ProcessStatus",
    "SandboxDenial",
    "SandboxFacts",
    "ShellNotFoundError",
    "TaskDoneListener",
    "WorkdirError",
]
