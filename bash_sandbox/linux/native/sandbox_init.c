/*
 * PID 1 of a Landlock-confined command's PID namespace (`linux/sandbox_init.py`).
 *
 * `sandbox-init PROGRAM ARG...` runs PROGRAM (an absolute path) as its child, reaps every
 * process the namespace orphans onto it, and exits with the child's status (128+n when
 * signal n ended it), which ends the namespace and everything left in it. `sandbox-init
 * --wait` only waits for the child it already has (the helper's waiter, below). The command cannot
 * be PID 1 itself: PID 1 ignores every signal it has no handler for, so `kill $$` would do
 * nothing. The bash wrapper this replaces did the same in a shell.
 *
 * It writes nothing (the command's stderr is the command's) and installs no handler, so
 * nothing inside the namespace can signal it.
 *
 * Built without libc (`-nostdlib -static`, five system calls): a libc's start-up costs more
 * than the init's whole work (the dynamic loader, and glibc's cache-size probe, a loop of
 * `cpuid`, which traps to the hypervisor on a VM: 0.5 ms a command measured with perf).
 * Where the architecture is not one below, the build fails and a bash is PID 1.
 */

#define SIGCHLD 17
#define PR_SET_NAME 15
#define ENOENT 2
#define EINTR 4

#if defined(__x86_64__)
#define SYS_clone 56
#define SYS_execve 59
#define SYS_wait4 61
#define SYS_prctl 157
#define SYS_exit_group 231
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call init_main\n"
        "  hlt\n");

static long sys(long n, long a, long b, long c, long d) {
    register long r10 __asm__("r10") = d;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
#define SYS_clone 220
#define SYS_execve 221
#define SYS_wait4 260
#define SYS_prctl 167
#define SYS_exit_group 94
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  mov x0, sp\n"
        "  bl init_main\n"
        "  brk #0\n");

static long sys(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
#else
#error "sandbox-init is built for x86_64 and aarch64 only (elsewhere a bash is PID 1)"
#endif

static void __attribute__((noreturn)) leave(int code) {
    for (;;)
        sys(SYS_exit_group, code, 0, 0, 0);
}

/* Reap until ``child`` (any child when -1) ends; exit with its status, 128+n for signal n. */
static void __attribute__((noreturn)) wait_for(long child) {
    for (;;) {
        int status = 0;
        long pid = sys(SYS_wait4, -1, (long)&status, 0, 0);
        if (pid > 0 && (child < 0 || pid == child)) {
            int signal = status & 0x7f;
            /* Exited: the status's second byte; killed: 128 + the signal. */
            leave(signal ? 128 + signal : (status >> 8) & 0xff);
        }
        if (pid < 0 && pid != -EINTR)
            leave(125);
    }
}

static int is_wait(const char *arg) {
    const char *flag = "--wait";
    for (int i = 0; flag[i]; i++)
        if (arg[i] != flag[i])
            return 0;
    return arg[6] == 0;
}

/* The stack the kernel starts a process with: argc, argv..., NULL, envp..., NULL. */
void __attribute__((noreturn, used)) init_main(long *stack) {
    long argc = stack[0];
    char **argv = (char **)(stack + 1);
    char **envp = argv + argc + 1;
    /* `--wait`: the spawn helper's waiter (`_ForkWaiter`), exec'd so that it stops sharing
     * the helper's memory: its one child is the namespace's PID 1, already running. */
    if (argc == 2 && is_wait(argv[1]))
        wait_for(-1);
    if (argc < 2 || argv[1][0] != '/')
        leave(127);
    /* Exec'd through /proc/self/fd/N, its name would be the number. */
    sys(SYS_prctl, PR_SET_NAME, (long)"sandbox-init", 0, 0);
    /* clone(SIGCHLD) is fork(); the stack and tid arguments are unused (0). */
    long child = sys(SYS_clone, SIGCHLD, 0, 0, 0);
    if (child < 0)
        leave(126);
    if (child == 0) {
        long err = sys(SYS_execve, (long)argv[1], (long)(argv + 1), (long)envp, 0);
        leave(err == -ENOENT ? 127 : 126);
    }
    wait_for(child);
}

/* The hash of this file as setup.py built it (`sandbox_init.py` runs no build of another). */
#ifndef BSI_SOURCE_SHA256
#define BSI_SOURCE_SHA256 ""
#endif
__attribute__((used)) const char bsi_source_sha256[] =
    "bash-sandbox-init-source-sha256:" BSI_SOURCE_SHA256;
