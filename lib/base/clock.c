/* clock: see clock.h. */
#include "base/clock.h"

#include <time.h>

static struct timespec read_clock(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return ts;
}

double lora_clock_unix(void)
{
    struct timespec ts = read_clock(CLOCK_REALTIME);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double lora_clock_mono(void)
{
    struct timespec ts = read_clock(CLOCK_MONOTONIC);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t lora_clock_mono_ms(void)
{
    struct timespec ts = read_clock(CLOCK_MONOTONIC);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t lora_clock_mono_ns(void)
{
    struct timespec ts = read_clock(CLOCK_MONOTONIC);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
