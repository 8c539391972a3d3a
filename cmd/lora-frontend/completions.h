/* lora-frontend: one /v1/completions or /v1/chat/completions request (completions.c): its
 * prompts, its choices as engine requests, what the engine sent each of them (detokenized and
 * cut at a stop string) and the JSON pieces of an answer. completions.c answers a request
 * whole; sse.c streams it as server-sent events through this header. Calls go one way: sse.c
 * calls completions.c, never the reverse.
 *
 * A request is used by the HTTP thread that made it; what the engine sent is copied out of the
 * link (under its lock) by completions_advance.
 */
#ifndef LORA_FRONTEND_COMPLETIONS_H
#define LORA_FRONTEND_COMPLETIONS_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "frontend.h"
#include "params.h"

/* One choice: one prompt, sampled once, as one engine request. */
struct choice {
    int index;
    int prompt_index;
    struct fe_seq *seq; /* NULL once forgotten */
    struct lora_detok *detok;
    struct lora_buf text; /* generated text, ending before a stop string */
    size_t streamed;      /* bytes of text already sent */
    /* What was consumed from the engine, copied. */
    int32_t *ids;
    float *lps;
    int32_t *top_ids;
    float *top_lps;
    int top_n;
    size_t n, cap;
    size_t lp_streamed; /* tokens whose log-probabilities were sent */
    struct fe_prompt_lps prompt; /* the prompt's log-probabilities, copied */
    bool heard; /* the engine said something about it */
    bool done;
    bool final_sent; /* streaming: the chunk with the finish reason went out */
    char finish_reason[16];
    const char *stop_reason; /* the stop string that ended it, borrowed from params */
    char error[512];
    char error_code[16];
    double queued, scheduled, first_token, finished_at, first_seen, done_at;
    double sent_at;      /* the request sent to the engine */
    double pending_recv; /* when the engine's output not yet handed on was received, or 0 */
};

struct completion {
    struct frontend *fe;
    struct gen_params p;
    json_t *body; /* owned: p's strings point into it */
    char id[64];
    long long created;
    double arrival;
    double submitted;
    pthread_cond_t cond;
    int n_prompts;
    int32_t **prompts;
    size_t *n_prompt;
    char **prompt_text; /* for echo: the prompt as text */
    int n_choices;
    struct choice *choices;
    double delay_sum; /* engine output received -> bytes handed to the HTTP server */
    int delay_n;
};

/* The life of a request. */

/* Reads and checks the request and submits its choices to the engine. NULL when it was
 * answered already (an error). */
struct completion *completions_start(struct frontend *fe, struct lora_http_request *req,
                                     json_t *body, bool chat);
/* Waits for every choice, answers with the whole response, publishes the stats, frees g. */
void completions_respond(struct completion *g, struct lora_http_request *req);
/* One request_stats message per choice. */
void completions_publish_stats(struct completion *g);
/* Forgets every choice in the engine (aborting what has not finished). */
void completions_abort(struct completion *g);
void completions_free(struct completion *g);

/* Consuming what the engine sent. */

/* Copies into every choice what the engine sent since the last call: tokens, text, stop
 * strings, the finish. */
void completions_advance(struct completion *g);
/* Waits for news from the engine, at most a slice (the caller checks its client meanwhile). */
void completions_wait(struct completion *g);
bool completions_all_done(const struct completion *g);
/* The first choice that failed with an engine error, or NULL. */
const struct choice *completions_failed_choice(const struct completion *g);
void completions_finish_choice(struct choice *c, const char *reason);
/* The error response of a failed choice. */
void completions_reply_engine_error(struct lora_http_request *req, const struct choice *c);

/* JSON pieces. */

/* A JSON string of n bytes of valid UTF-8. */
json_t *completions_text_json(const char *s, size_t n);
/* The prompt of a choice as text, for echo: as given, else decoded into *decoded (the
 * caller's, to free); NULL without a tokenizer. */
const char *completions_prompt_text(struct completion *g, const struct choice *c, char **decoded);
/* Chat log-probabilities of tokens [from, to) of a choice: {"content":[...]}. */
json_t *completions_chat_logprobs(struct completion *g, const struct choice *c, size_t from,
                                  size_t to);
/* Completions log-probabilities (the legacy format) of tokens [from, to), with the prompt's
 * tokens first when with_prompt is set; offset is the text offset of the first token. */
json_t *completions_text_logprobs(struct completion *g, const struct choice *c, bool with_prompt,
                                  size_t from, size_t to, size_t offset);
json_t *completions_ids_json(const int32_t *ids, size_t n);
json_t *completions_usage_json(const struct completion *g);
json_t *completions_stop_reason_json(const struct choice *c);
/* {"id", "object", "created", "model"}: the head of every response and chunk. */
json_t *completions_head_json(const struct completion *g, const char *object);

#endif
