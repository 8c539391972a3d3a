/* cuda_device: what the CUDA runtime sees, for --version and for choosing a backend.
 * The CUDA kernels themselves sit beside this file behind kernels.h. */
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
