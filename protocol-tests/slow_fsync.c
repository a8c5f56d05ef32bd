/*
 * A slow disk for tests: an LD_PRELOAD shim that makes fsync, fdatasync, sync_file_range and
 * msync take GREGOR_SLOW_FSYNC_MS milliseconds longer for files under GREGOR_SLOW_FSYNC_DIR,
 * but only while the file GREGOR_SLOW_FSYNC_CONTROL exists, so a test can start and end the
 * stall while the process runs. Each stalled call appends one line ("<call> <path>") to
 * GREGOR_SLOW_FSYNC_LOG when that is set, so a test can tell the fault really hit.
 *
 * The delay comes before the real call, on the calling thread, as a disk with a deep queue or
 * a stalled controller would make it: whatever waits for that thread waits with it.
 *
 * Built by protocol-tests/test_slow_disk.py: cc -shared -fPIC -o slow_fsync.so slow_fsync.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static char slow_dir[PATH_MAX];
static const char *control;
static const char *log_path;
static long delay_ms;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    const char *d = getenv("GREGOR_SLOW_FSYNC_DIR");
    const char *ms = getenv("GREGOR_SLOW_FSYNC_MS");
    control = getenv("GREGOR_SLOW_FSYNC_CONTROL");
    log_path = getenv("GREGOR_SLOW_FSYNC_LOG");
    delay_ms = ms ? atol(ms) : 0;
    /* /proc/self/fd links name resolved paths: compare against the resolved directory. */
    if (d && !realpath(d, slow_dir)) {
        snprintf(slow_dir, sizeof slow_dir, "%s", d);
    }
}

static int under_slow_dir(const char *path) {
    size_t n = strlen(slow_dir);
    return n > 0 && strncmp(path, slow_dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

static int stall_on(void) {
    pthread_once(&once, init);
    return slow_dir[0] && control && delay_ms > 0 && access(control, F_OK) == 0;
}

static int fd_path(int fd, char *out, size_t len) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, len - 1);
    if (n < 0) {
        return -1;
    }
    out[n] = '\0';
    return 0;
}

/* The file mapped at addr, from /proc/self/maps (msync names memory, not a descriptor). */
static int mapped_path(const void *addr, char *out, size_t len) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) {
        return -1;
    }
    char line[PATH_MAX + 256];
    int found = -1;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long start, end;
        int off = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &start, &end, &off) < 2 || off == 0) {
            continue;
        }
        if (a >= start && a < end) {
            char *p = line + off;
            p[strcspn(p, "\n")] = '\0';
            snprintf(out, len, "%s", p);
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

static void stall(const char *call, const char *path) {
    if (!under_slow_dir(path)) {
        return;
    }
    if (log_path) {
        int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[PATH_MAX + 64];
            int n = snprintf(line, sizeof line, "%s %s\n", call, path);
            if (n > 0) {
                ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
                (void)w;
            }
            close(fd);
        }
    }
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void stall_fd(const char *call, int fd) {
    int saved = errno;
    char path[PATH_MAX];
    if (stall_on() && fd_path(fd, path, sizeof path) == 0) {
        stall(call, path);
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    stall_fd("fsync", fd);
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    stall_fd("fdatasync", fd);
    return real(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (!real) {
        real = (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
    }
    stall_fd("sync_file_range", fd);
    return real(fd, offset, nbytes, flags);
}

int msync(void *addr, size_t length, int flags) {
    static int (*real)(void *, size_t, int);
    if (!real) {
        real = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
    }
    int saved = errno;
    char path[PATH_MAX];
    if ((flags & MS_SYNC) && stall_on() && mapped_path(addr, path, sizeof path) == 0) {
        stall("msync", path);
    }
    errno = saved;
    return real(addr, length, flags);
}
