/* The write watch's fast path (setup.py builds it, `fast_writes.py` loads it; `write_watch.py`
 * is the watch itself).
 *
 * One thread per confined command receives its seccomp notifications. A write-intent call
 * whose every path the command's view surely lets be written (inside a writable root and
 * clear of every covered name: `WritePolicy.surely_writable`) is let through at once, as the
 * Python supervisor would after reading its path: judging it could find nothing, and the
 * kernel decides the call either way. Everything else (connect, socket, set-id modes, xattrs,
 * any path outside the fast rules, anything unreadable or unusual) is forwarded untouched, as
 * the raw notification, to the Python supervisor, which answers it exactly as before. A wrong
 * "surely writable" can only lose a fact, never allow a write: this code answers CONTINUE
 * only for calls the filter traps to watch, not to decide. A call of the
 * backend's own binary (bwrap writing its namespaces' uid_map, gid_map and setgroups before
 * the command starts) is never a fact either (`write_watch._is_helper`): answered here too.
 * One refusal is answered here as well: a connect to an absolute unix socket path that does
 * not exist in the command's view gets ENOENT, as the supervisor's `_connect` answers it
 * (glibc probes nscd's socket twice on every first user lookup: bash without SHELL, ls -l,
 * id, git). Refusing lets nothing through; whatever else a connect is goes to Python.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define BSF_PATH_MAX 4096
#define BSF_PAGE 4096
#define BSF_MAX_RULES 256
#define BSF_AT_FDCWD (-100)
#define BSF_NO_ARG (-1)
/* Linux 6.6 (older headers lack them; older kernels refuse the ioctl, which is harmless). */
#define BSF_NOTIF_SET_FLAGS _IOW('!', 4, uint64_t)
#define BSF_SYNC_WAKE_UP 1ULL
/* openat2(2) (Linux 5.6; older headers lack it). */
#define BSF_SYS_OPENAT2 437
#define BSF_RESOLVE_NO_SYMLINKS 0x04
#define BSF_RESOLVE_NO_MAGICLINKS 0x02
#define BSF_RESOLVE_IN_ROOT 0x10
struct bsf_open_how {
    uint64_t flags, mode, resolve;
};
/* Traps in a row from one process before wake-ups turn synchronous (see bsf_serve). */
#define BSF_SYNC_STREAK 8

/* Where one trapped call keeps its arguments (indexes into the six; -1: none). Mirrors
 * `file_calls.FileCall`. */
struct bsf_call {
    int32_t nr;
    int8_t path, dirfd, path2, dirfd2, mode, flags, xattr, write;
};

/* Mirrors `write_watch.WritePolicy` (the parts `surely_writable` and `_is_helper` read). */
struct bsf_rules {
    int read_only;
    int view_mounts;
    int n[6];
    const char *list[6][BSF_MAX_RULES];
};
enum { ROOTS, HIDDEN, GUARDED, PROTECTED, SCRATCH, HELPERS /* "device:inode" */ };
#define BSF_LISTS 6

static int within(const char *path, const char *root) {
    size_t n = strlen(root);
    if (strcmp(path, root) == 0)
        return 1;
    while (n > 0 && root[n - 1] == '/')
        n--;
    return strncmp(path, root, n) == 0 && path[n] == '/';
}

static int within_list(const struct bsf_rules *r, int which, const char *path) {
    for (int i = 0; i < r->n[which]; i++)
        if (within(path, r->list[which][i]))
            return 1;
    return 0;
}

static int is_sink(const char *p) {
    return !strcmp(p, "/dev/null") || !strcmp(p, "/dev/zero") || !strcmp(p, "/dev/full") ||
           !strcmp(p, "/dev/tty");
}

/* `WritePolicy.surely_writable`, line for line. */
int bsf_surely_writable(const struct bsf_rules *r, const char *path) {
    if (!r->view_mounts) {
        if (is_sink(path) || within_list(r, SCRATCH, path))
            return 1;
        return !r->read_only && within_list(r, ROOTS, path);
    }
    if (is_sink(path) || within(path, "/dev/shm"))
        return 1;
    if (within(path, "/tmp") && strcmp(path, "/tmp") != 0) {
        /* The private /tmp, except a host /tmp entry bound back (read-only) for a root. */
        char top[BSF_PATH_MAX];
        const char *end = strchr(path + 5, '/');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len >= sizeof top)
            return 0;
        memcpy(top, path, len);
        top[len] = 0;
        int bound = 0;
        for (int i = 0; i < r->n[ROOTS]; i++)
            if (within(r->list[ROOTS][i], top))
                bound = 1;
        if (!bound)
            return 1;
    }
    if (r->read_only)
        return 0;
    for (int i = 0; i < r->n[ROOTS]; i++) {
        const char *root = r->list[ROOTS][i];
        if (!within(path, root))
            continue;
        if (within_list(r, HIDDEN, path) || within_list(r, GUARDED, path))
            return 0;
        const char *rest = path + strlen(root);
        while (*rest == '/')
            rest++;
        /* `.git` as the whole rest, its first component, or any later component. */
        for (const char *c = rest; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
            if (!strncmp(c, ".git", 4) && (c[4] == '/' || c[4] == 0))
                return 0;
        return !within_list(r, PROTECTED, rest);
    }
    return 0;
}

/* Rules from NUL-separated strings, each of the six lists ended by an empty string (the
 * layout `fast_writes.py` writes). 0: parsed; -1: malformed or too many (no fast path). */
static int parse_rules(struct bsf_rules *r, const char *blob, size_t len, int read_only,
                       int view_mounts) {
    memset(r, 0, sizeof *r);
    r->read_only = read_only;
    r->view_mounts = view_mounts;
    size_t at = 0;
    for (int which = 0; which < BSF_LISTS; which++) {
        for (;;) {
            if (at >= len)
                return -1;
            const char *s = blob + at;
            size_t n = strnlen(s, len - at);
            if (at + n >= len)
                return -1;
            at += n + 1;
            if (n == 0)
                break;
            if (r->n[which] == BSF_MAX_RULES)
                return -1;
            r->list[which][r->n[which]++] = s;
        }
    }
    return 0;
}

/* `proc_paths.read_cstring`: a page at a time, never touching a page past the string. */
static int read_path(pid_t pid, uint64_t address, char *out) {
    size_t have = 0;
    while (have < BSF_PATH_MAX) {
        size_t chunk = BSF_PAGE - (address % BSF_PAGE);
        if (chunk > BSF_PATH_MAX - have)
            chunk = BSF_PATH_MAX - have;
        struct iovec local = {out + have, chunk}, remote = {(void *)(uintptr_t)address, chunk};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got <= 0)
            return -1;
        void *nul = memchr(out + have, 0, (size_t)got);
        if (nul)
            return 0;
        have += (size_t)got;
        address += (uint64_t)got;
    }
    return -1;
}

/* `proc_paths._link`: an absolute, live target, or -1. */
static int read_link(const char *link, char *out, size_t size) {
    ssize_t n = readlink(link, out, size - 1);
    if (n <= 0 || out[0] != '/')
        return -1;
    out[n] = 0;
    static const char deleted[] = " (deleted)";
    size_t d = sizeof deleted - 1;
    if ((size_t)n >= d && !strcmp(out + n - d, deleted))
        return -1;
    return 0;
}

/* `proc_paths.call_path` then `os.path.normpath`; -1 for anything this code does not
 * normalise exactly as Python would (a `..` component, a leading `//`): Python judges it. */
static int absolute(pid_t pid, int dirfd, const char *name, char *out) {
    char joined[2 * BSF_PATH_MAX + 2];
    if (name[0] == '/') {
        snprintf(joined, sizeof joined, "%s", name);
    } else {
        char link[64], base[BSF_PATH_MAX];
        if (dirfd == BSF_AT_FDCWD)
            snprintf(link, sizeof link, "/proc/%d/cwd", (int)pid);
        else
            snprintf(link, sizeof link, "/proc/%d/fd/%d", (int)pid, dirfd);
        if (read_link(link, base, sizeof base) < 0)
            return -1;
        snprintf(joined, sizeof joined, "%s/%s", base, name);
    }
    if (joined[0] == '/' && joined[1] == '/' && joined[2] != '/')
        return -1;
    size_t len = 0;
    char *save = NULL;
    for (char *part = strtok_r(joined, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (!strcmp(part, "."))
            continue;
        if (!strcmp(part, ".."))
            return -1;
        size_t n = strlen(part);
        if (len + 1 + n >= BSF_PATH_MAX)
            return -1;
        out[len++] = '/';
        memcpy(out + len, part, n);
        len += n;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = 0;
    return 0;
}

static int signed_int(uint64_t value) { return (int)(int32_t)(uint32_t)value; }

/* `write_watch.leads_elsewhere`, line for line: whether ``path`` (inside a writable root)
 * goes through a symbolic link, on its way or as its last component, so that the kernel
 * may refuse it where the lexical rules see a root. The host resolves it: inside a root the
 * command's view is the host's own tree. 1 where it cannot tell (a missing directory on the
 * way); 0 without openat2 (the lexical rules alone, as before it). */
int bsf_leads_elsewhere(const char *path) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        return 1;
    char parent[BSF_PATH_MAX];
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof parent)
        return 1;
    memcpy(parent, path, n);
    parent[n] = 0;
    struct bsf_open_how how = {O_PATH | O_DIRECTORY | O_CLOEXEC, 0, BSF_RESOLVE_NO_SYMLINKS};
    int fd = (int)syscall(BSF_SYS_OPENAT2, AT_FDCWD, parent, &how, sizeof how);
    if (fd < 0)
        return errno == ENOSYS ? 0 : 1;
    struct stat st;
    int link = slash[1] && !fstatat(fd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) && S_ISLNK(st.st_mode);
    close(fd);
    return link;
}

static int path_surely_writable(const struct bsf_rules *r, const struct seccomp_notif *n,
                                int path_index, int dirfd_index) {
    char raw[BSF_PATH_MAX], path[BSF_PATH_MAX];
    if (read_path((pid_t)n->pid, n->data.args[path_index], raw) < 0)
        return 0;
    int dirfd = dirfd_index == BSF_NO_ARG ? BSF_AT_FDCWD : signed_int(n->data.args[dirfd_index]);
    if (raw[0] == 0) /* AT_EMPTY_PATH and the like: rare, Python judges them */
        return 0;
    if (absolute((pid_t)n->pid, dirfd, raw, path) < 0)
        return 0;
    if (!bsf_surely_writable(r, path))
        return 0;
    return !(within_list(r, ROOTS, path) && bsf_leads_elsewhere(path));
}

/* `write_watch._is_helper`: whether ``pid`` runs one of the backend's binaries. */
int bsf_is_helper(const struct bsf_rules *r, pid_t pid) {
    char exe[64], id[64];
    struct stat st;
    if (r->n[HELPERS] == 0)
        return 0;
    snprintf(exe, sizeof exe, "/proc/%d/exe", (int)pid);
    if (stat(exe, &st) != 0)
        return 0;
    snprintf(id, sizeof id, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    for (int i = 0; i < r->n[HELPERS]; i++)
        if (!strcmp(r->list[HELPERS][i], id))
            return 1;
    return 0;
}

/* Whether `SeccompSupervisor._connect` would answer this connect ENOENT: ``fd`` is a socket
 * of the caller, the address an absolute unix path, and nothing is at that path in the
 * command's view (resolved in its root, links followed there, as `_resolve_in_view`). Any
 * other connect (a relative or abstract name, an unreadable address, a path that exists or
 * fails otherwise) is left to Python. */
static int missing_unix_socket(const struct seccomp_notif *n) {
    pid_t pid = (pid_t)n->pid;
    uint64_t len = n->data.args[2];
    char raw[sizeof(struct sockaddr_un) + 1];
    size_t offset = offsetof(struct sockaddr_un, sun_path);
    if (len <= offset || len > sizeof(struct sockaddr_un))
        return 0;
    memset(raw, 0, sizeof raw);
    struct iovec local = {raw, (size_t)len}, remote = {(void *)(uintptr_t)n->data.args[1], len};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)len)
        return 0;
    sa_family_t family;
    memcpy(&family, raw, sizeof family);
    if (family != AF_UNIX || raw[offset] != '/')
        return 0;
    char link[64];
    struct stat st;
    snprintf(link, sizeof link, "/proc/%d/fd/%d", (int)pid, signed_int(n->data.args[0]));
    if (stat(link, &st) != 0 || !S_ISSOCK(st.st_mode))
        return 0; /* Python answers EBADF or ENOTSOCK first */
    snprintf(link, sizeof link, "/proc/%d/root", (int)pid);
    int root = open(link, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return 0;
    struct bsf_open_how how = {O_PATH | O_CLOEXEC, 0,
                               BSF_RESOLVE_IN_ROOT | BSF_RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(BSF_SYS_OPENAT2, root, raw + offset, &how, sizeof how);
    int missing = fd < 0 && errno == ENOENT;
    if (fd >= 0)
        close(fd);
    close(root);
    return missing;
}

/* Whether the Python supervisor would let this call through without judging it. */
static int fast(const struct bsf_rules *r, const struct bsf_call *calls, int ncalls,
                const struct seccomp_notif *n) {
    const struct bsf_call *c = NULL;
    for (int i = 0; i < ncalls; i++)
        if (calls[i].nr == n->data.nr)
            c = &calls[i];
    if (c == NULL || !c->write || c->xattr != BSF_NO_ARG || c->path == BSF_NO_ARG)
        return 0;
    if (c->mode != BSF_NO_ARG) {
        /* `setid.setid_call`: a creating call with a set-id mode is Python's to refuse. */
        uint64_t mode = n->data.args[c->mode] & 07777;
        int creates = c->flags == BSF_NO_ARG || (n->data.args[c->flags] & (0100 | 020000000));
        if (creates && (mode & 06000))
            return 0;
    }
    if (bsf_is_helper(r, (pid_t)n->pid))
        return 1; /* what the judge would find, it drops (`judge`: not a fact) */
    if (!path_surely_writable(r, n, c->path, c->dirfd))
        return 0;
    return c->path2 == BSF_NO_ARG || path_surely_writable(r, n, c->path2, c->dirfd2);
}

/* Serve ``listener`` until the supervisor closes its end of ``forward`` (a SOCK_SEQPACKET
 * pair) or every process of the filter is gone. Returns 0, or -errno on a failure that
 * stops forwarding (the Python side then sees end of file and stops answering too). */
static int bsf_serve(int listener, int forward, const struct bsf_call *calls, int ncalls,
                     int connect_nr, const char *blob, size_t blob_len, int read_only,
                     int view_mounts) {
    struct bsf_rules rules;
    int have_rules = blob != NULL && parse_rules(&rules, blob, blob_len, read_only,
                                                 view_mounts) == 0;
    /* Synchronous wake-ups (the caller hands its CPU straight to this thread and back) make
     * one process's run of traps 5x cheaper (12 us a trap instead of 60), but pin this thread
     * to the trapping CPU: with several processes trapping by turns (make -j2 on two cores)
     * it waited there while the other CPU idled (+26% on a C build against +4%). So they are
     * on only while one process traps again and again. */
    pid_t last = 0;
    int streak = 0, sync_on = 0;
    struct pollfd fds[2] = {{listener, POLLIN, 0}, {forward, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (fds[1].revents)
            return 0; /* the supervisor closed its end (or wrote: it never does) */
        if (fds[0].revents & POLLIN) {
            struct seccomp_notif n;
            memset(&n, 0, sizeof n);
            if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &n) < 0)
                continue; /* the caller died or was interrupted before we read it */
            streak = (pid_t)n.pid == last ? streak + 1 : 0;
            last = (pid_t)n.pid;
            if (sync_on != (streak >= BSF_SYNC_STREAK)) {
                sync_on = streak >= BSF_SYNC_STREAK;
                /* Refused before Linux 6.6: then wake-ups stay as they were. */
                ioctl(listener, BSF_NOTIF_SET_FLAGS, sync_on ? BSF_SYNC_WAKE_UP : 0ULL);
            }
            if (have_rules && fast(&rules, calls, ncalls, &n)) {
                struct seccomp_notif_resp resp;
                memset(&resp, 0, sizeof resp);
                resp.id = n.id;
                resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
                ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
                continue;
            }
            if (n.data.nr == connect_nr && missing_unix_socket(&n)) {
                struct seccomp_notif_resp resp;
                memset(&resp, 0, sizeof resp);
                resp.id = n.id;
                resp.val = -1;
                resp.error = -ENOENT;
                ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
                continue;
            }
            if (send(forward, &n, sizeof n, MSG_NOSIGNAL) < 0)
                return -errno;
        } else if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
            return 0;
        }
    }
}

/* One command's serving thread, started and joined from Python without a Python thread
 * (whose start waits for the new thread to be scheduled: 0.5 ms and more of the event
 * loop's time per command on a loaded machine). It owns copies of the call table and the
 * rules (the rules point into their blob) and the ``forward`` descriptor, which it closes
 * when it ends: the supervisor's end then reads end of file. */
struct bsf_thread {
    pthread_t tid;
    int listener, forward, ncalls, connect_nr, read_only, view_mounts, rc;
    size_t blob_len;
    struct bsf_call *calls;
    char *blob;
};

static void *bsf_thread_main(void *arg) {
    struct bsf_thread *t = arg;
    t->rc = bsf_serve(t->listener, t->forward, t->calls, t->ncalls, t->connect_nr, t->blob,
                      t->blob_len, t->read_only, t->view_mounts);
    close(t->forward);
    return NULL;
}

static void bsf_thread_free(struct bsf_thread *t) {
    free(t->calls);
    free(t->blob);
    free(t);
}

/* Start serving ``listener`` on a new thread; NULL (errno set) when it cannot start, and
 * then ``forward`` is still the caller's. */
struct bsf_thread *bsf_start(int listener, int forward, const struct bsf_call *calls,
                             int ncalls, int connect_nr, const char *blob, size_t blob_len,
                             int read_only, int view_mounts) {
    struct bsf_thread *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->calls = malloc(sizeof *calls * (size_t)(ncalls > 0 ? ncalls : 1));
    t->blob = malloc(blob_len + 1);
    if (t->calls == NULL || t->blob == NULL) {
        bsf_thread_free(t);
        errno = ENOMEM;
        return NULL;
    }
    memcpy(t->calls, calls, sizeof *calls * (size_t)ncalls);
    memcpy(t->blob, blob, blob_len);
    t->blob[blob_len] = 0;
    t->listener = listener;
    t->forward = forward;
    t->ncalls = ncalls;
    t->connect_nr = connect_nr;
    t->blob_len = blob_len;
    t->read_only = read_only;
    t->view_mounts = view_mounts;
    int rc = pthread_create(&t->tid, NULL, bsf_thread_main, t);
    if (rc != 0) {
        bsf_thread_free(t);
        errno = rc;
        return NULL;
    }
    /* Seen in /proc/<pid>/task/<tid>/comm (at most 15 characters). */
    pthread_setname_np(t->tid, "bsb-fast-writes");
    return t;
}

/* Wait up to ``timeout_ms`` for the thread to end (the supervisor closed its end of the
 * pair first). Returns its result (0 or -errno) and frees it; 1 if it is still running
 * (then it is left running, and ``t`` stays valid). */
int bsf_join(struct bsf_thread *t, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(t->tid, NULL, &until) != 0)
        return 1;
    int rc = t->rc;
    bsf_thread_free(t);
    return rc;
}

/* The hash of this file as setup.py built it: `fast_writes.py` loads no build of another. */
#ifndef BSF_SOURCE_SHA256
#define BSF_SOURCE_SHA256 ""
#endif
const char *bsf_source_sha256(void) { return BSF_SOURCE_SHA256; }

/* For the tests: whether the rules take ``pid`` for a helper, as `write_watch._is_helper`. */
int bsf_helper_answer(const char *blob, size_t blob_len, pid_t pid) {
    struct bsf_rules rules;
    if (parse_rules(&rules, blob, blob_len, 0, 1) < 0)
        return -1;
    return bsf_is_helper(&rules, pid);
}

/* For the tests: the fast rules' answer for one path, as `WritePolicy.surely_writable`. */
int bsf_rules_answer(const char *blob, size_t blob_len, int read_only, int view_mounts,
                     const char *path) {
    struct bsf_rules rules;
    if (parse_rules(&rules, blob, blob_len, read_only, view_mounts) < 0)
        return -1;
    return bsf_surely_writable(&rules, path);
}
