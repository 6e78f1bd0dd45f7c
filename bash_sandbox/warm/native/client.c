/*
 * `bash-sandbox` itself, where setup.py could build it: the warm CLI's client in C.
 *
 * A warm call (`BASH_SANDBOX_DAEMON=1 bash-sandbox run ...`) is, on the client's side, a
 * connect, one request and one answer (`warm/client.py`, `warm/wire.py`). The Python client
 * spends 15-20 ms of its 20-25 starting an interpreter for that; this does the same in well
 * under one. It serves only the case where a daemon of this installation is already
 * listening; everything else (any other subcommand, the daemon not wanted, none running yet,
 * anything unusual) execs `bash-sandbox-py` beside this file, the Python entry, with the same
 * arguments: the Python client then starts the daemon (named after this directory, passed in
 * BASH_SANDBOX_WARM_KEY, which the entry removes from its environment at once) or the CLI
 * runs fresh. So this file decides nothing the Python side does not decide again.
 *
 * What it must do exactly as the Python client does:
 *   - trust only this uid's private directory (0700, owned, not a link) and a listener of the
 *     same uid that is as free as this process (`wire.unconfined_peer`);
 *   - send the environment Python's `dict(os.environ)` would hold: the first of repeated
 *     names, entries without '=' left out, and the C locale coerced as CPython coerces it at
 *     start-up (PEP 538: LC_CTYPE=C.UTF-8 in the environment), since a fresh run's command
 *     sees that; a name or value that is not strict UTF-8 (Python would carry it as lone
 *     surrogates) is left to the Python client;
 *   - send the descriptors 0, 1, 2 and the working directory with the request's first bytes;
 *   - forward SIGINT, SIGTERM, SIGHUP and SIGQUIT (unless ignored) as signal frames;
 *   - read one answer with the same strict flat-object rules (`wire._flat_object`) and end as
 *     the run ended: its status, its signal, or 70 when the daemon went away.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define PYTHON_ENTRY "bash-sandbox-py"
#define KEY_ENV "BASH_SANDBOX_WARM_KEY"
#define ENABLE_ENV "BASH_SANDBOX_DAEMON"
#define SUN_PATH_MAX 100 /* as `wire._SUN_PATH_MAX` */
#define ANSWER_MAX 4096  /* an answer is a few names and numbers */
#define EXIT_WENT_AWAY 70

extern char **environ;

/* -- falling back to the Python entry ---------------------------------------------------- */

static char own_dir[PATH_MAX];

/* Exec the Python entry beside this file; ``key``: pass this directory as the daemon's key. */
static void exec_python(char **argv, int key) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", own_dir, PYTHON_ENTRY) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
    } else {
        if (key)
            setenv(KEY_ENV, own_dir, 1);
        argv[0] = path;
        execv(path, argv);
    }
    fprintf(stderr, "bash-sandbox: cannot run %s/%s: %s\n", own_dir, PYTHON_ENTRY, strerror(errno));
    _exit(127);
}

/* -- the environment as Python holds it --------------------------------------------------- */

/* CPython's start-up coerces the legacy C locale (PEP 538, `_Py_CoerceLegacyLocale`) and puts
 * the result in its environment, which a fresh run's command then inherits. */
static void coerce_c_locale(void) {
    static const char *const targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    const char *opt = getenv("PYTHONCOERCECLOCALE");
    const char *all = getenv("LC_ALL");
    if ((opt != NULL && strcmp(opt, "0") == 0) || (all != NULL && *all != '\0'))
        return;
    setlocale(LC_CTYPE, ""); /* a locale the system lacks leaves it "C", as in CPython */
    const char *ctype = setlocale(LC_CTYPE, NULL);
    if (ctype == NULL || strcmp(ctype, "C") != 0)
        return;
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        if (setlocale(LC_CTYPE, targets[i]) == NULL)
            continue;
        const char *codeset = nl_langinfo(CODESET);
        if (codeset == NULL || *codeset == '\0')
            continue;
        setenv("LC_CTYPE", targets[i], 1);
        return;
    }
}

/* -- JSON, as `wire._encode` writes it ---------------------------------------------------- */

struct buf {
    char *p;
    size_t len, cap;
};

static int put(struct buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int put_s(struct buf *b, const char *s) { return put(b, s, strlen(s)); }

static int put_u(struct buf *b, unsigned long v) {
    char num[24];
    return put(b, num, (size_t)snprintf(num, sizeof num, "%lu", v));
}

/* The next code point of strict UTF-8 (Python's decoder: no overlong form, no surrogate, at
 * most U+10FFFF), or -1. */
static long next_code_point(const unsigned char **s, const unsigned char *end) {
    const unsigned char *p = *s;
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    long cp;
    if (c < 0x80) {
        *s = p + 1;
        return c;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        cp = c & 0x0F;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        cp = c & 0x07;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return -1;
    }
    if (end - p <= n)
        return -1;
    for (int i = 1; i <= n; i++) {
        unsigned d = p[i];
        if (d < (i == 1 ? lo : 0x80) || d > (i == 1 ? hi : 0xBF))
            return -1;
        cp = (cp << 6) | (d & 0x3F);
    }
    *s = p + n + 1;
    return cp;
}

/* ``s`` as `json.encoder.encode_basestring_ascii` writes it; -1 when it is not UTF-8. */
static int put_string(struct buf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    char esc[16];
    if (put(b, "\"", 1))
        return -1;
    while (p < end) {
        long cp = next_code_point(&p, end);
        const char *two = NULL;
        if (cp < 0)
            return -1;
        switch (cp) {
        case '"': two = "\\\""; break;
        case '\\': two = "\\\\"; break;
        case '\n': two = "\\n"; break;
        case '\r': two = "\\r"; break;
        case '\t': two = "\\t"; break;
        case '\b': two = "\\b"; break;
        case '\f': two = "\\f"; break;
        default: break;
        }
        int bad;
        if (two != NULL) {
            bad = put(b, two, 2);
        } else if (cp >= 0x20 && cp <= 0x7E) {
            char c = (char)cp;
            bad = put(b, &c, 1);
        } else if (cp > 0xFFFF) {
            cp -= 0x10000;
            int len = snprintf(esc, sizeof esc, "\\u%04lx\\u%04lx", 0xD800 | (cp >> 10),
                               0xDC00 | (cp & 0x3FF));
            bad = put(b, esc, (size_t)len);
        } else {
            bad = put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04lx", cp));
        }
        if (bad)
            return -1;
    }
    return put(b, "\"", 1);
}

/* {"argv":[...],"env":{...},"umask":N} after its 4-byte big-endian length. */
static int build_request(struct buf *b, int argc, char **argv, mode_t umask_now) {
    if (put(b, "\0\0\0\0", 4) || put_s(b, "{\"argv\":["))
        return -1;
    for (int i = 1; i < argc; i++)
        if ((i > 1 && put(b, ",", 1)) || put_string(b, argv[i], strlen(argv[i])))
            return -1;
    if (put_s(b, "],\"env\":{"))
        return -1;
    int first = 1;
    for (char **e = environ; *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        if (eq == NULL)
            continue;
        size_t klen = (size_t)(eq - *e);
        int seen = 0; /* Python keeps a repeated name's first value */
        for (char **f = environ; f != e && !seen; f++)
            seen = strncmp(*f, *e, klen + 1) == 0;
        if (seen)
            continue;
        if ((!first && put(b, ",", 1)) || put_string(b, *e, klen) || put(b, ":", 1) ||
            put_string(b, eq + 1, strlen(eq + 1)))
            return -1;
        first = 0;
    }
    if (put_s(b, "},\"umask\":") || put_u(b, umask_now) || put(b, "}", 1))
        return -1;
    uint32_t size = (uint32_t)(b->len - 4);
    unsigned char *head = (unsigned char *)b->p;
    head[0] = (unsigned char)(size >> 24);
    head[1] = (unsigned char)(size >> 16);
    head[2] = (unsigned char)(size >> 8);
    head[3] = (unsigned char)size;
    return 0;
}

/* -- the daemon's socket ------------------------------------------------------------------ */

/* This uid's private directory, as `wire.private_dir` finds it; 0 when found. */
static int private_dir(char *out) {
    const char *tmpdir = getenv("TMPDIR");
    const char *parents[] = {tmpdir != NULL && *tmpdir ? tmpdir : "/tmp", "/tmp", "/var/tmp"};
    uid_t uid = geteuid();
    for (size_t i = 0; i < 3; i++) {
        char path[PATH_MAX];
        struct stat st;
        if ((i > 0 && strcmp(parents[i], parents[0]) == 0) ||
            (i > 1 && strcmp(parents[i], parents[1]) == 0))
            continue;
        if (snprintf(path, sizeof path, "%s/bash-sandbox-%u", parents[i], (unsigned)uid) >=
            (int)sizeof path)
            continue;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid &&
            (st.st_mode & 077) == 0)
            return realpath(path, out) != NULL ? 0 : -1;
    }
    return -1;
}

/* zlib's crc32, which `wire.socket_name` names the socket with. */
static uint32_t crc32_of(const char *s) {
    uint32_t crc = 0xFFFFFFFFu;
    for (; *s; s++) {
        crc ^= (unsigned char)*s;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & -(crc & 1));
    }
    return ~crc;
}

static int connect_at(int sock, const char *dir, const char *name) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int dfd = -1, len;
    if (strlen(dir) + 1 + strlen(name) > SUN_PATH_MAX) {
        /* A deep temp dir: through a descriptor of the directory, as `wire.at_path`. */
        dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
            return -1;
        len = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dfd, name);
    } else {
        len = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dir, name);
    }
    int rc = len < (int)sizeof addr.sun_path
                 ? connect(sock, (struct sockaddr *)&addr, sizeof addr)
                 : (errno = ENAMETOOLONG, -1);
    if (dfd >= 0)
        close(dfd);
    return rc;
}

/* The mount namespace of ``pid`` and its no_new_privs and seccomp filter counts. */
static int restrictions(const char *pid, unsigned long r[4]) {
    char path[64], text[16384];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
    if (stat(path, &st) != 0)
        return -1;
    r[0] = st.st_dev;
    r[1] = st.st_ino;
    r[2] = r[3] = 0;
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    ssize_t got;
    while (len < sizeof text - 1 && (got = read(fd, text + len, sizeof text - 1 - len)) > 0)
        len += (size_t)got;
    close(fd);
    text[len] = '\0';
    for (char *line = text; line != NULL; line = strchr(line, '\n')) {
        line += *line == '\n';
        if (strncmp(line, "NoNewPrivs:", 11) == 0)
            r[2] = strtoul(line + 11, NULL, 10);
        else if (strncmp(line, "Seccomp_filters:", 16) == 0)
            r[3] = strtoul(line + 16, NULL, 10);
    }
    return 0;
}

/* Whether the listener is this uid's and as free as this process (`wire.unconfined_peer`). */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* Whether the pidfd still names the live process pid (fdinfo's "Pid:", -1 once it is gone). */
static int pidfd_names(int pidfd, int pid) {
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    FILE *f = fopen(path, "re");
    int found = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "Pid:", 4) == 0) {
            found = atoi(line + 4) == pid;
            break;
        }
    }
    fclose(f);
    return found;
}

static int trusted_listener(int sock) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    unsigned long theirs[4], ours[4];
    char pid[24];
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid() ||
        cred.pid <= 0)
        return 0;
    /* Linux 6.5+: the listener pinned by a pidfd, checked after /proc is read, so a confined
       listener whose pid an unconfined process has taken since never passes for it. */
    int pidfd = -1;
    socklen_t fdlen = sizeof pidfd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &fdlen) != 0)
        pidfd = -1;
    snprintf(pid, sizeof pid, "%d", (int)cred.pid);
    int ok = restrictions(pid, theirs) == 0 && restrictions("self", ours) == 0 &&
             theirs[0] == ours[0] && theirs[1] == ours[1] && theirs[2] <= ours[2] &&
             theirs[3] <= ours[3] && (pidfd < 0 || pidfd_names(pidfd, (int)cred.pid));
    if (pidfd >= 0)
        close(pidfd);
    return ok;
}

/* -- the call ------------------------------------------------------------------------------ */

static int sock = -1;

static void forward(int signum) {
    /* {"signal":N}, written here: only async-signal-safe calls. */
    char frame[32] = "\0\0\0\0{\"signal\":";
    size_t len = 14;
    char digits[8];
    int n = 0;
    for (int v = signum; n == 0 || v > 0; v /= 10)
        digits[n++] = (char)('0' + v % 10);
    while (n > 0)
        frame[len++] = digits[--n];
    frame[len++] = '}';
    frame[3] = (char)(len - 4);
    int saved = errno;
    for (size_t off = 0; off < len;) {
        ssize_t sent = send(sock, frame + off, len - off, MSG_NOSIGNAL);
        if (sent <= 0 && errno != EINTR)
            break; /* the daemon is gone: the answer says so */
        off += sent > 0 ? (size_t)sent : 0;
    }
    errno = saved;
}

static int send_request(const struct buf *b, int cwd) {
    int fds[4] = {0, 1, 2, cwd};
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof fds)];
    } control;
    struct iovec iov = {.iov_base = b->p, .iov_len = b->len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
        .msg_controllen = sizeof control.space};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent;
    do
        sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    for (size_t off = sent > 0 ? (size_t)sent : 0; sent > 0 && off < b->len;) {
        sent = send(sock, b->p + off, b->len - off, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        off += sent > 0 ? (size_t)sent : 0;
    }
    return sent > 0 ? 0 : -1;
}

static int read_exact(char *into, size_t size) {
    for (size_t off = 0; off < size;) {
        ssize_t got = recv(sock, into + off, size - off, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        off += (size_t)got;
    }
    return 0;
}

struct answer {
    int stale, has_signal, has_exit;
    long long signal, exit;
};

/* `wire._flat_object`: {"name":value,...}, names of a-z and _, each once, values true, false
 * or an integer without a leading zero; nothing else. 0 when the body is one. */
static int parse_answer(char *body, size_t len, struct answer *a) {
    if (len < 2 || body[0] != '{' || body[len - 1] != '}')
        return -1;
    body[len - 1] = '\0';
    char *seen[ANSWER_MAX / 4];
    size_t count = 0;
    for (char *item = body + 1; len > 2 && item != NULL;) {
        char *comma = strchr(item, ',');
        if (comma != NULL)
            *comma = '\0';
        char *colon = strchr(item, ':');
        if (colon == NULL || colon - item < 3 || item[0] != '"' || colon[-1] != '"')
            return -1;
        colon[-1] = '\0';
        char *name = item + 1, *value = colon + 1;
        for (char *c = name; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || *c == '_'))
                return -1;
        for (size_t i = 0; i < count; i++)
            if (strcmp(seen[i], name) == 0)
                return -1;
        seen[count++] = name;
        long long number = 0;
        const char *digits = value[0] == '-' ? value + 1 : value;
        if (strcmp(value, "true") == 0 || strcmp(value, "false") == 0) {
            number = value[0] == 't';
        } else {
            if (*digits == '\0' || (digits[0] == '0' && digits[1] != '\0'))
                return -1;
            for (const char *d = digits; *d; d++) {
                if (*d < '0' || *d > '9' || number > (LLONG_MAX - 9) / 10)
                    return -1; /* Python's ints are unbounded; no daemon sends such */
                number = number * 10 + (*d - '0');
            }
            number = value[0] == '-' ? -number : number;
        }
        if (strcmp(name, "stale") == 0) {
            a->stale = 1;
        } else if (strcmp(name, "signal") == 0) {
            a->has_signal = 1;
            a->signal = number;
        } else if (strcmp(name, "exit") == 0) {
            a->has_exit = 1;
            a->exit = number;
        }
        item = comma != NULL ? comma + 1 : NULL;
    }
    return 0;
}

/* The daemon's answer: 1 parsed, 0 none (an end of file, or what no daemon sends). */
static int read_answer(struct answer *a) {
    unsigned char head[4];
    char body[ANSWER_MAX];
    if (read_exact((char *)head, 4) != 0)
        return 0;
    uint32_t size = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 |
                    head[3];
    if (size >= sizeof body || read_exact(body, size) != 0)
        return 0;
    return parse_answer(body, size, a) == 0;
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", own_dir, sizeof own_dir - 1);
    if (n <= 0) {
        fprintf(stderr, "bash-sandbox: cannot find its own directory: %s\n", strerror(errno));
        return 127;
    }
    own_dir[n] = '\0';
    *strrchr(own_dir, '/') = '\0'; /* the kernel's path is absolute */

    const char *enabled = getenv(ENABLE_ENV);
    if (enabled == NULL || strcmp(enabled, "1") != 0 || argc < 2 || strcmp(argv[1], "run") != 0)
        exec_python(argv, 0);

    char dir[PATH_MAX], name[32];
    if (private_dir(dir) != 0)
        exec_python(argv, 1);
    snprintf(name, sizeof name, "warm-%08x.sock", crc32_of(own_dir));
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0 || connect_at(sock, dir, name) != 0 || !trusted_listener(sock))
        exec_python(argv, 1); /* it starts the daemon, or runs fresh */

    coerce_c_locale();
    struct buf request = {0};
    mode_t umask_now = umask(0);
    umask(umask_now);
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0 || build_request(&request, argc, argv, umask_now) != 0 ||
        send_request(&request, cwd) != 0)
        exec_python(argv, 1); /* nothing ran: the daemon reads no partial request */
    close(cwd);
    free(request.p);

    const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction act = {.sa_handler = forward, .sa_flags = SA_RESTART};
    for (size_t i = 0; i < 4; i++)
        sigaddset(&act.sa_mask, forwarded[i]);
    for (size_t i = 0; i < 4; i++) {
        struct sigaction old;
        if (sigaction(forwarded[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(forwarded[i], &act, NULL);
    }

    struct answer a = {0};
    int answered = read_answer(&a);
    close(sock);
    if (answered && a.stale)
        exec_python(argv, 1); /* refused before anything ran */
    if (answered && a.has_signal) {
        int signum = (int)a.signal;
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, signum);
        signal(signum, SIG_DFL);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), signum); /* die of the run's signal, as the fresh process would */
        return 128 + signum;
    }
    if (answered && a.has_exit)
        _exit((int)a.exit);
    /* The run is gone with the daemon; running it again could run it twice. */
    fputs("bash-sandbox: the warm daemon went away during the run\n", stderr);
    return EXIT_WENT_AWAY;
}
