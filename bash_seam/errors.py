"""Typed infrastructure errors of the seam. Each carries a stable `code` and says what to do."""

from __future__ import annotations


class BashExecError(Exception):
    """Base of the errors `run()`/`start()` raise; a command's own failure is never one."""

    code = "BASH_EXEC_ERROR"


class InvalidRequestError(BashExecError, ValueError):
    """A request or config value is unusable; nothing was spawned."""

    code = "INVALID_REQUEST"


class AbortedBeforeStartError(BashExecError):
    """The request's signal was already aborted; nothing was spawned."""

    code = "ABORTED_BEFORE_START"


class WorkdirError(BashExecError):
    """The working directory is missing, relative, or not a directory."""

    code = "WORKDIR_UNUSABLE"


class ShellNotFoundError(BashExecError):
    """No `bash` executable was found on this host."""

    code = "SHELL_NOT_FOUND"


class ChildrenReapedError(BashExecError):
    """This process ignores SIGCHLD (or set SA_NOCLDWAIT), so the kernel reaps its children
    itself and no exit status of a command it would parent could be read; nothing was
    spawned. The message says how to set it back."""

    code = "CHILDREN_REAPED_BY_KERNEL"

    def __init__(self) -> None:
        super().__init__(
            "this process ignores SIGCHLD (SIG_IGN or SA_NOCLDWAIT), so the kernel reaps its "
            "children itself and no command's exit status could be read (it would read as 0); "
            "set it back first: signal.signal(signal.SIGCHLD, signal.SIG_DFL)"
        )


class EnvChannelError(BashExecError, ValueError):
    """`env` carried a `DSH_*` name, or `dsh_env` carried a name outside `DSH_*`."""

    code = "ENV_CHANNEL_MISUSE"


class CommandTooLargeError(InvalidRequestError):
    """The command or one environment value is larger than one `execve` can carry on this
    host (E2BIG); nothing was spawned. The message names the limit and what to do instead."""

    code = "COMMAND_TOO_LARGE"
