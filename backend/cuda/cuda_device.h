/* cuda_device: the CUDA devices this process can use, and the CUDA backend's constructor. Built
 * only with CUDA=1 (or auto when nvcc is found), which also defines LORA_CUDA. */
#ifndef LORA_CUDA_DEVICE_H
#define LORA_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct lora_backend;

/* Number of CUDA devices, or -1 with err when there is none or the driver cannot be reached:
 * "no NVIDIA driver is installed (libcuda.so.1 not found)", "no CUDA-capable device is
 * detected", ... (one clause, no prefix). */
int lora_cuda_device_count(char *err, size_t err_len);

/* Opens CUDA device index as a backend (backend/cuda/backend_cuda.cu): NULL with one clause in
 * err when the device is missing, too old for this build, or cuBLAS cannot be loaded. */
struct lora_backend *lora_cuda_backend_new(int index, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
