/* backend_cpu: the CPU backend's constructor, for backend.c's lora_backend_open("cpu").
 *
 * Owns nothing but the name through which backend/backend.c reaches backend/cpu; everything else
 * of the CPU backend is static in backend_cpu.c or private to backend/cpu (kernels_cpu.h), reached
 * through the table of backend/backend.h (docs/design.md, "Backend").
 */
#ifndef LORA_BACKEND_CPU_H
#define LORA_BACKEND_CPU_H

#include <stddef.h>

#include "backend/backend.h"

/* A CPU backend: host memory, the OpenMP kernels, the shared-memory all-reduce. NULL with err. */
struct lora_backend *lora_cpu_backend_new(char *err, size_t err_len);

#endif
