"""`ResourceLimits`: how much of the host one confined command may take, and `LimitExceeded`.

The numbers are per command: its whole process tree, daemonised grandchildren included.
`None` means "no limit of this kind". How each limit is enforced on a host (cgroups,
rlimits, tmpfs sizes) is the sandbox's business (`bash_sandbox.linux.limits`); this module
only says what is asked for, and names the limit that stopped a command.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator

from policies.units import format_size, size_or_text

_MiB = 1024 * 1024
_GiB = 1024 * _MiB

PositiveLimit = Annotated[StrictInt, Field(gt=0)]
# A size field also takes the units grammar (`"2G"`, `policies.units`).
SizeLimit = Annotated[StrictInt, Field(gt=0), BeforeValidator(size_or_text)]

# The least that lets bash start inside every backend, measured (see docs/cli.md): a limit
# below it kills the sandbox's own setup before the command runs, which would look like
# an unusable sandbox. Refused when the limits are made, with the minimum in the message.
# bwrap + bash ran `echo; ls` in 3 MiB (Landlock: 2 MiB): 16 MiB leaves room for the rest.
MIN_MEMORY_BYTES = 16 * _MiB
# bwrap, its pid 1 and bash are three tasks before the command forks anything.
MIN_PROCESSES = 8
# The child's descriptors (the backend's namespaces and the seccomp listener) come first:
# 28 failed and 32 worked on the reference host.
MIN_OPEN_FILES = 64
# The private /tmp and /dev/shm: a tmpfs is whole pages (64 KiB each on some arm64 hosts),
# so a smaller size is not the size enforced, and it would not hold what commands start
# with there (a shell's here-document past a pipe's size, multiprocessing's semaphores).
MIN_TMPFS_BYTES = 1 * _MiB


class LimitExceeded(enum.StrEnum):
    """The limit that stopped a command (`SandboxFacts.limit_exceeded`)."""

    MEMORY = "memory"  # an OOM kill counted in the command's memory cgroup
    PROCESSES = "processes"  # a fork refused at the pids cgroup's limit (counted there)
    CPU_TIME = "cpu-time"  # SIGXCPU from RLIMIT_CPU
    TMP_SPACE = "tmp-space"  # the private /tmp tmpfs was full when the command ended
    SHM_SPACE = "shm-space"  # the private /dev/shm tmpfs was full when the command ended
    # Kept for old results: EMFILE at RLIMIT_NOFILE leaves no kernel counter, and the output
    # saying "Too many open files" is no evidence, so it is not reported any more.
    OPEN_FILES = "open-files"


class ResourceLimits(BaseModel):
    """Per-command limits. The defaults are sized so that no ordinary build or test suite
    meets them, while a fork bomb or a runaway allocation stops long before the host does:

    - ``memory_bytes`` 8 GiB, RAM and swap together, for the whole tree: a parallel C++
      build (about 1 GiB per compiler job) or a JVM test suite stays well below it; a leak
      stops there instead of pushing a workstation into swap. Pages the command writes to
      its private /tmp and /dev/shm (tmpfs) count here too. Set it lower on a small host.
    - ``processes`` 4096 tasks (threads count, as the kernel counts them): `make -j` of a
      large tree or `pytest -n 32` uses a few hundred; a fork bomb stops at 4096 instead of
      the host's pid_max (32768 on many hosts).
    - ``cpu_cores`` None: no quota. Where cgroups are available the whole tree still gets
      one scheduling share, so a tree spinning every core competes with the executor like
      one process, not like a thousand. A number (1.5 = one and a half cores) is a hard
      quota for the tree.
    - ``cpu_seconds`` None: no CPU-time limit; the run's timeout already bounds a
      foreground command. A number is RLIMIT_CPU, per process (SIGXCPU at the limit).
    - ``tmp_bytes`` 4 GiB and ``shm_bytes`` 1 GiB: sizes of the private tmpfs mounted at
      /tmp and /dev/shm; a build's temporaries fit, "fill the disk" stops there. At least
      1 MiB each (`MIN_TMPFS_BYTES`).
    - ``open_files`` 65536 per process (RLIMIT_NOFILE, hard limit; never raised above the
      executor's own): file watchers and big linkers fit, a descriptor leak stops there.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_bytes: SizeLimit | None = 8 * _GiB
    processes: PositiveLimit | None = 4096
    # A cgroup CPU quota below 1 ms per 100 ms period is refused by the kernel.
    cpu_cores: Annotated[float, Field(ge=0.01, allow_inf_nan=False)] | None = None
    cpu_seconds: PositiveLimit | None = None
    tmp_bytes: SizeLimit = 4 * _GiB
    shm_bytes: SizeLimit = 1 * _GiB
    open_files: PositiveLimit | None = 65536

    @field_validator("memory_bytes")
    @classmethod
    def _memory_floor(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_MEMORY_BYTES:
            raise ValueError(
                f"{format_size(value)} is below the minimum of {format_size(MIN_MEMORY_BYTES)}: "
                "bash and the sandbox need that much to start"
            )
        return value

    @field_validator("processes")
    @classmethod
    def _processes_floor(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_PROCESSES:
            raise ValueError(
                f"{value} is below the minimum of {MIN_PROCESSES}: the sandbox and bash "
                "take three before the command forks"
            )
        return value

    @field_validator("tmp_bytes", "shm_bytes")
    @classmethod
    def _tmpfs_floor(cls, value: int) -> int:
        if value < MIN_TMPFS_BYTES:
            raise ValueError(
                f"{format_size(value)} is below the minimum of {format_size(MIN_TMPFS_BYTES)}: "
                "a private tmpfs is whole pages, and commands start with files there"
            )
        return value

    @field_validator("open_files")
    @classmethod
    def _open_files_floor(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_OPEN_FILES:
            raise ValueError(
                f"{value} is below the minimum of {MIN_OPEN_FILES}: the sandbox's own "
                "descriptors come first"
            )
        return value
