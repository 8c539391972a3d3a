/* metrics_render: the Prometheus exposition of a struct lora_metrics_state, one copy for every program
 * that serves /metrics (lora-metrics, and lora-frontend on its API port), so that both write
 * the same families with the same values from the same state.
 *
 * What shows when (see metrics_state.h): an engine whose model name is unknown (no config yet
 * and no model name option) shows nothing; gauges need the engine ready and not lost; config
 * gauges need its config and not lost; counters and histograms show whenever the model name is
 * known, a lost engine's too. Labels are model_name and engine, then the family's own; the
 * families vLLM defines otherwise keep vLLM's (cache_config_info has engine, block_size and
 * num_gpu_blocks). lora_build_info has version only.
 *
 * It reads the state and writes into the caller's writer; it takes no lock (the caller holds
 * whatever guards s) and allocates only through the writer and the two label strings of
 * vllm:lora_requests_info. Families come in one fixed order, every one with HELP and TYPE even
 * when it has no series.
 */
#ifndef LORA_METRICS_RENDER_H
#define LORA_METRICS_RENDER_H

#include <stdint.h>

#include "metrics/exposition.h"
#include "metrics/metrics_state.h"

/* Writes every family from s into w (after lora_exposition_reset). now_unix (Unix time with
 * fractions) is the value of vllm:lora_requests_info; now_ms (lora_clock_mono_ms()) decides which
 * engines are lost. Errors stick in w, as lora_exposition's do. */
void lora_metrics_render(const struct lora_metrics_state *s, struct lora_exposition *w, double now_unix,
                         uint64_t now_ms);

#endif
