/* allreduce_shm: sums float buffers across the ranks of one host through POSIX shared memory;
 * see allreduce_shm.h for the segment, the barrier and the failure rules. */
#include "base/clock.h"
#include "backend/cpu/allreduce_shm.h"

#include "base/errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define SHM_MAGIC   0x4c4f524141523031ull /* "LORAAR01" */
#define SHM_VERSION 1u
#define CACHE_LINE  64

/* Waiting at the barrier: pause-spin this long first (ranks of one step usually arrive this close
 * together), then yield the CPU until YIELD_NS, then sleep on the futex in slices of at most
 * SLEEP_SLICE_NS, checking the deadline and the broken flag between slices. */
#define SPIN_NS        20000ull
#define YIELD_NS       200000ull
#define SLEEP_SLICE_NS 20000000ull

/* Summation: blocks of SUM_BLOCK floats (the output block stays in L1 while the slices stream
 * through it); OpenMP threads share the blocks only when the sum reads at least SUM_PAR_MIN floats
 * (n * world_size), below which starting the threads costs more than it saves. */
#define SUM_BLOCK   2048
#define SUM_PAR_MIN (1u << 18)

/* The head of the segment. Written once by the creator before the magic is published, except for
 * the atomics and n_of. Each hot counter has its own cache line. */
struct shm_header {
    _Atomic uint64_t magic; /* SHM_MAGIC once the creator has filled in the rest */
    uint32_t version;
    uint32_t world_size;
    uint64_t max_floats;
    uint64_t stride; /* floats per slice: max_floats rounded up to a cache line */
    uint64_t bytes;  /* of the whole segment */
    uint64_t data_offset;
    _Atomic uint64_t joined; /* bit r: rank r has opened the segment */
    _Atomic uint32_t broken; /* 1 once a rank timed out or the ranks disagreed on n */
    _Alignas(CACHE_LINE) _Atomic uint32_t arrived;    /* ranks at the current barrier */
    _Alignas(CACHE_LINE) _Atomic uint32_t generation; /* barriers completed; the futex word */
    _Alignas(CACHE_LINE) _Atomic uint32_t sleepers;   /* ranks in (or entering) FUTEX_WAIT */
    /* n of each rank's current call, per bank: written before the barrier, read after it. */
    _Alignas(CACHE_LINE) uint64_t n_of[2][LORA_ALLREDUCE_MAX_WORLD];
};

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free");
_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "the futex word is 32 bits");

struct lora_allreduce {
    struct shm_header *hdr; /* start of the mapping */
    float *data;            /* (2 banks, world_size, stride) */
    size_t map_bytes;
    size_t stride;
    size_t max_floats;
    int rank;
    int world_size;
    int timeout_ms;
    uint64_t n_calls; /* successful sums: call k uses bank k & 1 */
    bool broken;
};

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};

    nanosleep(&ts, NULL);
}

/* ---- layout ---- */

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

/* Fills stride and returns the segment's bytes, or 0 when they do not fit in an off_t. */
static size_t segment_bytes(int world_size, size_t max_floats, size_t *stride)
{
    size_t offset = round_up(sizeof(struct shm_header), 4096);
    size_t limit = (size_t)INT64_MAX / 2;

    if (max_floats > limit / sizeof(float))
        return 0;
    *stride = round_up(max_floats, CACHE_LINE / sizeof(float));
    if (*stride > (limit - offset) / sizeof(float) / 2 / (size_t)world_size)
        return 0;
    return offset + 2 * (size_t)world_size * *stride * sizeof(float);
}

static float *slice(const struct lora_allreduce *ar, int bank, int rank)
{
    return ar->data + ((size_t)bank * ar->world_size + rank) * ar->stride;
}

/* ---- opening ---- */

static bool is_valid_name(const char *name)
{
    size_t len = name ? strlen(name) : 0;

    return len >= 2 && len <= 255 && name[0] == '/' && !strchr(name + 1, '/');
}

static int map_segment(struct lora_allreduce *ar, int fd, size_t bytes, const char *name, char *err,
                       size_t err_len)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    if (p == MAP_FAILED) {
        lora_errf(err, err_len, "unable to map segment '%s': %s", name, strerror(errno));
        return -1;
    }
    ar->hdr = p;
    ar->map_bytes = bytes;
    return 0;
}

/* The caller created fd: size it, fill in the header, publish the magic last. */
static int create_segment(struct lora_allreduce *ar, int fd, size_t bytes, const char *name,
                          char *err, size_t err_len)
{
    /* fchmod: the umask may have taken bits from 0600 that the other ranks need. posix_fallocate
     * rather than ftruncate: a full /dev/shm fails here, not with a SIGBUS in a step. */
    if (fchmod(fd, 0600) < 0) {
        lora_errf(err, err_len, "unable to set the mode of segment '%s': %s", name,
                  strerror(errno));
        return -1;
    }
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        errno = rc;
        lora_errf(err, err_len, "unable to reserve %zu bytes for segment '%s': %s", bytes, name,
                  strerror(rc));
        return -1;
    }
    if (map_segment(ar, fd, bytes, name, err, err_len) < 0)
        return -1;
    struct shm_header *h = ar->hdr;
    h->version = SHM_VERSION;
    h->world_size = (uint32_t)ar->world_size;
    h->max_floats = ar->max_floats;
    h->stride = ar->stride;
    h->bytes = bytes;
    h->data_offset = round_up(sizeof(*h), 4096);
    atomic_store_explicit(&h->joined, 0, memory_order_relaxed);
    atomic_store_explicit(&h->broken, 0, memory_order_relaxed);
    atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&h->generation, 0, memory_order_relaxed);
    atomic_store_explicit(&h->sleepers, 0, memory_order_relaxed);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    return 0;
}

/* Waits until the creator has sized fd; refuses a segment another user could reach. */
static int wait_sized(int fd, const char *name, uint64_t deadline, int timeout_ms, off_t *size,
                      char *err, size_t err_len)
{
    struct stat st;

    for (;;) {
        if (fstat(fd, &st) < 0) {
            lora_errf(err, err_len, "unable to stat segment '%s': %s", name, strerror(errno));
            return -1;
        }
        if (st.st_uid != geteuid() || (st.st_mode & 077)) {
            lora_errf(err, err_len,
                      "segment '%s' belongs to uid %u with mode %04o, not to us alone", name,
                      (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
            errno = EPERM;
            return -1;
        }
        if (st.st_size > 0)
            break;
        if (lora_clock_mono_ns() >= deadline) {
            lora_errf(err, err_len, "segment '%s' was not sized within %d ms", name, timeout_ms);
            errno = ETIMEDOUT;
            return -1;
        }
        sleep_ns(1000000);
    }
    if ((size_t)st.st_size < sizeof(struct shm_header)) {
        lora_errf(err, err_len, "segment '%s' is not an all-reduce segment (%lld bytes)", name,
                  (long long)st.st_size);
        errno = EINVAL;
        return -1;
    }
    *size = st.st_size;
    return 0;
}

/* Waits for the creator's magic, then checks that the segment matches the caller's group. */
static int check_header(const struct lora_allreduce *ar, off_t size, size_t bytes, const char *name,
                        uint64_t deadline, char *err, size_t err_len)
{
    const struct shm_header *h = ar->hdr;
    uint64_t magic;

    errno = EINVAL;
    while ((magic = atomic_load_explicit(&h->magic, memory_order_acquire)) == 0) {
        if (lora_clock_mono_ns() >= deadline) {
            lora_errf(err, err_len,
                      "segment '%s' was not initialised within %d ms (its creator died?)", name,
                      ar->timeout_ms);
            errno = ETIMEDOUT;
            return -1;
        }
        sleep_ns(1000000);
    }
    if (magic != SHM_MAGIC || h->version != SHM_VERSION) {
        lora_errf(err, err_len, "segment '%s' is not an all-reduce segment of version %u", name,
                  SHM_VERSION);
        return -1;
    }
    if (h->world_size != (uint32_t)ar->world_size) {
        lora_errf(err, err_len, "segment '%s' has world_size %u, not %d", name, h->world_size,
                  ar->world_size);
        return -1;
    }
    if (h->max_floats != ar->max_floats) {
        lora_errf(err, err_len, "segment '%s' has max_floats %llu, not %zu", name,
                  (unsigned long long)h->max_floats, ar->max_floats);
        return -1;
    }
    if ((size_t)size != bytes || h->bytes != bytes || h->stride != ar->stride ||
        h->data_offset != round_up(sizeof(*h), 4096)) {
        lora_errf(err, err_len, "segment '%s' has %lld bytes, not %zu", name, (long long)size,
                  bytes);
        return -1;
    }
    return 0;
}

/* fd was created by another rank: wait until it is ready and check that it is ours. */
static int attach_segment(struct lora_allreduce *ar, int fd, size_t bytes, const char *name,
                          uint64_t deadline, char *err, size_t err_len)
{
    off_t size;

    if (wait_sized(fd, name, deadline, ar->timeout_ms, &size, err, err_len) < 0)
        return -1;
    if (map_segment(ar, fd, (size_t)size, name, err, err_len) < 0)
        return -1;
    return check_header(ar, size, bytes, name, deadline, err, err_len);
}

/* Creates the segment, or attaches to the one another rank created. Returns 0, or -1 with errno
 * and err; ar->hdr may be mapped either way. */
static int open_segment(struct lora_allreduce *ar, size_t bytes, const char *name, char *err,
                        size_t err_len)
{
    uint64_t deadline = lora_clock_mono_ns() + (uint64_t)ar->timeout_ms * 1000000ull;

    for (;;) {
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        bool created = fd >= 0;

        if (!created && errno == EEXIST)
            fd = shm_open(name, O_RDWR, 0);
        if (fd < 0 && errno == ENOENT && lora_clock_mono_ns() < deadline) {
            /* Removed between the two calls (a group that just formed, or an unlink): again. */
            sleep_ns(1000000);
            continue;
        }
        if (fd < 0) {
            lora_errf(err, err_len, "unable to open segment '%s': %s", name, strerror(errno));
            return -1;
        }
        int rc = created ? create_segment(ar, fd, bytes, name, err, err_len)
                         : attach_segment(ar, fd, bytes, name, deadline, err, err_len);
        int saved = errno;
        if (rc < 0 && created)
            shm_unlink(name);
        close(fd);
        errno = saved;
        return rc;
    }
}

/* Marks rank as joined; the last rank to join removes the name (see the header comment). */
static int join(struct lora_allreduce *ar, const char *name, char *err, size_t err_len)
{
    struct shm_header *h = ar->hdr;
    uint64_t bit = 1ull << ar->rank;
    uint64_t all = ar->world_size == 64 ? ~0ull : (1ull << ar->world_size) - 1;
    uint64_t before = atomic_fetch_or_explicit(&h->joined, bit, memory_order_acq_rel);

    if (before & bit) {
        lora_errf(err, err_len,
                  "rank %d has already joined segment '%s' (a restarted rank needs a new group)",
                  ar->rank, name);
        errno = EEXIST;
        return -1;
    }
    if ((before | bit) == all)
        shm_unlink(name);
    return 0;
}

struct lora_allreduce *lora_allreduce_open(const char *name, int rank, int world_size,
                                           size_t max_floats, int timeout_ms, char *err,
                                           size_t err_len)
{
    size_t stride = 0, bytes = 0;

    errno = EINVAL;
    if (!is_valid_name(name)) {
        lora_errf(err, err_len, "invalid segment name '%s': want '/name' without another '/'",
                  name ? name : "(null)");
        return NULL;
    }
    if (world_size < 1 || world_size > LORA_ALLREDUCE_MAX_WORLD || rank < 0 || rank >= world_size) {
        lora_errf(err, err_len, "invalid rank %d of world_size %d (at most %d ranks)", rank,
                  world_size, LORA_ALLREDUCE_MAX_WORLD);
        return NULL;
    }
    if (timeout_ms < 1) {
        lora_errf(err, err_len, "invalid timeout_ms %d: want at least 1", timeout_ms);
        return NULL;
    }
    if (max_floats < 1 || !(bytes = segment_bytes(world_size, max_floats, &stride))) {
        lora_errf(err, err_len, "invalid max_floats %zu for world_size %d", max_floats, world_size);
        return NULL;
    }
    struct lora_allreduce *ar = calloc(1, sizeof(*ar));
    if (!ar) {
        lora_errf(err, err_len, "unable to allocate the all-reduce handle: %s", strerror(errno));
        return NULL;
    }
    ar->stride = stride;
    ar->max_floats = max_floats;
    ar->rank = rank;
    ar->world_size = world_size;
    ar->timeout_ms = timeout_ms;
    if (open_segment(ar, bytes, name, err, err_len) < 0 || join(ar, name, err, err_len) < 0) {
        int saved = errno;
        lora_allreduce_close(&ar);
        errno = saved;
        return NULL;
    }
    ar->data = (float *)(void *)((char *)ar->hdr + ar->hdr->data_offset); /* page-aligned */
    return ar;
}

void lora_allreduce_close(struct lora_allreduce **arp)
{
    struct lora_allreduce *ar = arp ? *arp : NULL;

    if (!ar)
        return;
    if (ar->hdr)
        munmap(ar->hdr, ar->map_bytes);
    free(ar);
    *arp = NULL;
}

int lora_allreduce_unlink(const char *name)
{
    if (!is_valid_name(name)) {
        errno = EINVAL;
        return -1;
    }
    if (shm_unlink(name) < 0 && errno != ENOENT)
        return -1;
    return 0;
}

/* ---- barrier ---- */

static bool is_released(struct shm_header *h, uint32_t gen)
{
    return atomic_load_explicit(&h->generation, memory_order_acquire) != gen;
}

/* Breaks the group for every rank and wakes the sleepers so that they see it. */
static void break_group(struct lora_allreduce *ar)
{
    ar->broken = true;
    atomic_store_explicit(&ar->hdr->broken, 1, memory_order_seq_cst);
    syscall(SYS_futex, (uint32_t *)&ar->hdr->generation, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Sleeps until the generation moves from gen, a wake, or ns pass. The sleepers count and the
 * releaser's check of it (both seq_cst) close the lost-wake race: either the releaser sees a
 * sleeper and wakes it, or the sleeper sees the new generation (here or in the kernel's compare).
 */
static void sleep_on(struct shm_header *h, uint32_t gen, uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};

    atomic_fetch_add_explicit(&h->sleepers, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&h->generation, memory_order_seq_cst) == gen)
        syscall(SYS_futex, (uint32_t *)&h->generation, FUTEX_WAIT, gen, &ts, NULL, 0);
    atomic_fetch_sub_explicit(&h->sleepers, 1, memory_order_seq_cst);
}

/* Waits for the release of barrier generation gen: spin, yield, then sleep. Progress (another
 * rank arriving) restarts the timeout. */
static int wait_release(struct lora_allreduce *ar, uint32_t gen)
{
    struct shm_header *h = ar->hdr;
    uint64_t start = lora_clock_mono_ns(), timeout_ns = (uint64_t)ar->timeout_ms * 1000000ull;
    uint64_t progress_at = start;
    uint32_t seen = atomic_load_explicit(&h->arrived, memory_order_relaxed);

    for (unsigned i = 0;; i++) {
        if (is_released(h, gen))
            return 0;
        if ((i & 63) == 63 && lora_clock_mono_ns() - start >= SPIN_NS)
            break;
        cpu_relax();
    }
    while (lora_clock_mono_ns() - start < YIELD_NS) {
        if (is_released(h, gen))
            return 0;
        sched_yield();
    }
    for (;;) {
        if (is_released(h, gen))
            return 0;
        if (atomic_load_explicit(&h->broken, memory_order_acquire)) {
            ar->broken = true;
            errno = ENOTRECOVERABLE;
            return -1;
        }
        uint64_t now = lora_clock_mono_ns();
        uint32_t arrived = atomic_load_explicit(&h->arrived, memory_order_relaxed);
        if (arrived != seen) {
            seen = arrived;
            progress_at = now;
        }
        if (now - progress_at >= timeout_ns) {
            if (is_released(h, gen)) /* released while we looked at the clock */
                return 0;
            break_group(ar);
            errno = ETIMEDOUT;
            return -1;
        }
        uint64_t left = timeout_ns - (now - progress_at);
        sleep_on(h, gen, left < SLEEP_SLICE_NS ? left : SLEEP_SLICE_NS);
    }
}

/* Returns when every rank has arrived. The arrivals' release/acquire on `arrived` and the
 * releaser's store to `generation` make every slice written before the barrier visible after it. */
static int barrier(struct lora_allreduce *ar)
{
    struct shm_header *h = ar->hdr;
    uint32_t gen = atomic_load_explicit(&h->generation, memory_order_acquire);
    uint32_t before = atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel);

    if (before + 1 < (uint32_t)ar->world_size)
        return wait_release(ar, gen);
    /* Last to arrive: reset the count before the release, which orders it for the next round. */
    atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&h->generation, gen + 1, memory_order_seq_cst);
    if (atomic_load_explicit(&h->sleepers, memory_order_seq_cst) > 0)
        syscall(SYS_futex, (uint32_t *)&h->generation, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    return 0;
}

/* ---- sum ---- */

/* buf = slice 0 + slice 1 + ... of bank, element by element in rank order. */
static void sum_slices(const struct lora_allreduce *ar, int bank, float *buf, size_t n)
{
    size_t n_blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    int world_size = ar->world_size;

#pragma omp parallel for schedule(static) if (n * (size_t)world_size >= SUM_PAR_MIN)
    for (size_t b = 0; b < n_blocks; b++) {
        size_t lo = b * SUM_BLOCK, len = n - lo < SUM_BLOCK ? n - lo : SUM_BLOCK;
        float *restrict out = buf + lo;

        memcpy(out, slice(ar, bank, 0) + lo, len * sizeof(float));
        for (int r = 1; r < world_size; r++) {
            const float *restrict in = slice(ar, bank, r) + lo;
            for (size_t i = 0; i < len; i++)
                out[i] += in[i];
        }
    }
}

int lora_allreduce_sum(float *buf, size_t n, void *ctx)
{
    struct lora_allreduce *ar = ctx;

    if (!ar || (n > 0 && !buf) || n > ar->max_floats) {
        errno = EINVAL;
        return -1;
    }
    if (n == 0 || ar->world_size == 1)
        return 0;
    struct shm_header *h = ar->hdr;
    if (ar->broken || atomic_load_explicit(&h->broken, memory_order_acquire)) {
        ar->broken = true;
        errno = ENOTRECOVERABLE;
        return -1;
    }
    int bank = (int)(ar->n_calls & 1);
    memcpy(slice(ar, bank, ar->rank), buf, n * sizeof(float));
    h->n_of[bank][ar->rank] = n;
    if (barrier(ar) < 0)
        return -1;
    ar->n_calls++;
    for (int r = 0; r < ar->world_size; r++) {
        if (h->n_of[bank][r] != n) {
            break_group(ar);
            errno = EPROTO;
            return -1;
        }
    }
    sum_slices(ar, bank, buf, n);
    return 0;
}
