/* cuda_device: what the CUDA runtime sees, for --version and for opening the backend
 * (backend/backend.c). */
#include <dlfcn.h>
#include <stdio.h>

#include "backend/cuda/compat.h"
#include "backend/cuda/cuda_device.h"

extern "C" int lora_cuda_device_count(char *err, size_t err_len)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);

    if (rc == cudaSuccess && n > 0)
        return n;
    if (rc == cudaSuccess || rc == cudaErrorNoDevice) {
        snprintf(err, err_len, "no CUDA-capable device is detected");
        return -1;
    }
#ifndef LORA_CUDA_EMU
    /* The runtime says "driver too old" also when there is no driver at all: tell them apart. */
    if (rc == cudaErrorInsufficientDriver) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!h) {
            snprintf(err, err_len, "no NVIDIA driver is installed (libcuda.so.1 not found)");
            return -1;
        }
        dlclose(h);
    }
#endif
    snprintf(err, err_len, "%s", cudaGetErrorString(rc));
    return -1;
}
