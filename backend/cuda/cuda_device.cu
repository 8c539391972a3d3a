/* cuda_device: what the CUDA runtime sees, for --version and for choosing a backend
 * (backend/backend.c). The CUDA backend's kernels, behind backend/backend.h's table, are not in
 * this version yet. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "backend/cuda/cuda_device.h"

extern "C" int lora_cuda_device_count(char *err, size_t err_len)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        snprintf(err, err_len, "cuda: %s", cudaGetErrorString(rc));
        return -1;
    }
    return n;
}
