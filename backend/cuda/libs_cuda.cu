/* libs_cuda: cuBLAS and NCCL through dlopen (see libs_cuda.h). */
#include "backend/cuda/libs_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef LORA_CUDA_EMU

const struct lora_cublas *lora_cuda_cublas(char *err, size_t err_len)
{
    static const struct lora_cublas emu = {
        cublasCreate_v2,       cublasDestroy_v2, cublasSetStream_v2,
        cublasSetWorkspace_v2, cublasGemmEx,     cublasGetStatusString,
    };
    return &emu;
}

#else

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

#define STR_(x) #x
#define STR(x)  STR_(x)

#ifndef LORA_CUDA_LIBDIR
#define LORA_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

/* Opens soname from the toolkit's directory, else by the search path; NULL with err. */
static void *open_lib(const char *soname, char *err, size_t err_len)
{
    char path[512];

    snprintf(path, sizeof(path), "%s/%s", LORA_CUDA_LIBDIR, soname);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(err, err_len, "unable to load %s (looked in %s and the library path): %s", soname,
                 LORA_CUDA_LIBDIR, dlerror());
    return h;
}

/* Sets *fn to symbol name of library h (soname); false with err when it is missing. */
template <class F>
static bool sym(void *h, const char *soname, const char *name, F *fn, char *err, size_t err_len)
{
    *fn = (F)dlsym(h, name);
    if (!*fn)
        snprintf(err, err_len, "%s lacks %s (too old?)", soname, name);
    return *fn != NULL;
}

const struct lora_cublas *lora_cuda_cublas(char *err, size_t err_len)
{
    static struct lora_cublas fns;
    static bool loaded;
    const char *soname = "libcublas.so." STR(CUBLAS_VER_MAJOR);

    pthread_mutex_lock(&load_lock);
    if (!loaded) {
        void *h = open_lib(soname, err, err_len);
        loaded = h && sym(h, soname, "cublasCreate_v2", &fns.create, err, err_len) &&
                 sym(h, soname, "cublasDestroy_v2", &fns.destroy, err, err_len) &&
                 sym(h, soname, "cublasSetStream_v2", &fns.set_stream, err, err_len) &&
                 sym(h, soname, "cublasSetWorkspace_v2", &fns.set_workspace, err, err_len) &&
                 sym(h, soname, "cublasGemmEx", &fns.gemm_ex, err, err_len) &&
                 sym(h, soname, "cublasGetStatusString", &fns.status_string, err, err_len);
        if (h && !loaded)
            dlclose(h);
    }
    pthread_mutex_unlock(&load_lock);
    return loaded ? &fns : NULL;
}

const struct lora_nccl *lora_cuda_nccl(char *err, size_t err_len)
{
    static struct lora_nccl fns;
    static bool loaded;
    const char *soname = "libnccl.so." STR(NCCL_MAJOR);

    pthread_mutex_lock(&load_lock);
    if (!loaded) {
        void *h = open_lib(soname, err, err_len);
        loaded =
            h && sym(h, soname, "ncclGetVersion", &fns.get_version, err, err_len) &&
            sym(h, soname, "ncclGetUniqueId", &fns.get_unique_id, err, err_len) &&
            sym(h, soname, "ncclCommInitRankConfig", &fns.comm_init_rank_config, err, err_len) &&
            sym(h, soname, "ncclCommGetAsyncError", &fns.comm_get_async_error, err, err_len) &&
            sym(h, soname, "ncclCommAbort", &fns.comm_abort, err, err_len) &&
            sym(h, soname, "ncclCommDestroy", &fns.comm_destroy, err, err_len) &&
            sym(h, soname, "ncclAllReduce", &fns.all_reduce, err, err_len) &&
            sym(h, soname, "ncclGetErrorString", &fns.error_string, err, err_len);
        if (h && !loaded)
            dlclose(h);
    }
    pthread_mutex_unlock(&load_lock);
    return loaded ? &fns : NULL;
}

#endif
