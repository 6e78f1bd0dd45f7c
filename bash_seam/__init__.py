"""The executor seam: the abstract `BashExecutor` and the vocabulary every executor speaks."""

from bash_seam.abort import AbortController, AbortSignal
from bash_seam.errors import (
    AbortedBeforeStartError,
    BashExecError,
    ChildrenReapedError,
    CommandTooLargeError,
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
    DenialGroup,
    DenialKind,
    GitImportOutcome,
    GitImportStatus,
    GitRefConflict,
    HintSource,
    SandboxDenial,
    SandboxFacts,
    SandboxHint,
)

# The shared value types, re-exported for the layers below, which may import only `bash_seam`.
from policies.types import AbsolutePath, PositiveInt

__all__ = [
    "DSH_ENV_PREFIX",
    "AbortController",
    "AbortSignal",
    "AbortedBeforeStartError",
    "AbsolutePath",
    "BashExecError",
    "BashExecRequest",
    "BashExecSpec",
    "BashExecutor",
    "BashProcess",
    "BashProcessRead",
    "BashRunResult",
    "ChildrenReapedError",
    "CollectedOutput",
    "CommandTooLargeError",
    "DenialEvidence",
    "DenialGroup",
    "DenialKind",
    "EnvChannelError",
    "GitImportOutcome",
    "GitImportStatus",
    "GitRefConflict",
    "HintSource",
    "InvalidRequestError",
    "PositiveInt",
    "ProcessStatus",
    "SandboxDenial",
    "SandboxFacts",
    "SandboxHint",
    "ShellNotFoundError",
    "TaskDoneListener",
    "WorkdirError",
]
