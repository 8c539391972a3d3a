/* cuda_emu: a CPU emulation of the part of CUDA the CUDA backend uses, so that its kernels and its
 * host code run, unchanged, where there is no GPU: the tests link the backend compiled against this
 * header (LORA_CUDA_EMU, see backend/cuda/compat.h) and check it against backend/ref and against
 * the CPU backend like the real one.
 *
 * What it models, so that the bugs it is meant to catch show up:
 *   - Kernels: each block runs its threads as cooperative fibers on one OS thread, blocks one after
 *     another. __syncthreads and the warp shuffles are real barriers: a thread waits there until
 *     every thread of its block (warp) arrives, and the threads between two barriers run in an
 *     order that changes from barrier to barrier, so a missing barrier gives wrong results. A
 *     barrier some threads never reach (a divergent __syncthreads, a shuffle in a partial warp)
 *     aborts with the kernel's name. Static __shared__ arrays are function statics, shared by the
 *     block's fibers; dynamic shared memory and fresh device memory are filled with NaN bytes.
 *   - Launch limits: at most 1024 threads and 48 KiB of dynamic shared memory per block, grid
 *     dimensions y and z at most 65535; a bad launch is an error cudaGetLastError returns.
 *   - Streams: every launch, asynchronous copy, memset and GEMM is queued, in issue order (an
 *     order every real schedule of the streams and events used here may take), and runs only when
 *     the host synchronizes: cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous
 *     cudaMemcpy, cudaEventSynchronize, or a cudaEventQuery / cudaStreamQuery, which answer "not
 *     ready" once before they run the queue. A host-to-device copy from pageable memory reads its
 *     source at the call (as the driver's staging does); from memory of cudaHostAlloc, when it
 *     runs, so changing pinned memory before the copy completes is caught.
 *   - Device memory: each allocation is its own mapping, its end against an inaccessible guard
 *     page (an overrun faults), and inaccessible to the host except while queued work runs, so
 *     host code that reads or writes device memory directly faults. lora_emu_check_device()
 *     aborts when a pointer a kernel is given lies in no allocation.
 *   - cuBLAS: cublasGemmEx in column-major with the argument checks of the real library, for the
 *     F32, F16 and BF16 inputs and F32 output the backend uses, accumulated in float.
 * What it cannot show: speed, coalescing, the real cuBLAS and NCCL (collectives are refused), and
 * races between threads that the barrier-to-barrier order does not expose.
 *
 * Devices: LORA_CUDA_EMU_DEVICES (default 1) emulated devices of LORA_CUDA_EMU_MEMORY_MB (default
 * 8 GiB) each, whose cudaMemGetInfo counts what cudaMalloc holds and LORA_CUDA_EMU_OTHERS_MB that
 * other processes hold (default 0); 0 devices emulates a machine
 * without one (cudaErrorNoDevice).
 */
#ifndef LORA_CUDA_EMU_H
#define LORA_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

/* ---- the kernel's view ---- */

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_)
    {
    }
};

extern uint3 emu_thread_idx, emu_block_idx;
extern dim3 emu_block_dim, emu_grid_dim;
#define threadIdx emu_thread_idx
#define blockIdx  emu_block_idx
#define blockDim  emu_block_dim
#define gridDim   emu_grid_dim
#define warpSize  32

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
void *emu_dyn_smem(void);

/* One full-warp exchange: this lane's value in, lane src's out. */
void emu_shfl(const void *in, void *out, size_t bytes, unsigned mask, int src_lane, bool xor_mode);

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    T r;
    emu_shfl(&v, &r, sizeof(T), mask, lane_mask, true);
    return r;
}

template <class T> T __shfl_sync(unsigned mask, T v, int src_lane)
{
    T r;
    emu_shfl(&v, &r, sizeof(T), mask, src_lane, false);
    return r;
}

static inline int min(int a, int b)
{
    return a < b ? a : b;
}

static inline int max(int a, int b)
{
    return a > b ? a : b;
}

static inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

float emu_f16_to_f32(uint16_t h);
uint16_t emu_f32_to_f16(float f);
uint16_t emu_f32_to_bf16(float f);

/* ---- the runtime ---- */

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

#define cudaStreamNonBlocking  0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault   0x00

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int major, minor;
    int multiProcessorCount;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);

/* Queues a kernel of grid x block threads; name for the messages. */
void emu_launch(cudaStream_t s, dim3 grid, dim3 block, size_t smem, const char *name,
                std::function<void()> body);

/* Aborts naming what when p is neither NULL nor inside a device allocation. */
void lora_emu_check_device(const void *p, const char *what);

/* ---- cuBLAS ---- */

typedef struct emu_cublas *cublasHandle_t;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate_v2(cublasHandle_t *h);
cublasStatus_t cublasDestroy_v2(cublasHandle_t h);
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *workspace, size_t bytes);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
                            const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t s);

#endif
