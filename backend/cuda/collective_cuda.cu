/* collective_cuda: the CUDA backend's tensor-parallel all-reduce, through NCCL (loaded when the
 * first group forms, libs_cuda.h).
 *
 * Forming a group: rank 0 asks NCCL for a unique id and publishes it in a small POSIX
 * shared-memory object named after the group ("<name>.nccl", mode 0600, the id written before a
 * magic word); the other ranks wait, at most timeout_ms, for the magic and read the id; then every
 * rank creates its communicator, non-blocking, and polls it until the whole group has joined, at
 * most timeout_ms. Rank 0 removes the name once its communicator is ready (or failed), so a formed
 * group leaves nothing behind. Each rank must own a different device (NCCL refuses two ranks on
 * one GPU).
 *
 * Summing: ncclAllReduce in place on the compute stream, queued with the step's other work; every
 * rank gets the same bits (NCCL reduces each element once and broadcasts it). A dead peer makes
 * the reduction wait forever on the device, so while a group is open every host wait of the backend
 * (download, upload) polls, bounded by the group's timeout, and aborts the communicator when it
 * passes: the step fails with that reason and every later sum with ENOTRECOVERABLE, and the worker
 * must form a new group (as with the CPU's all-reduce).
 *
 * Under the CPU emulation there is no NCCL: collective_open fails with the reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/backend_cuda_impl.h"

#ifdef LORA_CUDA_EMU

struct cuda_coll {
    int unused;
};

struct lora_collective *lora_cuda_collective_open(struct lora_backend *be, const char *name,
                                                  int rank, int world_size, size_t max_floats,
                                                  int timeout_ms, char *err, size_t err_len)
{
    snprintf(err, err_len, "NCCL is not part of the CUDA emulation");
    return NULL;
}

int lora_cuda_allreduce_sum(struct lora_backend *be, struct lora_collective *c, float *buf,
                            size_t n)
{
    errno = EINVAL;
    return -1;
}

void lora_cuda_collective_close(struct lora_backend *be, struct lora_collective **c)
{
}

bool lora_cuda_colls_broken(struct cuda_be *cb, bool abort)
{
    return false;
}

int lora_cuda_colls_timeout_ms(struct cuda_be *cb)
{
    return 0;
}

#else

#define ID_MAGIC 0x4e43434cu /* "NCCL" */

struct id_page {
    uint32_t magic; /* written last (release), read first (acquire) */
    ncclUniqueId id;
};

struct cuda_coll {
    const struct lora_nccl *nccl;
    ncclComm_t comm;
    int rank, world;
    size_t max_floats;
    int timeout_ms;
    bool broken;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Publishes id under shm (rank 0). Returns 0, or -1 with err. */
static int publish_id(const char *shm, const ncclUniqueId *id, char *err, size_t err_len)
{
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        snprintf(err, err_len, "shm_open %.200s: %s", shm, strerror(errno));
        return -1;
    }
    struct id_page *p = NULL;
    if (ftruncate(fd, sizeof(*p)) == 0)
        p = (struct id_page *)mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (!p || p == MAP_FAILED) {
        snprintf(err, err_len, "%.200s: %s", shm, strerror(errno));
        shm_unlink(shm);
        return -1;
    }
    p->id = *id;
    __atomic_store_n(&p->magic, ID_MAGIC, __ATOMIC_RELEASE);
    munmap(p, sizeof(*p));
    return 0;
}

/* Waits for rank 0's id under shm until deadline. Returns 0, or -1 with err. */
static int read_id(const char *shm, ncclUniqueId *id, double deadline, char *err, size_t err_len)
{
    for (;;) {
        int fd = shm_open(shm, O_RDONLY, 0);
        if (fd >= 0) {
            struct stat st;
            struct id_page *p = NULL;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(*p))
                p = (struct id_page *)mmap(NULL, sizeof(*p), PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (p && p != MAP_FAILED) {
                bool ready = __atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) == ID_MAGIC;
                if (ready)
                    *id = p->id;
                munmap(p, sizeof(*p));
                if (ready)
                    return 0;
            }
        }
        if (now_ms() > deadline) {
            snprintf(err, err_len, "rank 0 did not publish the group's NCCL id (%.120s) in time", shm);
            return -1;
        }
        usleep(1000);
    }
}

/* Polls a non-blocking communicator until rc is no longer ncclInProgress, or deadline. */
static ncclResult_t settle(const struct lora_nccl *nccl, ncclComm_t comm, ncclResult_t rc,
                           double deadline)
{
    while (rc == ncclInProgress) {
        if (now_ms() > deadline)
            return ncclInProgress;
        usleep(200);
        if (nccl->comm_get_async_error(comm, &rc) != ncclSuccess)
            return ncclInternalError;
    }
    return rc;
}

struct lora_collective *lora_cuda_collective_open(struct lora_backend *be, const char *name,
                                                  int rank, int world_size, size_t max_floats,
                                                  int timeout_ms, char *err, size_t err_len)
{
    struct cuda_be *cb = lora_cuda_be(be);
    char shm[256], why[256];
    int version = 0;

    if (!name || name[0] != '/' || strchr(name + 1, '/') || rank < 0 || rank >= world_size ||
        timeout_ms < 1 || strlen(name) > 200) {
        snprintf(err, err_len, "cuda: invalid group arguments");
        return NULL;
    }
    if (cb->n_colls == CUDA_MAX_COLLS) {
        snprintf(err, err_len, "cuda: too many open groups");
        return NULL;
    }
    const struct lora_nccl *nccl = lora_cuda_nccl(why, sizeof(why));
    if (!nccl) {
        snprintf(err, err_len, "cuda: the all-reduce needs NCCL: %s", why);
        return NULL;
    }
    if (nccl->get_version(&version) != ncclSuccess || version < 21400) {
        snprintf(err, err_len, "cuda: NCCL %d is too old (2.14 or newer)", version);
        return NULL;
    }
    snprintf(shm, sizeof(shm), "%s.nccl", name);
    double deadline = now_ms() + timeout_ms;
    ncclUniqueId id;
    if (rank == 0) {
        ncclResult_t rc = nccl->get_unique_id(&id);
        if (rc != ncclSuccess) {
            snprintf(err, err_len, "cuda: ncclGetUniqueId: %s", nccl->error_string(rc));
            return NULL;
        }
        if (publish_id(shm, &id, why, sizeof(why)) < 0) {
            snprintf(err, err_len, "cuda: %s", why);
            return NULL;
        }
    } else if (read_id(shm, &id, deadline, why, sizeof(why)) < 0) {
        snprintf(err, err_len, "cuda: %s", why);
        return NULL;
    }
    struct cuda_coll *c = (struct cuda_coll *)calloc(1, sizeof(*c));
    if (!c) {
        if (rank == 0)
            shm_unlink(shm);
        snprintf(err, err_len, "cuda: out of memory");
        return NULL;
    }
    cudaSetDevice(cb->device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* so that a rank that never comes costs timeout_ms, not forever */
    ncclResult_t rc = nccl->comm_init_rank_config(&c->comm, world_size, id, rank, &cfg);
    rc = settle(nccl, c->comm, rc, deadline);
    if (rank == 0)
        shm_unlink(shm);
    if (rc != ncclSuccess) {
        if (c->comm)
            nccl->comm_abort(c->comm);
        snprintf(err, err_len, "cuda: forming the NCCL group of %d ranks: %s", world_size,
                 rc == ncclInProgress ? "timed out waiting for the other ranks"
                                      : nccl->error_string(rc));
        free(c);
        return NULL;
    }
    c->nccl = nccl;
    c->rank = rank;
    c->world = world_size;
    c->max_floats = max_floats;
    c->timeout_ms = timeout_ms;
    cb->colls[cb->n_colls++] = c;
    return (struct lora_collective *)c;
}

int lora_cuda_allreduce_sum(struct lora_backend *be, struct lora_collective *lc, float *buf,
                            size_t n)
{
    struct cuda_be *cb = lora_cuda_be(be);
    struct cuda_coll *c = (struct cuda_coll *)lc;

    if (!c || !buf || n > c->max_floats) {
        errno = EINVAL;
        return -1;
    }
    if (c->broken || lora_cuda_colls_broken(cb, false)) {
        errno = ENOTRECOVERABLE;
        return -1;
    }
    if (cb->failed) {
        errno = EIO;
        return -1;
    }
    if (!n)
        return 0;
    cudaSetDevice(cb->device);
    ncclResult_t rc = c->nccl->all_reduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, cb->stream);
    rc = settle(c->nccl, c->comm, rc, now_ms() + c->timeout_ms);
    if (rc != ncclSuccess) {
        lora_cuda_fail(cb, "all-reduce",
                       rc == ncclInProgress ? "timed out" : c->nccl->error_string(rc));
        lora_cuda_colls_broken(cb, true);
        errno = rc == ncclInProgress ? ETIMEDOUT : EIO;
        return -1;
    }
    return 0;
}

void lora_cuda_collective_close(struct lora_backend *be, struct lora_collective **lc)
{
    struct cuda_be *cb = lora_cuda_be(be);
    struct cuda_coll *c = lc ? (struct cuda_coll *)*lc : NULL;

    if (!c)
        return;
    cudaSetDevice(cb->device);
    /* Drained while the group is still open, so that the wait stays bounded by it. */
    if (!c->broken) {
        char err[64];
        lora_cuda_wait(cb, err, sizeof(err));
    }
    for (int i = 0; i < cb->n_colls; i++) {
        if (cb->colls[i] == c) {
            cb->colls[i] = cb->colls[--cb->n_colls];
            break;
        }
    }
    /* Abort, not destroy: it never waits for peers that may be gone, and nothing of ours is
     * pending once the stream is drained. */
    if (c->comm)
        c->nccl->comm_abort(c->comm);
    free(c);
    *lc = NULL;
}

bool lora_cuda_colls_broken(struct cuda_be *cb, bool abort)
{
    bool broken = false;

    for (int i = 0; i < cb->n_colls; i++) {
        struct cuda_coll *c = cb->colls[i];
        ncclResult_t rc = ncclSuccess;
        if (!c->broken && c->comm && c->nccl->comm_get_async_error(c->comm, &rc) == ncclSuccess &&
            rc != ncclSuccess && rc != ncclInProgress)
            c->broken = true;
        if (abort && c->comm) {
            c->nccl->comm_abort(c->comm);
            c->comm = NULL;
            c->broken = true;
        }
        broken = broken || c->broken;
    }
    return broken;
}

int lora_cuda_colls_timeout_ms(struct cuda_be *cb)
{
    int t = 0;

    for (int i = 0; i < cb->n_colls; i++)
        if (!t || cb->colls[i]->timeout_ms < t)
            t = cb->colls[i]->timeout_ms;
    return t;
}

#endif
