/* libs_cuda: cuBLAS and NCCL, loaded with dlopen when first needed.
 *
 * Why not link them: a CUDA build must start, serve on the CPU and pass the CPU test suite on a
 * machine with no GPU and no CUDA libraries beyond what the binary carries. The CUDA runtime is
 * linked statically (cudart_static, a few hundred KiB); cuBLAS (with cuBLASLt, ~700 MB) and NCCL
 * (~200 MB) are not, so a CPU-only run never maps them: cuBLAS is loaded when a CUDA backend
 * opens, NCCL when a tensor-parallel group is formed. Each is looked for first in the CUDA toolkit
 * the binary was built with (LORA_CUDA_LIBDIR, whose headers match), then by soname through the
 * usual search path (LD_LIBRARY_PATH, ldconfig). Loaded once per process and never unloaded.
 * Under the CPU emulation (LORA_CUDA_EMU) cuBLAS is the emulation's and NCCL is absent.
 */
#ifndef LORA_LIBS_CUDA_H
#define LORA_LIBS_CUDA_H

#include <stddef.h>

#include "backend/cuda/compat.h"

#ifndef LORA_CUDA_EMU
#include <cublas_api.h>
#include <nccl.h>
#endif

/* cublasGemmEx has a C++ overload beside the exported function: this is the exported one. */
typedef cublasStatus_t (*lora_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                          int, int, const void *, const void *, cudaDataType, int,
                                          const void *, cudaDataType, int, const void *, void *,
                                          cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct lora_cublas {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetWorkspace_v2) set_workspace;
    lora_gemm_ex_fn gemm_ex;
    decltype(&cublasGetStatusString) status_string;
};

/* cuBLAS's functions, or NULL with err (the library or a symbol missing). */
const struct lora_cublas *lora_cuda_cublas(char *err, size_t err_len);

#ifndef LORA_CUDA_EMU
struct lora_nccl {
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRankConfig) comm_init_rank_config;
    decltype(&ncclCommGetAsyncError) comm_get_async_error;
    decltype(&ncclCommAbort) comm_abort;
    decltype(&ncclCommDestroy) comm_destroy;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGetErrorString) error_string;
};

/* NCCL's functions, or NULL with err. */
const struct lora_nccl *lora_cuda_nccl(char *err, size_t err_len);
#endif

#endif
