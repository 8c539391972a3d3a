/* clock: the two clocks of the toolkit, in one place (docs/design.md, "Base").
 *
 * Wall time (Unix seconds with fractions) is what crosses process boundaries: request and event
 * timestamps, the metrics' "time" fields. The monotonic clock is for durations and deadlines
 * inside one process, immune to the wall clock being set.
 */
#ifndef LORA_CLOCK_H
#define LORA_CLOCK_H

#include <stdint.h>

/* Unix time in seconds, with fractions (CLOCK_REALTIME). */
double lora_clock_unix(void);

/* Monotonic seconds, with fractions; only differences mean anything. */
double lora_clock_mono(void);

/* Monotonic milliseconds and nanoseconds, for deadlines kept as integers. */
uint64_t lora_clock_mono_ms(void);
uint64_t lora_clock_mono_ns(void);

#endif
