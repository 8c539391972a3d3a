/* cuda_emu: the CPU emulation of CUDA described in cuda_emu.h: fibers for threads, one queue for
 * every stream, device memory behind guard pages and closed to the host, and cuBLAS's GEMM.
 *
 * Fibers are made once (makecontext) and reused for every block; they switch with
 * _setjmp/_longjmp, which save no signal mask: a switch costs nanoseconds, not a system call, and
 * that decides how large a test the emulation can run. (Fortified longjmp refuses to jump between
 * stacks: it is off here.)
 */
#undef _FORTIFY_SOURCE
#include "backend/cuda/emu/cuda_emu.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <vector>

uint3 emu_thread_idx, emu_block_idx;
dim3 emu_block_dim, emu_grid_dim;

[[noreturn]] static void die(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "cuda_emu: fatal: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* ---- element conversions (as backend/dtype.c) ---- */

float emu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;

    if (exp == 0) {
        float mag = (float)mant * 0x1p-24f;
        return sign ? -mag : mag;
    }
    if (exp == 31)
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t emu_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);

    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static uint32_t shift_round_even(uint32_t m, int shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);

    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

uint16_t emu_f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f), mant = u & 0x7fffff;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    int exp = (int)((u >> 23) & 0xff), e = exp - 127 + 15;

    if (exp == 0xff)
        return sign | 0x7c00 | (mant ? 0x200 | (uint16_t)(mant >> 13) : 0);
    if (e >= 31)
        return sign | 0x7c00;
    if (e <= 0) {
        int shift = 14 - e;
        if (shift > 24)
            return sign;
        return sign | (uint16_t)shift_round_even(mant | 0x800000u, shift);
    }
    return sign | (uint16_t)shift_round_even(((uint32_t)e << 23) | mant, 13);
}

/* ---- devices ---- */

static int n_devices(void)
{
    static int n = -1;
    if (n < 0) {
        const char *s = getenv("LORA_CUDA_EMU_DEVICES");
        n = s && *s ? atoi(s) : 1;
        n = n < 0 ? 0 : n;
    }
    return n;
}

static int cur_device;
static cudaError_t last_error = cudaSuccess;

/* Bytes of each device: LORA_CUDA_EMU_MEMORY_MB, default 8 GiB. */
static size_t total_memory_bytes(void)
{
    static size_t bytes;
    if (!bytes) {
        const char *s = getenv("LORA_CUDA_EMU_MEMORY_MB");
        long mb = s && *s ? atol(s) : 0;
        bytes = mb > 0 ? (size_t)mb << 20 : (size_t)8 << 30;
    }
    return bytes;
}

/* Bytes other processes hold on the device: LORA_CUDA_EMU_OTHERS_MB, default none. */
static size_t others_bytes(void)
{
    const char *s = getenv("LORA_CUDA_EMU_OTHERS_MB");
    long mb = s && *s ? atol(s) : 0;
    size_t b = mb > 0 ? (size_t)mb << 20 : 0;
    return b < total_memory_bytes() ? b : total_memory_bytes();
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
        return "device not ready";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = n_devices();
    return *n ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= n_devices())
        return n_devices() ? cudaErrorInvalidDevice : cudaErrorNoDevice;
    cur_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = cur_device;
    return n_devices() ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d < 0 || d >= n_devices())
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "CUDA emulated on the CPU");
    p->totalGlobalMem = total_memory_bytes();
    p->sharedMemPerBlock = 48 * 1024;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 4;
    return cudaSuccess;
}

/* ---- device memory ---- */

struct dev_alloc {
    char *map;
    size_t map_len;
    char *data; /* the accessible pages */
    size_t data_len;
    char *base; /* what cudaMalloc returned: its end against the guard page */
    size_t bytes;
};

static std::map<uintptr_t, dev_alloc> allocs; /* by base */
static size_t allocated;
static int device_open; /* > 0: queued work runs and device memory is open to it */

static const size_t page = 4096;

static void protect(const dev_alloc &a, bool open)
{
    if (mprotect(a.data, a.data_len, open ? PROT_READ | PROT_WRITE : PROT_NONE) < 0)
        die("mprotect: %s", strerror(errno));
}

static std::vector<const dev_alloc *> opened; /* when not all: the allocations open */
static bool opened_all;

/* Opens device memory to the work about to run: only (a, b) when the work is copies, else all. */
static void device_enter(const std::vector<const dev_alloc *> *only)
{
    if (device_open++ > 0)
        return;
    opened_all = !only;
    opened.clear();
    if (only) {
        for (const dev_alloc *a : *only)
            protect(*a, true);
        opened = *only;
    } else {
        for (auto &kv : allocs)
            protect(kv.second, true);
    }
}

static void device_leave(void)
{
    if (--device_open > 0)
        return;
    if (opened_all)
        for (auto &kv : allocs)
            protect(kv.second, false);
    else
        for (const dev_alloc *a : opened)
            protect(*a, false);
    opened.clear();
}

/* The allocation holding [p, p + bytes), or NULL. */
static const dev_alloc *find_alloc(const void *p, size_t bytes)
{
    uintptr_t u = (uintptr_t)p;
    auto it = allocs.upper_bound(u);
    if (it == allocs.begin())
        return NULL;
    --it;
    const dev_alloc &a = it->second;
    uintptr_t b = (uintptr_t)a.base;
    if (u < b)
        return NULL;
    size_t off = u - b;
    if (!a.bytes)
        return off == 0 && bytes == 0 ? &a : NULL;
    if (off >= a.bytes || bytes > a.bytes - off)
        return NULL;
    return &a;
}

void lora_emu_check_device(const void *p, const char *what)
{
    if (p && !find_alloc(p, 0))
        die("%s: %p is not device memory", what, p);
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    size_t padded = ((bytes ? bytes : 1) + 15) / 16 * 16;
    size_t data_len = (padded + page - 1) / page * page;

    *p = NULL;
    if (!n_devices())
        return cudaErrorNoDevice;
    if (others_bytes() + allocated + bytes > total_memory_bytes())
        return cudaErrorMemoryAllocation;
    dev_alloc a;
    a.map_len = data_len + 2 * page;
    a.map = (char *)mmap(NULL, a.map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
    if (a.map == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    a.data = a.map + page;
    a.data_len = data_len;
    a.base = a.data + data_len - padded;
    a.bytes = bytes;
    /* NaN everywhere, so that a read of unwritten memory shows; large allocations (the backend's
     * work buffers) are left to fill as they are touched, or every toggle of their protection
     * would walk tens of thousands of pages. */
    if (data_len <= ((size_t)16 << 20)) {
        protect(a, true);
        memset(a.data, 0xff, a.data_len);
        if (!device_open)
            protect(a, false);
    } else if (device_open) {
        protect(a, true);
    }
    allocs[(uintptr_t)a.base] = a;
    allocated += bytes;
    *p = a.base;
    return cudaSuccess;
}

static void flush_all(void);

cudaError_t cudaFree(void *p)
{
    if (!p)
        return n_devices() ? cudaSuccess : cudaErrorNoDevice;
    flush_all(); /* as the real one, it waits for the device */
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end())
        return cudaErrorInvalidValue;
    munmap(it->second.map, it->second.map_len);
    allocated -= it->second.bytes;
    allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    *total_bytes = total_memory_bytes();
    *free_bytes = total_memory_bytes() - others_bytes() - allocated;
    return cudaSuccess;
}

/* Pinned host memory: plain memory, remembered so that copies from it read it late. */
static std::map<uintptr_t, size_t> pinned;

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!*p)
        return cudaErrorMemoryAllocation;
    pinned[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    flush_all();
    if (!p)
        return cudaSuccess;
    if (!pinned.erase((uintptr_t)p))
        return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

static bool is_pinned(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    auto it = pinned.upper_bound(u);
    if (it == pinned.begin())
        return false;
    --it;
    return u - it->first < (it->second ? it->second : 1);
}

/* ---- the queue ---- */

struct emu_stream {
    unsigned flags;
};

struct emu_event {
    uint64_t seq; /* work issued before the record */
};

/* Queued work: a kernel or a GEMM may touch any allocation; a copy or memset, those it names
 * (opening only those keeps the emulation of many small uploads cheap). */
struct queued {
    std::function<void()> fn;
    bool any;
    const dev_alloc *a, *b;
};

static std::deque<queued> queue;
static uint64_t n_issued, n_done;

static void enqueue(std::function<void()> fn, const dev_alloc *a = NULL, const dev_alloc *b = NULL)
{
    queue.push_back(queued{std::move(fn), !a && !b, a, b});
    n_issued++;
}

static void flush_to(uint64_t seq)
{
    if (n_done >= seq)
        return;
    std::vector<const dev_alloc *> touched;
    bool any = false;
    uint64_t n = seq - n_done < queue.size() ? seq - n_done : queue.size();
    for (uint64_t i = 0; i < n && !any; i++) {
        any = queue[i].any;
        for (const dev_alloc *a : {queue[i].a, queue[i].b})
            if (a && std::find(touched.begin(), touched.end(), a) == touched.end())
                touched.push_back(a);
    }
    device_enter(any ? NULL : &touched);
    while (n_done < seq && !queue.empty()) {
        std::function<void()> fn = std::move(queue.front().fn);
        queue.pop_front();
        fn();
        n_done++;
    }
    device_leave();
}

static void flush_all(void)
{
    flush_to(n_issued);
}

cudaError_t cudaDeviceSynchronize(void)
{
    flush_all();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    *s = new emu_stream{flags};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    flush_all();
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    flush_all();
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (n_done == n_issued)
        return cudaSuccess;
    flush_all();
    return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    return e ? cudaSuccess : cudaErrorInvalidValue; /* issue order already respects it */
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = new emu_event{0};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->seq = n_issued;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (n_done >= e->seq)
        return cudaSuccess;
    flush_to(e->seq);
    return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    flush_to(e->seq);
    return cudaSuccess;
}

static bool copy_ok(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    switch (kind) {
    case cudaMemcpyHostToDevice:
        return find_alloc(dst, bytes) && !find_alloc(src, 0);
    case cudaMemcpyDeviceToHost:
        return find_alloc(src, bytes) && !find_alloc(dst, 0);
    case cudaMemcpyDeviceToDevice:
        return find_alloc(dst, bytes) && find_alloc(src, bytes);
    default:
        return false;
    }
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (!bytes)
        return cudaSuccess;
    if (!copy_ok(dst, src, bytes, kind))
        return cudaErrorInvalidValue;
    flush_all();
    std::vector<const dev_alloc *> touched;
    for (const dev_alloc *a : {find_alloc(dst, 0), find_alloc(src, 0)})
        if (a)
            touched.push_back(a);
    device_enter(&touched);
    memcpy(dst, src, bytes);
    device_leave();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    if (!bytes)
        return cudaSuccess;
    if (!copy_ok(dst, src, bytes, kind))
        return cudaErrorInvalidValue;
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src)) {
        /* Pageable memory: the driver stages it before the call returns. */
        std::vector<char> copy((const char *)src, (const char *)src + bytes);
        enqueue([dst, copy] { memcpy(dst, copy.data(), copy.size()); }, find_alloc(dst, 0));
    } else {
        enqueue([dst, src, bytes] { memcpy(dst, src, bytes); }, find_alloc(dst, 0),
                find_alloc(src, 0));
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    if (!bytes)
        return cudaSuccess;
    if (!find_alloc(dst, bytes))
        return cudaErrorInvalidValue;
    enqueue([dst, value, bytes] { memset(dst, value, bytes); }, find_alloc(dst, 0));
    return cudaSuccess;
}

/* ---- kernels: one block at a time, its threads as fibers ---- */

enum fiber_state { F_RUN, F_BLOCK_BARRIER, F_WARP_BARRIER, F_DONE };

struct fiber {
    ucontext_t ctx; /* where it starts */
    jmp_buf jb;     /* where it waits */
    bool started;
    char *stack;
    fiber_state state;
    uint3 tid;
    unsigned linear;
};

static const size_t stack_bytes = 256 * 1024;
/* The pool lives as long as the process: never destroyed, so it stays reachable to the end. */
static std::vector<fiber *> &fibers = *new std::vector<fiber *>;
static jmp_buf sched_jb;
static fiber *cur;
static const std::function<void()> *cur_body;
static const char *cur_kernel;
static unsigned cur_threads;
static std::vector<unsigned char> dyn_smem;
static unsigned char xchg[32][32][16]; /* [warp][lane]: the values of a shuffle */
static uint64_t order_seed = 0x9e3779b97f4a7c15ULL;

/* A fiber's whole life: run the block's body, report the end, wait to be handed the next block.
 * Fibers are made once and reused, so a block costs no system call. */
__attribute__((noinline)) static void park(void)
{
    if (_setjmp(cur->jb) == 0)
        _longjmp(sched_jb, 1);
}

static void fiber_main(void)
{
    for (;;) {
        (*cur_body)();
        cur->state = F_DONE;
        park();
    }
}

static void yield(fiber_state why)
{
    cur->state = why;
    park();
}

__attribute__((noinline)) static void jump_to(fiber *f)
{
    if (!f->started) {
        f->started = true;
        setcontext(&f->ctx);
    }
    _longjmp(f->jb, 1);
}

/* Runs f until it waits at a barrier or ends. */
__attribute__((noinline)) static void resume(fiber *f)
{
    cur = f;
    emu_thread_idx = f->tid;
    if (_setjmp(sched_jb) == 0)
        jump_to(f);
}

void __syncthreads(void)
{
    yield(F_BLOCK_BARRIER);
}

static void warp_barrier(void)
{
    if ((cur->linear / 32 + 1) * 32 > cur_threads)
        die("%s: a warp-synchronous operation in a partial warp (%u threads)", cur_kernel,
            cur_threads);
    yield(F_WARP_BARRIER);
}

void __syncwarp(unsigned mask)
{
    if (mask != 0xffffffffu)
        die("%s: __syncwarp with a partial mask", cur_kernel);
    warp_barrier();
}

void emu_shfl(const void *in, void *out, size_t bytes, unsigned mask, int src_lane, bool xor_mode)
{
    unsigned lane = cur->linear % 32, warp = cur->linear / 32;

    if (mask != 0xffffffffu)
        die("%s: a shuffle with a partial mask", cur_kernel);
    if (bytes > 16 || warp >= 32)
        die("%s: a shuffle of %zu bytes", cur_kernel, bytes);
    memcpy(xchg[warp][lane], in, bytes);
    warp_barrier();
    unsigned from = (xor_mode ? lane ^ (unsigned)src_lane : (unsigned)src_lane) & 31;
    memcpy(out, xchg[warp][from], bytes);
    warp_barrier();
}

void *emu_dyn_smem(void)
{
    return dyn_smem.data();
}

static uint64_t next_random(void)
{
    uint64_t z = (order_seed += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void run_block(unsigned n, const std::function<void()> &body)
{
    while (fibers.size() < n) {
        fiber *f = new fiber();
        f->stack = (char *)mmap(NULL, stack_bytes, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (f->stack == MAP_FAILED)
            die("out of memory for fiber stacks");
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack;
        f->ctx.uc_stack.ss_size = stack_bytes;
        f->ctx.uc_link = NULL; /* fiber_main never returns */
        makecontext(&f->ctx, fiber_main, 0);
        fibers.push_back(f);
    }
    unsigned bx = emu_block_dim.x, by = emu_block_dim.y;
    for (unsigned i = 0; i < n; i++) {
        fiber *f = fibers[i];
        f->state = F_RUN;
        f->linear = i;
        f->tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    }
    cur_body = &body;
    cur_threads = n;
    unsigned round = 0;
    for (;;) {
        /* Every runnable thread runs to its next barrier, in an order that changes from round
         * to round: forward from a random thread, then backward. */
        unsigned start = (unsigned)(next_random() % n);
        bool backward = round++ & 1;
        for (unsigned i = 0; i < n; i++) {
            unsigned j = (start + i) % n;
            fiber *f = fibers[backward ? n - 1 - j : j];
            if (f->state == F_RUN)
                resume(f);
        }
        unsigned done = 0, at_block = 0, at_warp = 0;
        for (unsigned i = 0; i < n; i++) {
            done += fibers[i]->state == F_DONE;
            at_block += fibers[i]->state == F_BLOCK_BARRIER;
            at_warp += fibers[i]->state == F_WARP_BARRIER;
        }
        if (done == n)
            return;
        bool released = false;
        for (unsigned w = 0; w * 32 < n; w++) {
            unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, waiting = 0, exited = 0;
            for (unsigned i = lo; i < hi; i++) {
                waiting += fibers[i]->state == F_WARP_BARRIER;
                exited += fibers[i]->state == F_DONE;
            }
            if (waiting == hi - lo) {
                for (unsigned i = lo; i < hi; i++)
                    fibers[i]->state = F_RUN;
                released = true;
            } else if (waiting && exited) {
                die("%s: block (%u,%u,%u): a lane exited while its warp waits at a shuffle",
                    cur_kernel, emu_block_idx.x, emu_block_idx.y, emu_block_idx.z);
            }
        }
        if (!released && at_block && at_block + done == n) {
            if (done)
                die("%s: block (%u,%u,%u): %u threads exited while %u wait at __syncthreads",
                    cur_kernel, emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, done, at_block);
            for (unsigned i = 0; i < n; i++)
                fibers[i]->state = F_RUN;
            released = true;
        }
        if (!released)
            die("%s: block (%u,%u,%u): deadlock: %u threads at __syncthreads, %u at a warp "
                "barrier, %u exited",
                cur_kernel, emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, at_block, at_warp,
                done);
    }
}

void emu_launch(cudaStream_t s, dim3 grid, dim3 block, size_t smem, const char *name,
                std::function<void()> body)
{
    unsigned long threads = (unsigned long)block.x * block.y * block.z;

    if (!threads || threads > 1024 || !grid.x || !grid.y || !grid.z || grid.y > 65535 ||
        grid.z > 65535 || block.z > 64 || smem > 48 * 1024) {
        fprintf(stderr, "cuda_emu: %s: bad launch: grid (%u,%u,%u), block (%u,%u,%u), %zu bytes\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    enqueue([grid, block, smem, name, body] {
        emu_grid_dim = grid;
        emu_block_dim = block;
        cur_kernel = name;
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    emu_block_idx = uint3{x, y, z};
                    dyn_smem.assign(smem + 16, 0xff);
                    run_block(block.x * block.y * block.z, body);
                }
    });
}

/* ---- cuBLAS ---- */

struct emu_cublas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = new emu_cublas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    flush_all();
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *workspace, size_t bytes)
{
    if (bytes && !find_alloc(workspace, bytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "the operation completed successfully";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    default:
        return "cublas error";
    }
}

static size_t type_size(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}

static float element(cudaDataType t, const void *p, size_t i)
{
    switch (t) {
    case CUDA_R_32F:
        return ((const float *)p)[i];
    case CUDA_R_16F:
        return emu_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    }
}

/* Whether a (rows, cols) column-major matrix with leading dimension ld lies in one allocation. */
static bool matrix_ok(const void *p, cudaDataType t, int rows, int cols, int ld)
{
    if (!rows || !cols)
        return true;
    size_t last = (size_t)(rows - 1) + (size_t)(cols - 1) * (size_t)ld;
    return find_alloc(p, (last + 1) * type_size(t)) != NULL;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
                            const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (Ctype != CUDA_R_32F || Atype != Btype || !type_size(Atype))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype == CUDA_R_32F
            ? compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC
            : compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!matrix_ok(A, Atype, a_rows, a_cols, lda) || !matrix_ok(B, Btype, b_rows, b_cols, ldb) ||
        !matrix_ok(C, Ctype, m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *(const float *)alpha, be = *(const float *)beta;
    enqueue([=] {
        float *c = (float *)C;
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                float acc = 0;
                for (int l = 0; l < k; l++) {
                    size_t ai = transa == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda
                                                      : (size_t)l + (size_t)i * lda;
                    size_t bi = transb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb
                                                      : (size_t)j + (size_t)l * ldb;
                    acc = fmaf(element(Atype, A, ai), element(Btype, B, bi), acc);
                }
                float *cij = c + (size_t)i + (size_t)j * ldc;
                *cij = be != 0.0f ? al * acc + be * *cij : al * acc;
            }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
