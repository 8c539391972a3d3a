/* lora-frontend: the sampling and output fields of /v1/completions and /v1/chat/completions,
 * read from the JSON body and checked (params.c). Every error names the field, as a 400. */
#ifndef LORA_FRONTEND_PARAMS_H
#define LORA_FRONTEND_PARAMS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "frontend.h"

struct gen_params {
    bool chat;
    const char *model; /* as the client named it (borrowed from the body) */
    const char *lora;  /* NULL: the base model */
    int max_tokens;    /* -1: until the context is full */
    int min_tokens;
    float temperature, top_p;
    int top_k; /* 0: off */
    bool has_seed;
    uint64_t seed;
    int n;
    bool stream, include_usage;
    bool echo;
    bool ignore_eos;
    bool skip_special_tokens;
    bool return_token_ids;
    int logprobs; /* -1: none; else the top-N per token */
    const char *stop[FE_MAX_STOP];
    int n_stop;
    size_t max_stop_len;
    int32_t stop_ids[16];
    int n_stop_ids;
    const char *user;
    bool include_stop_str_in_output; /* the stop string stays at the end of the text */
    bool return_tokens_as_token_ids; /* log-probability tokens as "token_id:N" */
    int truncate_prompt_tokens;      /* 0: none; else keep the last N prompt tokens */
    int prompt_logprobs;             /* -1: none; 0: the prompt tokens' own */
    int32_t allowed[LORA_MSG_MAX_ALLOWED]; /* allowed_token_ids */
    int n_allowed;
};

/* Fills p from body. Returns 0, or -1 with the message in err and the field in *param. */
int params_parse(struct frontend *fe, json_t *body, bool chat, struct gen_params *p,
                 const char **param, char *err, size_t err_len);

/* Says on stderr which defaults the generation config sets, as vLLM warns of them. */
void params_note_defaults(const struct frontend *fe);

/* Reads an optional integer field in [lo, hi]: absent or null leaves *out. 0 / -1 (err). */
int params_int(json_t *body, const char *key, long long lo, long long hi, long long *out,
               char *err, size_t err_len);
/* Reads an optional boolean field. 0 / -1 (err). */
int params_bool(json_t *body, const char *key, bool *out, char *err, size_t err_len);

#endif
