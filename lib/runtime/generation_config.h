/* generation_config: the default sampling parameters a model's creator recommends in
 * generation_config.json, read as vLLM reads them under --generation-config.
 *
 * The source is "auto" (the model directory's generation_config.json; no file means no
 * defaults), "vllm" (the server's own neutral defaults: the file is ignored) or a directory
 * holding generation_config.json (the file must be there). Of the file, only the keys vLLM takes
 * as sampling defaults count: temperature, top_p, top_k, min_p, repetition_penalty and
 * max_new_tokens (vLLM's max_tokens). A null value, or a value equal to the Hugging Face
 * GenerationConfig default (temperature 1.0, top_p 1.0, top_k 50, repetition_penalty 1.0), is
 * not a default, because vLLM reads the file's difference from those defaults. Other keys
 * (eos_token_id, do_sample, ...) are not sampling defaults and are left alone.
 *
 * A default this server cannot honour (repetition_penalty other than 1, min_p other than 0) is
 * refused at load with the key named, rather than silently dropped. The file is bounded in size
 * and must be a regular file; every error names the path.
 */
#ifndef LORA_GENERATION_CONFIG_H
#define LORA_GENERATION_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define LORA_GENERATION_CONFIG_MAX_BYTES (1u << 20) /* larger files are refused */

struct lora_generation_config {
    bool has_temperature, has_top_p, has_top_k, has_max_tokens;
    double temperature; /* >= 0 */
    double top_p;       /* (0, 1] */
    int top_k;         /* -1 or 0: off */
    int max_tokens;    /* >= 1: the cap on tokens generated per request */
    char source[4096]; /* "vllm", or the path of the file read, or "none" (auto, no file) */
};

/* Reads the defaults for model_dir under source ("auto", "vllm" or a directory) into out.
 * Returns 0, or -1 with err naming the path and the key. */
int lora_generation_config_load(const char *source, const char *model_dir,
                                struct lora_generation_config *out, char *err, size_t err_len);

/* Whether s names a source: "auto", "vllm" or an existing directory (a usage check). */
bool lora_generation_config_is_source(const char *s);

/* Whether any default is set. */
bool lora_generation_config_any(const struct lora_generation_config *g);

#endif
