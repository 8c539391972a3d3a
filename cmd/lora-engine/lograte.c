/* lora-engine: repeated warnings, rate-limited. A peer that sends malformed messages in a loop
 * must not turn the engine's log into a copy of its traffic: each kind of warning is logged at
 * most LOGRATE_BURST times per LOGRATE_WINDOW_MS, and the lines held back are counted and said in
 * one summary line when the window is over. Calls no other file of the engine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "lograte.h"

/* The window; LORA_ENGINE_TEST_LOG_WINDOW_MS shortens it for the tests. */
static uint64_t window_ms(void)
{
    static uint64_t ms;
    if (!ms) {
        const char *v = getenv("LORA_ENGINE_TEST_LOG_WINDOW_MS");
        long t = v ? strtol(v, NULL, 10) : 0;
        ms = t > 0 && t <= 3600000 ? (uint64_t)t : LOGRATE_WINDOW_MS;
    }
    return ms;
}

static void summarise(struct eng_lograte *lr)
{
    if (lr->n_held > 0)
        fprintf(stderr, "lora-engine: warning: %llu more %s in the last %g s (not logged)\n",
                (unsigned long long)lr->n_held, lr->what ? lr->what : "warnings like these",
                (double)window_ms() / 1000);
    lr->n_held = 0;
    lr->n_logged = 0;
}

void lograte_flush(struct eng_lograte *lr, uint64_t now_ms)
{
    if (now_ms - lr->window_start_ms < window_ms())
        return;
    summarise(lr);
    lr->window_start_ms = now_ms;
}

void lograte_warn(struct eng_lograte *lr, const char *fmt, ...)
{
    va_list ap;

    lograte_flush(lr, lora_clock_mono_ms());
    if (lr->n_logged >= LOGRATE_BURST) {
        lr->n_held++;
        return;
    }
    lr->n_logged++;
    fputs("lora-engine: warning: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
