/* lora-engine lograte.c: repeated warnings, rate-limited. Calls no other file of the engine. */
#ifndef LORA_ENGINE_LOGRATE_H
#define LORA_ENGINE_LOGRATE_H

#include "engine.h"

/* fmt is a whole line without "lora-engine: warning: " and the newline. */
void lograte_warn(struct eng_lograte *lr, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Says how many lines the window held back, once it is over (call it from the loop). */
void lograte_flush(struct eng_lograte *lr, uint64_t now_ms);

#endif
