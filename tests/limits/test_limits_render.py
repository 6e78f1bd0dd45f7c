"""Pure parts of the limits: host discovery from text, what each cgroup gets, which rlimits,
the child steps of a plan, the enforcement report, and the outcome read from counter files.

Kernel behaviour is in test_limits_kernel.py; here a cgroup tree is a temp directory.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from bash_sandbox.linux.cgroups import (
    CgroupBase,
    CgroupHost,
    CgroupSetting,
    CgroupVersion,
    detect_cgroup_host,
    parse_cgroup_mounts,
    parse_counter,
    render_cgroup_settings,
    v2_host,
)
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.limits import (
    ExecutorLimits,
    LimitMechanism,
    LimitsPlan,
    apply_rlimits,
    describe_enforcement,
    enter_cgroups,
    summarize_enforcement,
)
from bash_sandbox.linux.rlimits import (
    HELD_FDS_TOP,
    RLIM_INFINITY,
    RlimitSetting,
    descriptor_room,
    render_rlimits,
)
from policies import LimitExceeded, ResourceLimits, SandboxEnforcement

# This host's own files, abridged: a hybrid host (v1 controllers, an empty v2).
HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "8:pids:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n"
UNIFIED_MOUNTINFO = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
GiB = 1 << 30


def everything_writable(path: str) -> bool:
    return True


def nothing_writable(path: str) -> bool:
    return False


def no_files(path: str) -> str | None:
    return None


def test_hybrid_host_uses_the_v1_controllers_below_our_own_cgroups() -> None:
    host = detect_cgroup_host(
        HYBRID_CGROUP, HYBRID_MOUNTINFO, read=lambda p: "x", writable=everything_writable
    )
    assert host.version is CgroupVersion.V1
    assert host.bases == (
        CgroupBase("/sys/fs/cgroup/memory/process_api/abc", ("memory",)),
        CgroupBase("/sys/fs/cgroup/pids", ("pids",)),
        CgroupBase("/sys/fs/cgroup/cpu", ("cpu",)),
    )
    assert host.swap_accounting


def test_unwritable_v1_cgroups_are_missing_with_the_reason() -> None:
    host = detect_cgroup_host(
        HYBRID_CGROUP, HYBRID_MOUNTINFO, read=no_files, writable=nothing_writable
    )
    assert host.bases == ()
    assert host.why_missing("pids") == "/sys/fs/cgroup/pids is not writable by this user"


def test_a_cgroup_namespace_mount_root_maps_our_path_below_the_mount_point() -> None:
    mountinfo = "40 31 0:36 /ci/job /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    host = detect_cgroup_host(
        "3:pids:/ci/job/step\n", mountinfo, read=no_files, writable=everything_writable
    )
    assert host.bases == (CgroupBase("/sys/fs/cgroup/pids/step", ("pids",)),)
    outside = detect_cgroup_host(
        "3:pids:/elsewhere\n", mountinfo, read=no_files, writable=everything_writable
    )
    assert outside.bases == ()


def test_v2_uses_only_the_controllers_our_cgroup_delegates() -> None:
    files = {
        "/sys/fs/cgroup/user.slice/app/cgroup.subtree_control": "memory pids\n",
        "/sys/fs/cgroup/user.slice/app/memory.swap.max": "max\n",
    }
    host = detect_cgroup_host(
        "0::/user.slice/app\n", UNIFIED_MOUNTINFO, read=files.get, writable=everything_writable
    )
    assert host.version is CgroupVersion.V2
    assert host.bases == (CgroupBase("/sys/fs/cgroup/user.slice/app", ("memory", "pids")),)
    assert "delegate the cpu controller" in host.why_missing("cpu")
    assert host.swap_accounting


def test_v2_root_may_hand_out_its_own_controllers() -> None:
    files = {"/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids\n"}
    host = v2_host("/sys/fs/cgroup", is_root=True, read=files.get, writable=everything_writable)
    assert host.bases == (CgroupBase("/sys/fs/cgroup", ("memory", "pids", "cpu")),)


def test_v2_without_delegation_is_unusable() -> None:
    host = detect_cgroup_host(
        "0::/user.slice/session-1.scope\n",
        UNIFIED_MOUNTINFO,
        read=lambda p: "",
        writable=everything_writable,
    )
    assert host.bases == () and host.controllers == frozenset()


def test_parse_cgroup_mounts_unescapes_paths() -> None:
    (mount,) = parse_cgroup_mounts(
        "40 31 0:36 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids\n"
    )
    assert mount.mount_point == "/sys/fs/cgroup/my pids"
    assert mount.controllers == ("pids",)


def test_v1_settings_bound_memory_with_swap_processes_and_cpu_quota() -> None:
    limits = ResourceLimits(memory_bytes=GiB, processes=100, cpu_cores=1.5)
    settings = render_cgroup_settings(
        limits, CgroupVersion.V1, ("memory", "pids", "cpu"), swap_accounting=True
    )
    assert settings == (
        CgroupSetting("memory", "memory.limit_in_bytes", str(GiB)),
        CgroupSetting("memory", "memory.memsw.limit_in_bytes", str(GiB)),
        CgroupSetting("pids", "pids.max", "100"),
        CgroupSetting("cpu", "cpu.cfs_period_us", "100000"),
        CgroupSetting("cpu", "cpu.cfs_quota_us", "150000"),
    )


def test_v2_settings_forbid_swap_and_write_cpu_max() -> None:
    limits = ResourceLimits(memory_bytes=GiB, processes=100, cpu_cores=0.5)
    settings = render_cgroup_settings(
        limits, CgroupVersion.V2, ("memory", "pids", "cpu"), swap_accounting=True
    )
    assert settings == (
        CgroupSetting("memory", "memory.max", str(GiB)),
        CgroupSetting("memory", "memory.swap.max", "0"),
        CgroupSetting("pids", "pids.max", "100"),
        CgroupSetting("cpu", "cpu.max", "50000 100000"),
    )


def test_settings_skip_unset_limits_and_missing_controllers() -> None:
    limits = ResourceLimits(memory_bytes=None, processes=10)
    assert (
        render_cgroup_settings(limits, CgroupVersion.V1, ("memory", "cpu"), swap_accounting=True)
        == ()
    )


def _current(values: dict[int, tuple[int, int]]):  # type: ignore[no-untyped-def]
    return lambda res: values.get(res, (RLIM_INFINITY, RLIM_INFINITY))


def test_rlimits_cover_what_no_cgroup_does_and_never_exceed_our_hard_limits() -> None:
    limits = ResourceLimits(memory_bytes=GiB, processes=500, open_files=4096, cpu_seconds=30)
    current = _current({resource.RLIMIT_NOFILE: (1024, 2048), resource.RLIMIT_NPROC: (300, 300)})
    settings = render_rlimits(limits, cgroup_controllers=frozenset(), current=current)
    # NPROC is already below 500 and NOFILE's hard limit below 4096 (its soft one stays the
    # select()-safe 1024): both unchanged, so not set again; never raised.
    assert settings == (
        RlimitSetting(resource.RLIMIT_DATA, GiB, GiB),
        RlimitSetting(resource.RLIMIT_CPU, 30, 31),
    )
    with_cgroups = render_rlimits(
        limits, cgroup_controllers=frozenset({"memory", "pids"}), current=current
    )
    assert [s.name for s in with_cgroups] == ["cpu"]


def test_open_files_lowers_the_hard_limit_and_the_soft_one_only_when_above_it() -> None:
    limits = ResourceLimits(open_files=512)
    current = _current({resource.RLIMIT_NOFILE: (1024, 524288)})
    settings = render_rlimits(
        limits, cgroup_controllers=frozenset({"memory", "pids"}), current=current
    )
    assert settings == (RlimitSetting(resource.RLIMIT_NOFILE, 512, 512),)


def _plan(**kw: object) -> LimitsPlan:
    base: dict[str, object] = {
        "command_id": "c",
        "limits": ResourceLimits(),
        "procs_files": (),
        "rlimits": (),
        "cgroups": (),
        "enforcement": (),
    }
    base.update(kw)
    return LimitsPlan(**base)  # type: ignore[arg-type]


def test_a_plan_becomes_cgroup_entries_and_setrlimit_steps_of_the_child() -> None:
    plan = _plan(
        procs_files=("/cg/pids/x/cgroup.procs", "/cg/memory/x/cgroup.procs"),
        rlimits=(
            RlimitSetting(resource.RLIMIT_NPROC, 64, 64),
            RlimitSetting(resource.RLIMIT_CPU, 5, 6),
        ),
    )
    setup = ChildSetup()
    enter_cgroups(setup, plan)
    apply_rlimits(setup, plan)
    assert setup.step_names() == (
        "write /cg/pids/x/cgroup.procs",
        "write /cg/memory/x/cgroup.procs",
        f"rlimit {resource.RLIMIT_NPROC}",
        f"rlimit {resource.RLIMIT_CPU}",
    )
    empty = ChildSetup()
    enter_cgroups(empty, _plan())
    apply_rlimits(empty, _plan())
    assert not empty, "a plan without cgroups or rlimits adds no step"


V1_ALL = CgroupHost(
    CgroupVersion.V1,
    (CgroupBase("/m", ("memory",)), CgroupBase("/p", ("pids",)), CgroupBase("/c", ("cpu",))),
    swap_accounting=True,
)
NO_CGROUPS = CgroupHost(CgroupVersion.V1, (), (("memory", "ro"), ("pids", "ro"), ("cpu", "ro")))


def _by_limit(host: CgroupHost, limits: ResourceLimits, **kw: bool) -> dict[str, object]:
    return {e.limit: e for e in describe_enforcement(limits, host, **kw)}


def test_with_v1_cgroups_every_limit_is_full() -> None:
    report = describe_enforcement(ResourceLimits(cpu_cores=1.0), V1_ALL, nproc_exempt=True)
    mechanisms = {e.limit: e.mechanism for e in report}
    assert mechanisms["memory"] is LimitMechanism.CGROUP_V1
    assert mechanisms["processes"] is LimitMechanism.CGROUP_V1
    assert mechanisms["cpu"] is LimitMechanism.CGROUP_V1
    assert mechanisms["open-files"] is LimitMechanism.RLIMIT_PER_PROCESS
    assert mechanisms["tmp-space"] is LimitMechanism.TMPFS_SIZE
    assert summarize_enforcement(report) is SandboxEnforcement.FULL


def test_root_without_cgroups_cannot_bound_processes() -> None:
    report = describe_enforcement(ResourceLimits(), NO_CGROUPS, nproc_exempt=True)
    processes = next(e for e in report if e.limit == "processes")
    assert processes.mechanism is LimitMechanism.NOT_ENFORCED and not processes.full
    assert summarize_enforcement(report) is SandboxEnforcement.PARTIAL


def test_unprivileged_processes_are_per_tree_only_in_an_own_user_namespace() -> None:
    own = describe_enforcement(ResourceLimits(), NO_CGROUPS, nproc_exempt=False)
    shared = describe_enforcement(
        ResourceLimits(), NO_CGROUPS, nproc_exempt=False, own_user_namespace=False
    )
    own_p = next(e for e in own if e.limit == "processes")
    shared_p = next(e for e in shared if e.limit == "processes")
    assert own_p.mechanism is LimitMechanism.RLIMIT_PER_USER_NAMESPACE and own_p.full
    assert not shared_p.full
    memory = next(e for e in own if e.limit == "memory")
    assert memory.mechanism is LimitMechanism.RLIMIT_PER_PROCESS and not memory.full
    # Memory per process only: the layer as a whole is partial, and says so.
    assert summarize_enforcement(own) is SandboxEnforcement.PARTIAL


def test_limits_switched_off_do_not_make_the_report_partial() -> None:
    limits = ResourceLimits(memory_bytes=None, processes=None, open_files=None)
    report = describe_enforcement(limits, NO_CGROUPS, nproc_exempt=True)
    assert summarize_enforcement(report) is SandboxEnforcement.FULL


def _counter_tree(tmp_path: Path, files: dict[str, str]) -> LimitsPlan:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return _plan(
        limits=ResourceLimits(cpu_seconds=5),
        cgroups=(("memory", str(tmp_path)), ("pids", str(tmp_path))),
    )


def test_outcome_reads_kernel_counters_first(tmp_path: Path) -> None:
    limits = ExecutorLimits(V1_ALL)
    quiet = {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
             "pids.events": "max 0\n"}  # fmt: skip
    plan = _counter_tree(tmp_path, quiet)
    assert limits.outcome(plan, exit_code=0, signal=None) is None
    assert limits.outcome(plan, exit_code=1, signal=None) is None
    # cgroup-enforced limits are never guessed from text.
    assert limits.outcome(plan, exit_code=1, signal=None, stderr_text="MemoryError") is None
    xcpu = limits.outcome(plan, exit_code=None, signal="SIGXCPU")
    assert xcpu is LimitExceeded.CPU_TIME
    folded = limits.outcome(plan, exit_code=128 + signal.SIGXCPU, signal=None)
    assert folded is LimitExceeded.CPU_TIME
    (tmp_path / "pids.events").write_text("max 3\n")
    assert limits.outcome(plan, exit_code=1, signal=None) is LimitExceeded.PROCESSES
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert limits.outcome(plan, exit_code=None, signal="SIGKILL") is LimitExceeded.MEMORY


def test_outcome_never_names_a_limit_from_the_commands_text() -> None:
    # Without cgroups the memory, process and open-files limits are rlimits: no counter, and
    # the command's own text is no evidence (it could print any of these and exit 1).
    limits = ExecutorLimits(NO_CGROUPS)
    plan = _plan()
    for text in (
        "python3: MemoryError",
        "bash: fork: retry: Resource temporarily unavailable",
        "BlockingIOError: [Errno 11] Resource temporarily unavailable",
        "OSError: [Errno 24] Too many open files: 'x'",
    ):
        assert limits.outcome(plan, exit_code=1, signal=None, stderr_text=text) is None
    assert limits.outcome(plan, exit_code=None, signal="SIGXCPU") is None  # no cpu_seconds


def test_counters_parse_flat_keyed_files() -> None:
    assert parse_counter("low 0\nhigh 2\nmax 5\noom 1\noom_kill 4\n", "oom_kill") == 4
    assert parse_counter(None, "max") == 0


def test_prepare_on_a_v2_tree_enables_controllers_and_writes_limits(tmp_path: Path) -> None:
    base = tmp_path / "delegated"
    base.mkdir()
    host = CgroupHost(CgroupVersion.V2, (CgroupBase(str(base), ("memory", "pids", "cpu")),))
    limits = ExecutorLimits(host)
    plan = limits.prepare("one", ResourceLimits(memory_bytes=GiB, processes=99, cpu_cores=2.0))
    (parent,) = [p for p in base.iterdir() if p.name.startswith(f"bash-sandbox-{os.getpid()}-")]
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    command = parent / "cmd-1"
    assert plan.procs_files == (str(command / "cgroup.procs"),)
    assert plan.cgroups == tuple((c, str(command)) for c in ("memory", "pids", "cpu"))
    assert (command / "memory.max").read_text() == str(GiB)
    assert (command / "pids.max").read_text() == "99"
    assert (command / "cpu.max").read_text() == "200000 100000"
    # No memory.swap.max appeared on the parent: no swap accounting, nothing written.
    assert not (command / "memory.swap.max").exists()
    assert plan.rlimits == () or all(r.name in ("nofile", "cpu") for r in plan.rlimits)
    for directory in (command, parent):
        for f in directory.iterdir():
            if f.is_file():
                f.unlink()
    limits.close()
    assert list(base.iterdir()) == []


def test_prepare_on_v1_joins_through_tasks_of_each_hierarchy(tmp_path: Path) -> None:
    """v1: the child writes "0" into ``tasks``, which moves its one thread without the
    global threadgroup lock (cgroup.procs waits an RCU grace period, 8-28 ms a command)."""
    bases = [tmp_path / c for c in ("memory", "pids")]
    for base in bases:
        base.mkdir()
    host = CgroupHost(
        CgroupVersion.V1,
        (CgroupBase(str(bases[0]), ("memory",)), CgroupBase(str(bases[1]), ("pids",))),
    )
    limits = ExecutorLimits(host)
    plan = limits.prepare("one", ResourceLimits(memory_bytes=GiB, processes=99))
    commands = [next(b.iterdir()) / "cmd-1" for b in bases]
    assert plan.procs_files == tuple(str(c / "tasks") for c in commands)
    assert (commands[1] / "pids.max").read_text() == "99"
    for command in commands:
        for f in command.iterdir():
            f.unlink()
    limits.close()
    assert [list(b.iterdir()) for b in bases] == [[], []]


def test_a_refused_parent_falls_back_to_rlimits_and_says_so(tmp_path: Path) -> None:
    host = CgroupHost(CgroupVersion.V1, (CgroupBase(str(tmp_path / "gone"), ("pids",)),))
    limits = ExecutorLimits(host)
    plan = limits.prepare("x", ResourceLimits(processes=50))
    assert plan.procs_files == () and plan.cgroups == ()
    assert any(r.resource == resource.RLIMIT_NPROC for r in plan.rlimits)
    assert limits.warnings and "fall back to rlimits" in limits.warnings[0]
    processes = next(e for e in plan.enforcement if e.limit == "processes")
    assert processes.mechanism is not LimitMechanism.CGROUP_V1
    limits.close()


def test_resource_limits_reject_nonsense() -> None:
    with pytest.raises(ValidationError):
        ResourceLimits(cpu_cores=0.001)
    with pytest.raises(ValidationError):
        ResourceLimits(processes=0)
    with pytest.raises(ValidationError):
        ResourceLimits(memory=1)  # type: ignore[call-arg]
    assert ResourceLimits().processes == 4096


def test_the_child_makes_room_for_its_held_descriptors_and_gives_the_limit_back() -> None:
    nofile = resource.RLIMIT_NOFILE

    def limits(soft: int, hard: int) -> Callable[[int], tuple[int, int]]:
        return lambda res: (soft, hard) if res == nofile else (RLIM_INFINITY, RLIM_INFINITY)

    assert descriptor_room(limits(1024, 4096)) is None  # room already (1000 and 1001 fit)
    assert descriptor_room(limits(200, 20000)) == (
        RlimitSetting(nofile, HELD_FDS_TOP + 1, 20000),
        RlimitSetting(nofile, 200, 20000),
    )
    # A hard limit below the held descriptors: raised too (root's CAP_SYS_RESOURCE), then
    # given back as it was.
    assert descriptor_room(limits(200, 200)) == (
        RlimitSetting(nofile, HELD_FDS_TOP + 1, HELD_FDS_TOP + 1),
        RlimitSetting(nofile, 200, 200),
    )
