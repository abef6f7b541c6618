/*
 * clockshift: an LD_PRELOAD library that shifts the wall clock of one process, for the clock
 * skew tests (tests/netfault/). Monotonic clocks are left alone.
 *
 * It replaces clock_gettime (CLOCK_REALTIME and CLOCK_REALTIME_COARSE only), gettimeofday and
 * time, reading the real time through the raw clock_gettime system call and adding an offset
 * in milliseconds:
 *   CLOCKSHIFT_MS=<ms>       a fixed offset (negative: the clock is behind);
 *   CLOCKSHIFT_FILE=<path>   the offset is the decimal number at the start of that file, read
 *                            through a shared mapping on every call, so a test can jump the
 *                            clock of a running process by rewriting the file in place
 *                            (pwrite at offset 0, the file padded with spaces to 32 bytes).
 *
 * Why not libfaketime: Debian's 0.9.10 cannot start redis-server (jemalloc calls clock_gettime
 * while libfaketime initialises; it detects the recursion and the server never answers). This
 * library calls nothing that could come back into it: getenv, open, mmap and the raw syscall.
 *
 * Built by `make clockshift` (gcc -shared -fPIC) into target/clockshift/libclockshift.so.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define FILE_BYTES 32

/* 0: not yet read; 1: fixed offset; 2: file mapped. Racing initialisations agree. */
static volatile int mode;
static long long fixed_ms;
static const volatile char *mapped;

static void init(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path != NULL) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            void *p = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (p != MAP_FAILED) {
                mapped = p;
                __atomic_store_n(&mode, 2, __ATOMIC_RELEASE);
                return;
            }
        }
    }
    const char *ms = getenv("CLOCKSHIFT_MS");
    fixed_ms = ms != NULL ? strtoll(ms, NULL, 10) : 0;
    __atomic_store_n(&mode, 1, __ATOMIC_RELEASE);
}

/* The decimal number at the start of the mapped file (strtoll would read past the mapping if
 * the file had no terminator, so parse by hand). */
static long long read_mapped(void) {
    long long v = 0;
    int i = 0, neg = 0;
    while (i < FILE_BYTES && mapped[i] == ' ') i++;
    if (i < FILE_BYTES && (mapped[i] == '-' || mapped[i] == '+')) neg = mapped[i++] == '-';
    while (i < FILE_BYTES && mapped[i] >= '0' && mapped[i] <= '9') v = v * 10 + (mapped[i++] - '0');
    return neg ? -v : v;
}

static long long offset_ms(void) {
    int m = __atomic_load_n(&mode, __ATOMIC_ACQUIRE);
    if (m == 0) {
        init();
        m = __atomic_load_n(&mode, __ATOMIC_ACQUIRE);
    }
    return m == 2 ? read_mapped() : fixed_ms;
}

static int real_clock(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_nsec + (offset_ms() % 1000) * 1000000LL;
    long long s = (long long)ts->tv_sec + offset_ms() / 1000;
    while (ns < 0) { ns += 1000000000LL; s--; }
    while (ns >= 1000000000LL) { ns -= 1000000000LL; s++; }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int rc = real_clock(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return rc;
}

/* glibc declares tv nonnull, but a NULL from a caller must not crash the process. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = real_clock(CLOCK_REALTIME, &ts);
    if (rc != 0) return rc;
    shift(&ts);
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    real_clock(CLOCK_REALTIME, &ts);
    shift(&ts);
    if (t != NULL) *t = ts.tv_sec;
    return ts.tv_sec;
}
