/* cuda_device: the CUDA devices this process can use. Built only with CUDA=1 (or auto when nvcc
 * is found), which also defines LORA_CUDA. */
#ifndef LORA_CUDA_DEVICE_H
#define LORA_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices, 0 when there are none, or -1 with err when the driver cannot be
 * reached (no driver installed is the usual reason). */
int lora_cuda_device_count(char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
