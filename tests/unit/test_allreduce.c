/* Unit tests for backend/cpu/allreduce_shm: groups of 2, 3 and 4 forked ranks summing many buffers
 * (bit-identical to a rank-order sum computed locally, and identical across ranks), the
 * multithreaded summation path, the barrier timeout and how it breaks the group for the other
 * ranks, ranks that disagree on n, bad arguments, and segments that do not match or are not ours.
 *
 * Every segment name carries the test's pid and is unlinked at the end of its test, whatever the
 * outcome. Children report on stdout as "# ..." lines and through their exit status; a child that
 * hangs is killed by an alarm, so the parent always gets an answer.
 */
#include "base/clock.h"
#include "backend/cpu/allreduce_shm.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS   4
#define ITERS       200
#define SMALL_MAX   5003 /* floats: neither a multiple of a cache line nor of a block */
#define LARGE_MAX   (1 << 18)
#define TIMEOUT_MS  200
#define CHILD_ALARM 10 /* seconds before a hung child is killed */

/* ---- helpers ---- */

static const char *seg_name(const char *what)
{
    static char name[64];

    snprintf(name, sizeof(name), "/lora-test-allreduce-%ld-%s", (long)getpid(), what);
    lora_allreduce_unlink(name);
    return name;
}

static bool is_in_dev_shm(const char *name)
{
    char path[128];

    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* A float whose magnitude spans 2^-20 .. 2^20, so that the order of a sum changes its rounding. */
static float value(int rank, int iter, size_t i)
{
    uint64_t h = mix(((uint64_t)rank << 56) ^ ((uint64_t)iter << 32) ^ i);
    int mant = (int)(h % 2001) - 1000;
    int expo = (int)((h >> 16) % 41) - 20;

    return ldexpf((float)mant / 1000.0f, expo);
}

/* The n of iteration iter: 1 first, then max_floats, then pseudo-random in [1, max_floats]. */
static size_t iter_n(int iter, size_t max_floats)
{
    if (iter == 0)
        return 1;
    if (iter == 1)
        return max_floats;
    return 1 + mix((uint64_t)iter * 7919u) % max_floats;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t bytes)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < bytes; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- forked groups ---- */

struct group {
    const char *name;
    int world_size;
    size_t max_floats;
    int iters;
    int timeout_ms;
};

/* The body of one rank: returns its exit status and puts a 64-bit result in *out. */
typedef int (*rank_fn)(const struct group *g, int rank, uint64_t *out);

/* Forks g->world_size ranks running fn; collects each one's result into out[rank] and returns
 * how many ranks failed (exit status, signal or no result). */
static int run_ranks(const struct group *g, rank_fn fn, uint64_t *out)
{
    int fds[MAX_RANKS][2];
    pid_t pids[MAX_RANKS];
    int n_failed = 0;

    for (int r = 0; r < g->world_size; r++) {
        if (pipe(fds[r]) < 0) {
            perror("pipe");
            return g->world_size;
        }
    }
    fflush(stdout);
    for (int r = 0; r < g->world_size; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            for (int q = 0; q < g->world_size; q++) {
                close(fds[q][0]);
                if (q != r)
                    close(fds[q][1]);
            }
            alarm(CHILD_ALARM);
            uint64_t result = 0;
            int status = fn(g, r, &result);
            if (write(fds[r][1], &result, sizeof(result)) != (ssize_t)sizeof(result))
                status = 1;
            fflush(stdout);
            _exit(status);
        }
        if (pids[r] < 0)
            perror("fork");
    }
    for (int r = 0; r < g->world_size; r++) {
        int status = 0;

        close(fds[r][1]);
        if (read(fds[r][0], &out[r], sizeof(out[r])) != (ssize_t)sizeof(out[r]))
            out[r] = 0;
        close(fds[r][0]);
        if (pids[r] < 0 || waitpid(pids[r], &status, 0) != pids[r] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            printf("# rank %d of %d: %s %d\n", r, g->world_size,
                   WIFSIGNALED(status) ? "killed by signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            n_failed++;
        }
    }
    return n_failed;
}

/* Sums g->iters buffers and checks each against the rank-order sum computed here; the result is
 * a checksum of everything it got. */
static int rank_sums(const struct group *g, int rank, uint64_t *out)
{
    char err[256];
    struct lora_allreduce *ar =
        lora_allreduce_open(g->name, rank, g->world_size, g->max_floats, 2000, err, sizeof(err));
    float *buf = malloc(g->max_floats * sizeof(float));
    float *want = malloc(g->max_floats * sizeof(float));
    uint64_t sum = 0xcbf29ce484222325ull;
    int status = 0;

    if (!ar || !buf || !want) {
        printf("# rank %d: %s\n", rank, ar ? "out of memory" : err);
        status = 1;
        goto out;
    }
    for (int it = 0; it < g->iters && !status; it++) {
        size_t n = iter_n(it, g->max_floats);

        for (size_t i = 0; i < n; i++) {
            buf[i] = value(rank, it, i);
            want[i] = value(0, it, i);
            for (int r = 1; r < g->world_size; r++)
                want[i] += value(r, it, i);
        }
        if (lora_allreduce_sum(buf, n, ar) < 0) {
            printf("# rank %d, iteration %d, n %zu: sum failed: %s\n", rank, it, n,
                   strerror(errno));
            status = 1;
        } else if (memcmp(buf, want, n * sizeof(float)) != 0) {
            printf("# rank %d, iteration %d, n %zu: not the rank-order sum\n", rank, it, n);
            status = 1;
        }
        sum = fnv1a(sum, buf, n * sizeof(float));
    }
out:
    *out = sum;
    lora_allreduce_close(&ar);
    free(buf);
    free(want);
    return status;
}

static void check_group(int world_size, size_t max_floats, int iters)
{
    char what[32];
    uint64_t sums[MAX_RANKS] = {0};

    snprintf(what, sizeof(what), "w%d-%zu", world_size, max_floats);
    struct group g = {seg_name(what), world_size, max_floats, iters, 2000};
    CHECK(run_ranks(&g, rank_sums, sums) == 0);
    for (int r = 1; r < world_size; r++)
        CHECK(sums[r] == sums[0]);
    CHECK(!is_in_dev_shm(g.name)); /* the last rank to join removed the name */
    CHECK(lora_allreduce_unlink(g.name) == 0);
}

static void test_two_ranks(void)
{
    check_group(2, SMALL_MAX, ITERS);
}

static void test_three_ranks(void)
{
    check_group(3, SMALL_MAX, ITERS);
}

static void test_four_ranks(void)
{
    check_group(4, SMALL_MAX, ITERS);
}

/* Large enough that OpenMP threads share the summation. */
static void test_threaded_sum(void)
{
    check_group(2, LARGE_MAX, 12);
}

/* ---- failures between ranks ---- */

/* Rank 0 times out after g->timeout_ms: rank 2 joins and dies. Rank 1, with a long timeout, must
 * learn of it from the broken flag well before its own timeout. The result is errno. */
static int rank_waits(const struct group *g, int rank, uint64_t *out)
{
    char err[256];
    int timeout_ms = rank == 0 ? g->timeout_ms : 20000;
    struct lora_allreduce *ar = lora_allreduce_open(g->name, rank, g->world_size, g->max_floats,
                                                    timeout_ms, err, sizeof(err));
    float buf[16] = {0};
    int status = 0;

    if (!ar) {
        printf("# rank %d: %s\n", rank, err);
        return 1;
    }
    if (rank != 2) {
        double t0 = lora_clock_mono();
        int rc = lora_allreduce_sum(buf, 16, ar);
        *out = (uint64_t)errno;
        if (rc != -1 || lora_clock_mono() - t0 > 2.0) {
            printf("# rank %d: rc %d after %.3f s\n", rank, rc, lora_clock_mono() - t0);
            status = 1;
        }
    }
    lora_allreduce_close(&ar);
    return status;
}

static void test_timeout_breaks_group(void)
{
    uint64_t errs[MAX_RANKS] = {0};
    struct group g = {seg_name("broken"), 3, 16, 1, TIMEOUT_MS};

    CHECK(run_ranks(&g, rank_waits, errs) == 0);
    CHECK(errs[0] == ETIMEDOUT);
    CHECK(errs[1] == ENOTRECOVERABLE);
    CHECK(lora_allreduce_unlink(g.name) == 0);
}

/* Rank r sums 10 + r floats: both ranks must refuse, then stay refused. */
static int rank_bad_n(const struct group *g, int rank, uint64_t *out)
{
    char err[256];
    struct lora_allreduce *ar =
        lora_allreduce_open(g->name, rank, g->world_size, g->max_floats, 2000, err, sizeof(err));
    float buf[16] = {0};
    int status = 0;

    if (!ar) {
        printf("# rank %d: %s\n", rank, err);
        return 1;
    }
    if (lora_allreduce_sum(buf, 10 + (size_t)rank, ar) != -1 || errno != EPROTO)
        status = 1;
    if (lora_allreduce_sum(buf, 10, ar) != -1 || errno != ENOTRECOVERABLE)
        status = 1;
    *out = (uint64_t)status;
    lora_allreduce_close(&ar);
    return status;
}

static void test_ranks_disagree_on_n(void)
{
    uint64_t res[MAX_RANKS] = {0};
    struct group g = {seg_name("bad-n"), 2, 16, 1, 2000};

    CHECK(run_ranks(&g, rank_bad_n, res) == 0);
    CHECK(lora_allreduce_unlink(g.name) == 0);
}

/* ---- one process ---- */

/* Two ranks of one group in this process; only rank 0 calls. */
static void test_timeout(void)
{
    char err[256];
    const char *name = seg_name("timeout");
    struct lora_allreduce *a0 = lora_allreduce_open(name, 0, 2, 64, TIMEOUT_MS, err, sizeof(err));
    struct lora_allreduce *a1 = lora_allreduce_open(name, 1, 2, 64, TIMEOUT_MS, err, sizeof(err));
    float buf[64] = {1.0f};

    CHECK(a0 && a1);
    if (a0 && a1) {
        double t0 = lora_clock_mono();
        CHECK(lora_allreduce_sum(buf, 64, a0) == -1);
        CHECK(errno == ETIMEDOUT);
        double waited = lora_clock_mono() - t0;
        CHECK(waited >= 0.9 * TIMEOUT_MS / 1000.0 && waited < 2.0);
        /* The late peer, and any later call, are refused at once. */
        CHECK(lora_allreduce_sum(buf, 64, a1) == -1);
        CHECK(errno == ENOTRECOVERABLE);
        CHECK(lora_allreduce_sum(buf, 64, a0) == -1);
        CHECK(errno == ENOTRECOVERABLE);
    }
    lora_allreduce_close(&a0);
    lora_allreduce_close(&a1);
    CHECK(!a0 && !a1);
    CHECK(lora_allreduce_unlink(name) == 0);
}

static void test_bad_arguments(void)
{
    char err[256];
    const char *name = seg_name("args");
    struct lora_allreduce *ar = lora_allreduce_open(name, 0, 1, 8, 100, err, sizeof(err));
    float buf[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

    CHECK(ar != NULL);
    CHECK(lora_allreduce_sum(buf, 9, ar) == -1 && errno == EINVAL);
    CHECK(lora_allreduce_sum(buf, 8, NULL) == -1 && errno == EINVAL);
    CHECK(lora_allreduce_sum(NULL, 8, ar) == -1 && errno == EINVAL);
    CHECK(lora_allreduce_sum(buf, 0, ar) == 0);
    CHECK(lora_allreduce_sum(buf, 8, ar) == 0 && buf[7] == 8.0f); /* one rank: unchanged */
    lora_allreduce_close(&ar);
    lora_allreduce_close(&ar);
    lora_allreduce_close(NULL);
    CHECK(lora_allreduce_unlink(name) == 0);

    CHECK(!lora_allreduce_open("no-slash", 0, 2, 8, 100, err, sizeof(err)) && errno == EINVAL);
    CHECK_CONTAINS(err, "invalid segment name 'no-slash'");
    CHECK(!lora_allreduce_open("/a/b", 0, 2, 8, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "invalid segment name");
    CHECK(!lora_allreduce_open(name, 2, 2, 8, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "invalid rank 2 of world_size 2");
    CHECK(!lora_allreduce_open(name, 0, 65, 8, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "world_size 65");
    CHECK(!lora_allreduce_open(name, 0, 2, 0, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "invalid max_floats 0");
    CHECK(!lora_allreduce_open(name, 0, 2, SIZE_MAX / 2, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "invalid max_floats");
    CHECK(!lora_allreduce_open(name, 0, 2, 8, 0, err, sizeof(err)));
    CHECK_CONTAINS(err, "invalid timeout_ms 0");
    CHECK(!is_in_dev_shm(name));
}

static void test_mismatched_segment(void)
{
    char err[256];
    const char *name = seg_name("mismatch");
    struct lora_allreduce *a0 = lora_allreduce_open(name, 0, 2, 64, 100, err, sizeof(err));
    struct lora_allreduce *a1 = NULL;
    char path[128];
    struct stat st;

    CHECK(a0 != NULL);
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);

    CHECK(!lora_allreduce_open(name, 1, 3, 64, 100, err, sizeof(err)) && errno == EINVAL);
    CHECK_CONTAINS(err, "has world_size 2, not 3");
    CHECK(!lora_allreduce_open(name, 1, 2, 65, 100, err, sizeof(err)) && errno == EINVAL);
    CHECK_CONTAINS(err, "has max_floats 64, not 65");
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 100, err, sizeof(err)) && errno == EEXIST);
    CHECK_CONTAINS(err, "rank 0 has already joined segment");
    CHECK(is_in_dev_shm(name));

    /* The group forms: the name goes, the mapping stays. */
    a1 = lora_allreduce_open(name, 1, 2, 64, 100, err, sizeof(err));
    CHECK(a1 != NULL);
    CHECK(!is_in_dev_shm(name));
    lora_allreduce_close(&a0);
    lora_allreduce_close(&a1);
    CHECK(lora_allreduce_unlink(name) == 0);
}

/* Makes a segment by hand: bytes of fill, mode. Returns 0 or -1. */
static int make_foreign(const char *name, size_t bytes, unsigned char fill, mode_t mode)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    int rc = -1;

    if (fd < 0)
        return -1;
    if (fchmod(fd, mode) == 0 && ftruncate(fd, (off_t)bytes) == 0) {
        rc = 0;
        if (bytes > 0) {
            void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                rc = -1;
            } else {
                memset(p, fill, bytes);
                munmap(p, bytes);
            }
        }
    }
    close(fd);
    return rc;
}

static void test_foreign_segment(void)
{
    char err[256];
    const char *name = seg_name("foreign");

    CHECK(make_foreign(name, 8192, 0x5a, 0600) == 0);
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "is not an all-reduce segment");
    CHECK(lora_allreduce_unlink(name) == 0);

    CHECK(make_foreign(name, 16, 0x5a, 0600) == 0);
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 100, err, sizeof(err)));
    CHECK_CONTAINS(err, "is not an all-reduce segment (16 bytes)");
    CHECK(lora_allreduce_unlink(name) == 0);

    CHECK(make_foreign(name, 8192, 0, 0644) == 0);
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 100, err, sizeof(err)) && errno == EPERM);
    CHECK_CONTAINS(err, "mode 0644");
    CHECK(lora_allreduce_unlink(name) == 0);

    /* Created and never sized, as by a creator that died at once. */
    CHECK(make_foreign(name, 0, 0, 0600) == 0);
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 50, err, sizeof(err)) && errno == ETIMEDOUT);
    CHECK_CONTAINS(err, "was not sized within 50 ms");
    CHECK(lora_allreduce_unlink(name) == 0);

    /* Sized, never initialised. */
    CHECK(make_foreign(name, 8192, 0, 0600) == 0);
    CHECK(!lora_allreduce_open(name, 0, 2, 64, 50, err, sizeof(err)) && errno == ETIMEDOUT);
    CHECK_CONTAINS(err, "was not initialised within 50 ms");
    CHECK(lora_allreduce_unlink(name) == 0);
}

int main(void)
{
    /* The in-process tests first: no OpenMP threads exist yet when the groups fork. */
    RUN(test_bad_arguments);
    RUN(test_mismatched_segment);
    RUN(test_foreign_segment);
    RUN(test_timeout);
    RUN(test_two_ranks);
    RUN(test_three_ranks);
    RUN(test_four_ranks);
    RUN(test_threaded_sum);
    RUN(test_timeout_breaks_group);
    RUN(test_ranks_disagree_on_n);
    return check_done();
}
