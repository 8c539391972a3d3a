/* compat: what the CUDA backend's sources take from CUDA, in one place, so that the same sources
 * compile two ways: with nvcc against the CUDA toolkit (the real backend), or with the host C++
 * compiler against backend/cuda/emu, a CPU emulation of the runtime calls, the kernel launches and
 * cuBLAS that the tests use to run every kernel and every host path of the backend on a machine
 * without a GPU (LORA_CUDA_EMU; see backend/cuda/emu/cuda_emu.h).
 *
 * Kernels use only what is here and in the emulation: threadIdx, blockIdx, blockDim, gridDim,
 * __syncthreads, full-warp __shfl_xor_sync and __shfl_sync, static __shared__ arrays, dynamic
 * shared memory through LORA_DYN_SMEM, the element conversions below and the C math library.
 * Launches go through LORA_LAUNCH.
 */
#ifndef LORA_CUDA_COMPAT_H
#define LORA_CUDA_COMPAT_H

#include <stdint.h>

#ifdef LORA_CUDA_EMU

#include "backend/cuda/emu/cuda_emu.h"

#define LORA_DYN_SMEM() ((unsigned char *)emu_dyn_smem())
/* A launch is queued on its stream and runs, block by block, when the emulation is synchronized. */
#define LORA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    emu_launch((stream), (grid), (block), (smem), #kernel, [=]() { kernel(__VA_ARGS__); })

#else

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern __shared__ __align__(16) unsigned char lora_dyn_smem[];
#define LORA_DYN_SMEM() (lora_dyn_smem)
#define LORA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)

#endif

#define LORA_WARP 32

/* ---- element conversions, bit-exact with backend/dtype.c for every finite value ---- */

__device__ __forceinline__ float lora_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ float lora_f16_to_f32(uint16_t h)
{
#ifdef LORA_CUDA_EMU
    return emu_f16_to_f32(h);
#else
    return __half2float(__ushort_as_half(h));
#endif
}

/* Round to nearest even. */
__device__ __forceinline__ uint16_t lora_f32_to_bf16_rn(float f)
{
#ifdef LORA_CUDA_EMU
    return emu_f32_to_bf16(f);
#else
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}

__device__ __forceinline__ uint16_t lora_f32_to_f16_rn(float f)
{
#ifdef LORA_CUDA_EMU
    return emu_f32_to_f16(f);
#else
    return __half_as_ushort(__float2half_rn(f));
#endif
}

/* The element types a kernel is instantiated for: storage, and conversions to and from float
 * (rounding to nearest even). */
struct lora_f32_t {
    typedef float storage;
    __device__ __forceinline__ static float to_f32(float v)
    {
        return v;
    }
    __device__ __forceinline__ static float from_f32(float v)
    {
        return v;
    }
};

struct lora_bf16_t {
    typedef uint16_t storage;
    __device__ __forceinline__ static float to_f32(uint16_t h)
    {
        return lora_bf16_to_f32(h);
    }
    __device__ __forceinline__ static uint16_t from_f32(float v)
    {
        return lora_f32_to_bf16_rn(v);
    }
};

struct lora_f16_t {
    typedef uint16_t storage;
    __device__ __forceinline__ static float to_f32(uint16_t h)
    {
        return lora_f16_to_f32(h);
    }
    __device__ __forceinline__ static uint16_t from_f32(float v)
    {
        return lora_f32_to_f16_rn(v);
    }
};

#endif
