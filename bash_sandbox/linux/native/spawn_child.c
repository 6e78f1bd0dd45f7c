/* The spawn helper's compiled child (setup.py builds it, `compiled_child.py` loads it and
 * encodes the steps, `spawn_helper.py` calls it).
 *
 * The helper starts one child per command; the child places the command's descriptors,
 * runs the command's setup steps (`child_setup.py`: namespaces, mounts, Landlock, seccomp,
 * limits) and execs. In Python that child is a copy of an interpreter: every object it
 * touches is a copy-on-write fault. Here the child runs only this file. It decides nothing:
 * the steps were built by `ChildSetup` in the helper (every argument a number or a pointer
 * into the helper's own memory), and each runs exactly as its Python twin would, with the
 * same tolerated errnos and the same failure reports (`_child` in `spawn_helper.py`,
 * `ChildSetup.__call__`).
 *
 * Not a fork: the child, and the namespace's PID 1 it starts at the waiter step, are
 * clone(CLONE_VM | CLONE_VFORK) on stacks of their own, as posix_spawn starts a child. A
 * fork marks every page of the helper copy-on-write, and the helper then faulted on each
 * page it wrote (550 faults a command, measured); sharing the memory copies nothing. The
 * parent of each is suspended until it execs or exits, so one process at a time runs on
 * the helper's memory: the child until PID 1 is started, PID 1 until it execs, then the
 * child until it execs the waiter (`sandbox_init.c --wait`). Without that init to exec,
 * the child would wait on the helper's memory for the whole command: it is forked. Only
 * async-signal-safe calls run before the exec, with every signal blocked until the
 * handlers the helper set are back to the defaults.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Mirrors `compiled_child.OPS` (the order is the numbering). */
enum {
    BSC_PRCTL,
    BSC_SETNS,
    BSC_UNSHARE,
    BSC_MOUNT,
    BSC_UMOUNT2,
    BSC_SYMLINK,
    BSC_MKDIR,
    BSC_CHDIR,
    BSC_PRLIMIT,
    BSC_CLOSE,
    BSC_SYSCALL,
    BSC_CREATE_FILE,
    BSC_WRITE_FILE,
    BSC_PARENT_IS,
    BSC_LANDLOCK_ALLOW,
    BSC_HOLD,
    BSC_FORK_WAITER,
    BSC_SECCOMP_LISTENER,
};

#define BSC_MAX_OK 4
#define BSC_MAX_ARGS 6
#define BSC_MAX_FDS 256
/* Each process that runs on the helper's memory has a stack of its own (the child and PID 1). */
#define BSC_STACK_SIZE (128 * 1024)
#define BSC_REPORT_NAME 4096
#define BSC_SYS_LANDLOCK_ADD_RULE 445
#define BSC_LANDLOCK_RULE_PATH_BENEATH 1
#define BSC_SECCOMP_SET_MODE_FILTER 1
#define BSC_SECCOMP_FILTER_FLAG_NEW_LISTENER (1UL << 3)

/* Mirrors `compiled_child.Step`: one `_Step` of `child_setup.py`. */
struct bsc_step {
    int32_t op;
    int32_t n_ok;
    int32_t ok[BSC_MAX_OK];
    const char *what; /* the step's name, as the report names it */
    uint64_t what_len;
    uint64_t a[BSC_MAX_ARGS];
};

/* `compiled_child._STEP` packs it without padding. */
_Static_assert(sizeof(struct bsc_step) == 88, "struct bsc_step must match compiled_child.Step");

/* Mirrors `compiled_child.Request`: one spawn request of the helper. */
struct bsc_request {
    const int32_t *fds; /* stdin, stdout, stderr, then one per target */
    const int32_t *targets;
    const int32_t *inheritable; /* per target: 1 when it stays open across exec */
    int32_t ntargets;
    int32_t err_w; /* the exec-status pipe: "where:errno" on failure, closed by exec */
    int32_t report_fd;
    int32_t nsteps;
    const struct bsc_step *steps;
    const char *cwd;
    char *const *argv;
    char *const *envp;
};

struct bsc_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define P(x) ((void *)(uintptr_t)(x))

static int create_file(const struct bsc_step *s) {
    int fd = open(P(s->a[0]), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)s->a[1]);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int write_file(const struct bsc_step *s) {
    int fd = open(P(s->a[0]), O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, P(s->a[1]), (size_t)s->a[2]);
    close(fd);
    return n == (ssize_t)s->a[2] ? 0 : -1;
}

static int landlock_allow(const struct bsc_step *s) {
    int fd = open(P(s->a[0]), O_PATH | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct bsc_path_beneath rule = {s->a[2], fd};
    long rc = syscall(BSC_SYS_LANDLOCK_ADD_RULE, (int)s->a[1], BSC_LANDLOCK_RULE_PATH_BENEATH,
                      &rule, 0);
    close(fd);
    return rc == 0 ? 0 : -1;
}

static int hold(const struct bsc_step *s) {
    int fd = open(P(s->a[0]), (int)s->a[2]);
    if (fd < 0)
        return -1;
    int ok = dup3(fd, (int)s->a[1], O_CLOEXEC);
    close(fd);
    return ok == (int)s->a[1] ? 0 : -1;
}

static void close_from(int low, int high) {
    if (low > high)
        return;
    if (syscall(SYS_close_range, (unsigned)low, (unsigned)high, 0) == 0)
        return;
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = low; fd <= high && fd < (max > 0 ? max : 1024); fd++)
        close((int)fd);
}

/* Where PID 1 goes on: the steps after the waiter step, and the liveness pipe. */
struct bsc_resume {
    const struct bsc_request *r;
    int err_w;
    int first;
    int live_r;
    int live_w;
};

static void __attribute__((noreturn)) run_from(const struct bsc_request *r, int err_w, int first,
                                               char *stack);
static void __attribute__((noreturn)) step_failed(const struct bsc_request *r, int err_w, int i,
                                                  int code);

/* PID 1 of the namespace unshared before: arms its PDEATHSIG, checks that the waiter was
 * still alive then (else it was reparented and would never get the signal), goes on. */
static int pid1_entry(void *arg) {
    const struct bsc_resume *at = arg;
    close(at->live_w);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        step_failed(at->r, at->err_w, at->first - 1, errno);
    struct pollfd alive = {at->live_r, POLLIN, 0};
    if (poll(&alive, 1, 0) != 0)
        _exit(125); /* the waiter died before our PDEATHSIG was armed */
    close(at->live_r);
    run_from(at->r, at->err_w, at->first, NULL);
}

/* `_ForkWaiter` at step ``i``: this process starts PID 1 on ``stack`` (PID 1 runs the
 * remaining steps) and, once PID 1 has exec'd, waits for it and exits with its status
 * (128+n for signal n). With the init held at ``a[0]`` it execs that to wait (`--wait`),
 * holding none of the helper's memory meanwhile. Returns only on failure. */
static int fork_waiter(const struct bsc_request *r, int err_w, int i, char *stack) {
    int init_fd = (int)r->steps[i].a[0];
    int pipe_fds[2];
    if (stack == NULL) {
        errno = EINVAL; /* a second waiter step: PID 1 has no stack for another */
        return -1;
    }
    if (pipe2(pipe_fds, O_CLOEXEC) < 0)
        return -1;
    struct bsc_resume at = {r, err_w, i + 1, pipe_fds[0], pipe_fds[1]};
    pid_t pid = clone(pid1_entry, stack + BSC_STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD, &at);
    if (pid < 0) {
        int code = errno;
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        errno = code;
        return -1;
    }
    close(pipe_fds[0]);
    /* The helper's handlers back to the defaults (an exec would keep what it ignores). */
    for (int sig = 1; sig < 65; sig++)
        signal(sig, SIG_DFL);
    int keep = pipe_fds[1];
    if (init_fd >= 0) {
        int low = init_fd < keep ? init_fd : keep, high = init_fd < keep ? keep : init_fd;
        close_from(0, low - 1);
        close_from(low + 1, high - 1);
        close_from(high + 1, 0x7fffffff);
        /* The liveness pipe stays open across the exec; the init's descriptor does not. */
        if (fcntl(keep, F_SETFD, 0) == 0) {
            static char *const wait_argv[] = {"sandbox-waiter", "--wait", NULL};
            static char *const no_env[] = {NULL};
            fexecve(init_fd, wait_argv, no_env);
        }
        close(init_fd); /* not exec'd: wait here instead */
    } else {
        close_from(0, keep - 1);
        close_from(keep + 1, 0x7fffffff);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) != pid)
        if (errno != EINTR)
            _exit(125);
    _exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
}

/* `_SeccompListener`: install the filter with a listener, send it, close both. */
static int seccomp_listener(const struct bsc_step *s) {
    int sock = (int)s->a[1];
    int fd = (int)syscall(SYS_seccomp, BSC_SECCOMP_SET_MODE_FILTER,
                          BSC_SECCOMP_FILTER_FLAG_NEW_LISTENER, P(s->a[0]));
    if (fd < 0)
        return -1;
    char byte = 'L';
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof(control));
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    ssize_t sent = sendmsg(sock, &msg, 0);
    close(fd);
    close(sock);
    return sent == 1 ? 0 : -1;
}

static long run_step(const struct bsc_step *s) {
    const uint64_t *a = s->a;
    switch (s->op) {
    case BSC_PRCTL:
        return prctl((int)a[0], a[1], a[2], a[3], a[4]);
    case BSC_SETNS:
        return setns((int)a[0], (int)a[1]);
    case BSC_UNSHARE:
        return unshare((int)a[0]);
    case BSC_MOUNT:
        return mount(P(a[0]), P(a[1]), P(a[2]), a[3], P(a[4]));
    case BSC_UMOUNT2:
        return umount2(P(a[0]), (int)a[1]);
    case BSC_SYMLINK:
        return symlink(P(a[0]), P(a[1]));
    case BSC_MKDIR:
        return mkdir(P(a[0]), (mode_t)a[1]);
    case BSC_CHDIR:
        return chdir(P(a[0]));
    case BSC_PRLIMIT:
        return prlimit((pid_t)a[0], (int)a[1], P(a[2]), P(a[3]));
    case BSC_CLOSE:
        return close((int)a[0]);
    case BSC_SYSCALL:
        return syscall((long)a[0], a[1], a[2], a[3], a[4], a[5]);
    case BSC_CREATE_FILE:
        return create_file(s);
    case BSC_WRITE_FILE:
        return write_file(s);
    case BSC_PARENT_IS:
        if (getppid() != (pid_t)a[0])
            _exit(125);
        return 0;
    case BSC_LANDLOCK_ALLOW:
        return landlock_allow(s);
    case BSC_HOLD:
        return hold(s);
    case BSC_FORK_WAITER: /* `run_from` runs it: it needs the request */
        break;
    case BSC_SECCOMP_LISTENER:
        return seccomp_listener(s);
    }
    errno = EINVAL;
    return -1;
}

/* "where:errno" on the exec-status pipe, then out (`_child`'s except clause). */
static void fail(int err_w, const char *where, int code) {
    char msg[32];
    size_t n = strlen(where);
    memcpy(msg, where, n);
    msg[n++] = ':';
    char digits[12];
    int d = 0;
    unsigned value = (unsigned)code;
    do {
        digits[d++] = (char)('0' + value % 10);
        value /= 10;
    } while (value && d < (int)sizeof(digits));
    while (d)
        msg[n++] = digits[--d];
    (void)!write(err_w, msg, n);
    _exit(255);
}

static void __attribute__((noreturn)) child(const struct bsc_request *r, char *stack) {
    int err_w = r->err_w;
    int moved[BSC_MAX_FDS];
    int nfds = 3 + r->ntargets;
    if (nfds > BSC_MAX_FDS || setsid() < 0)
        fail(err_w, "cwd", nfds > BSC_MAX_FDS ? EMFILE : errno);
    /* Every descriptor first above the highest number it will be placed at. */
    int high = err_w > 2 ? err_w : 2;
    for (int i = 0; i < r->ntargets; i++)
        high = r->targets[i] > high ? r->targets[i] : high;
    high += 1;
    int err = fcntl(err_w, F_DUPFD_CLOEXEC, high);
    if (err < 0)
        fail(err_w, "cwd", errno);
    err_w = err;
    for (int i = 0; i < nfds; i++)
        if ((moved[i] = fcntl(r->fds[i], F_DUPFD_CLOEXEC, high)) < 0)
            fail(err_w, "cwd", errno);
    for (int i = 0; i < 3; i++)
        if (dup2(moved[i], i) < 0)
            fail(err_w, "cwd", errno);
    for (int i = 0; i < r->ntargets; i++) {
        int placed = r->inheritable[i] ? dup2(moved[3 + i], r->targets[i])
                                       : dup3(moved[3 + i], r->targets[i], O_CLOEXEC);
        if (placed < 0)
            fail(err_w, "cwd", errno);
    }
    /* Close all but 0-2, the targets and the status pipe: the gaps between kept numbers. */
    int low = 3;
    for (;;) {
        int next = err_w >= low ? err_w : -1;
        for (int i = 0; i < r->ntargets; i++)
            if (r->targets[i] >= low && (next < 0 || r->targets[i] < next))
                next = r->targets[i];
        if (next < 0)
            break;
        close_from(low, next - 1);
        low = next + 1;
    }
    close_from(low, 0x7fffffff);
    if (chdir(r->cwd) < 0)
        fail(err_w, "cwd", errno);
    /* The helper ignores SIGPIPE and SIGXFSZ (Python does); a command starts with both. */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    run_from(r, err_w, 0, stack);
}

/* Step ``i`` failed with ``code``: (errno, step) on the report pipe, as
 * `ChildSetup.__call__` writes it (the reader takes at most 4 + BSC_REPORT_NAME bytes,
 * `child_failure._RECORD_MAX`), then "step:N" and out. */
static void step_failed(const struct bsc_request *r, int err_w, int i, int code) {
    const struct bsc_step *s = &r->steps[i];
    if (r->report_fd >= 0) {
        char report[4 + BSC_REPORT_NAME];
        size_t len = s->what_len < BSC_REPORT_NAME ? (size_t)s->what_len : BSC_REPORT_NAME;
        uint32_t le = (uint32_t)code;
        for (int b = 0; b < 4; b++)
            report[b] = (char)((le >> (8 * b)) & 0xff);
        memcpy(report + 4, s->what, len);
        (void)!write(r->report_fd, report, 4 + len);
    }
    fail(err_w, "step", code);
}

/* The steps from ``first`` on, then the exec; ``stack``: PID 1's, for the waiter step. */
static void run_from(const struct bsc_request *r, int err_w, int first, char *stack) {
    for (int i = first; i < r->nsteps; i++) {
        const struct bsc_step *s = &r->steps[i];
        long done = s->op == BSC_FORK_WAITER ? fork_waiter(r, err_w, i, stack) : run_step(s);
        if (done != -1)
            continue;
        int code = errno;
        int tolerated = 0;
        for (int k = 0; k < s->n_ok && k < BSC_MAX_OK; k++)
            tolerated |= s->ok[k] == code;
        if (!tolerated)
            step_failed(r, err_w, i, code);
    }
    execve(r->argv[0], r->argv, r->envp);
    fail(err_w, "exec", errno);
}

struct bsc_start {
    const struct bsc_request *r;
    const sigset_t *mask;
    char *pid1_stack;
};

/* The child, on the helper's memory: it dies with the thread that started it (a child
 * stuck in a step when the helper goes), every handler the helper set back to the default
 * (a signal must not run the helper's code here), the helper's mask back, then the steps. */
static int child_entry(void *arg) {
    const struct bsc_start *start = arg;
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    for (int sig = 1; sig < 65; sig++) {
        struct sigaction action;
        if (sigaction(sig, NULL, &action) == 0 && action.sa_handler != SIG_DFL &&
            action.sa_handler != SIG_IGN)
            signal(sig, SIG_DFL);
    }
    sigprocmask(SIG_SETMASK, start->mask, NULL);
    child(start->r, start->pid1_stack);
}

/* A waiter step with no init to exec would wait on the helper's memory, holding the helper
 * suspended for the whole command: that child is forked instead. */
static int waits_in_place(const struct bsc_request *r) {
    for (int i = 0; i < r->nsteps; i++)
        if (r->steps[i].op == BSC_FORK_WAITER && (int)r->steps[i].a[0] < 0)
            return 1;
    return 0;
}

/* Start the child; returns its pid (once it has exec'd or exited, unless forked), or -1
 * with errno. */
pid_t bsc_spawn(const struct bsc_request *r) {
    /* Both stacks of this thread's spawns (the helper's threads may start children at once;
     * each thread one at a time). Kept: mapping them afresh cost page faults and a TLB
     * shootdown a spawn. */
    static __thread char *stacks;
    if (stacks == NULL && (stacks = malloc(2 * BSC_STACK_SIZE)) == NULL)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    struct bsc_start start = {r, &old, stacks + BSC_STACK_SIZE};
    int flags = waits_in_place(r) ? SIGCHLD : CLONE_VM | CLONE_VFORK | SIGCHLD;
    pid_t pid = clone(child_entry, stacks + BSC_STACK_SIZE, flags, &start);
    int code = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = code;
    return pid;
}

/* The hash of this file as setup.py built it: `native_build.py` loads no build of another. */
#ifndef BSC_SOURCE_SHA256
#define BSC_SOURCE_SHA256 ""
#endif
const char *bsc_source_sha256(void) { return BSC_SOURCE_SHA256; }
