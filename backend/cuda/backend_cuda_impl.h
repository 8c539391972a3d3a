/* backend_cuda_impl: the CUDA backend's state, shared by its files (backend_cuda.cu: memory and
 * operations; collective_cuda.cu: the NCCL group). Private to backend/cuda.
 *
 * One backend is one device, one compute stream on which every operation, copy and cuBLAS call is
 * queued in call order, and one copy stream for upload_async. The small per-step index arrays the
 * operations take in host memory go through staging regions: device memory carved at open, one
 * per kind of table, each with a host copy of what it holds, so that a table equal to the last one
 * (the positions, slots and attention tables repeat in every layer of a step) is not copied again.
 * A copy into a region is queued on the compute stream from pageable host memory, which the driver
 * stages before the call returns; the region is then reused by the next operation of its kind,
 * after the one that read it, in stream order. Nothing is allocated after open but the buffers
 * the caller asks for.
 *
 * Errors: an operation cannot return one. The first CUDA or cuBLAS failure (or a shape the
 * kernels cannot take) is kept, later operations are skipped, and the next call that can fail
 * (download, upload, allreduce_sum) returns it, so a step fails with its reason.
 */
#ifndef LORA_BACKEND_CUDA_IMPL_H
#define LORA_BACKEND_CUDA_IMPL_H

#include <stdint.h>

#include "backend/cuda/compat.h"
#include "backend/cuda/kernels_cuda.h"
#include "backend/cuda/libs_cuda.h"

enum cuda_region_kind { REG_IDS, REG_POS, REG_SLOT, REG_ATTN, REG_SGMV, N_REGIONS };

struct cuda_region {
    void *dev; /* cap bytes of device memory */
    size_t cap;
    char *shadow; /* host copy of what dev holds */
    size_t len;
    bool valid;
};

/* Tickets of upload_async in flight at once before the oldest is waited for. */
#define CUDA_TICKETS   64
#define CUDA_MAX_COLLS 4

struct cuda_coll;

/* Capacities of one attention or lora_sgmv launch's tables. */
#define ATTN_SEQS_CAP   16384
#define ATTN_TABLES_CAP (1 << 20)
#define ATTN_ITEMS_CAP  (160 * 1024)
#define ATTN_MERGES_CAP 65536
#define SGMV_SEGS_CAP   4096
#define SGMV_ITEMS_CAP  32768
#define ROWS_CAP        65536 /* rows of ids, positions or slots per launch */

struct cuda_be {
    int device;
    int n_devices;
    cudaStream_t stream;      /* every operation */
    cudaStream_t copy_stream; /* upload_async */
    cudaEvent_t fence;        /* where the compute stream was when an async upload began */
    cudaEvent_t tickets[CUDA_TICKETS];
    uint64_t next_ticket; /* tickets are 1, 2, ...; 0 is never given */

    const struct lora_cublas *blas;
    cublasHandle_t handle;
    void *blas_ws;

    struct cuda_region reg[N_REGIONS];
    void *work; /* matmul's 16-bit pieces and their products; attention's partial results */
    size_t work_bytes;

    /* Host tables being assembled for one launch. */
    char *pack;
    struct lora_cuda_attn_seq *a_seqs;
    int *a_tables;
    struct lora_cuda_attn_item *a_items;
    struct lora_cuda_attn_merge *a_merges;
    struct lora_cuda_sgmv_seg *s_segs;
    struct lora_cuda_sgmv_item *s_items;

    struct cuda_coll *colls[CUDA_MAX_COLLS]; /* open groups: host waits are bounded by them */
    int n_colls;

    bool failed;
    char error[256];
};

/* The backend's state. */
struct cuda_be *lora_cuda_be(struct lora_backend *be);

/* Keeps the first failure: "cuda:N: what: reason". */
void lora_cuda_fail(struct cuda_be *cb, const char *what, const char *reason);

/* Waits until the compute stream has run all it was given; bounded by the open groups' timeout,
 * whose communicators are aborted when it passes. Returns 0, or -1 with err. */
int lora_cuda_wait(struct cuda_be *cb, char *err, size_t err_len);

/* The group operations of the table (collective_cuda.cu). */
struct lora_collective *lora_cuda_collective_open(struct lora_backend *be, const char *name,
                                                  int rank, int world_size, size_t max_floats,
                                                  int timeout_ms, char *err, size_t err_len);
int lora_cuda_allreduce_sum(struct lora_backend *be, struct lora_collective *c, float *buf,
                            size_t n);
void lora_cuda_collective_close(struct lora_backend *be, struct lora_collective **c);

/* Polls the open groups for an asynchronous error and, when abort, aborts them all; returns
 * whether one is broken. */
bool lora_cuda_colls_broken(struct cuda_be *cb, bool abort);

/* The smallest timeout of the open groups, in ms (0 when none is open). */
int lora_cuda_colls_timeout_ms(struct cuda_be *cb);

#endif
