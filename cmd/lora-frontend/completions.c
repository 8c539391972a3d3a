/* lora-frontend: /v1/completions and /v1/chat/completions (docs/design.md, "HTTP API"): the life of
 * a request, and its answer when it is not streamed (sse.c streams it); see completions.h.
 *
 * A request becomes one engine request per prompt and choice (n). Each choice keeps its own
 * copy of what the engine sent, a streaming detokenizer and its text; stop strings are found in
 * that text (the text ends before the stop string, and the engine request is aborted), held
 * back while streaming so a stop string that arrives in pieces is never sent. Non-streaming
 * requests wait on the connection's thread. A client that goes away aborts its engine
 * requests.
 */
#include "completions.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"

#define WAIT_SLICE_MS 50 /* how often a waiting thread checks that its client is still there */

/* ---- set-up ----------------------------------------------------------------------------- */

void completions_free(struct completion *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_choices; i++) {
        struct choice *c = &g->choices[i];
        link_forget(&g->fe->link, &c->seq);
        lora_detok_destroy(&c->detok);
        lora_buf_release(&c->text);
        free(c->ids);
        free(c->lps);
        free(c->top_ids);
        free(c->top_lps);
        seq_free_prompt_lps(&c->prompt);
    }
    for (int i = 0; i < g->n_prompts; i++) {
        free(g->prompts[i]);
        free(g->prompt_text[i]);
    }
    free(g->prompts);
    free(g->n_prompt);
    free(g->prompt_text);
    free(g->choices);
    json_decref(g->body);
    pthread_cond_destroy(&g->cond);
    free(g);
}

static int add_prompt(struct completion *g, int32_t *ids, size_t n, char *text)
{
    int k = g->n_prompts;
    int32_t **p = realloc(g->prompts, sizeof(*p) * (size_t)(k + 1));
    if (p)
        g->prompts = p;
    size_t *np = realloc(g->n_prompt, sizeof(*np) * (size_t)(k + 1));
    if (np)
        g->n_prompt = np;
    char **t = realloc(g->prompt_text, sizeof(*t) * (size_t)(k + 1));
    if (t)
        g->prompt_text = t;
    if (!p || !np || !t) {
        free(ids);
        free(text);
        return -1;
    }
    g->prompts[k] = ids;
    g->n_prompt[k] = n;
    g->prompt_text[k] = text;
    g->n_prompts++;
    return 0;
}

static int encode_text(struct completion *g, const char *s, size_t len, bool add_special, char *err,
                       size_t err_len)
{
    int32_t *ids = NULL;
    size_t n = 0;

    if (!g->fe->tok) {
        lora_errf(err, err_len, "this model has no tokenizer: give the prompt as token ids");
        return -1;
    }
    if (!fe_prompt_fits(g->fe, len, err, err_len))
        return -1;
    if (lora_tokenizer_encode(g->fe->tok, s, len, add_special, &ids, &n, err, err_len) < 0)
        return -1;
    char *text = strndup(s, len);
    return add_prompt(g, ids, n, text);
}

static int ids_from_json(struct completion *g, json_t *a, const char *field, char *err,
                         size_t err_len)
{
    size_t n = json_array_size(a), i;
    int vocab = fe_link_limits(&g->fe->link).vocab_size;
    json_t *v;

    if (n == 0) {
        lora_errf(err, err_len, "'%s' must not be empty", field);
        return -1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * n);
    if (!ids) {
        lora_errf(err, err_len, "out of memory");
        return -1;
    }
    json_array_foreach (a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            lora_errf(err, err_len, "'%s' must hold token ids from 0 to %d", field, vocab - 1);
            free(ids);
            return -1;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    return add_prompt(g, ids, n, NULL);
}

/* prompt: a string, a list of strings, a list of token ids or a list of such lists. */
static int read_prompts(struct completion *g, char *err, size_t err_len)
{
    json_t *pr = json_object_get(g->body, "prompt");
    bool add_special = true;

    if (params_bool(g->body, "add_special_tokens", &add_special, err, err_len) < 0)
        return -1;
    if (!pr || json_is_null(pr)) {
        lora_errf(err, err_len, "'prompt' is required");
        return -1;
    }
    if (json_is_string(pr)) {
        if (json_string_length(pr) == 0) {
            lora_errf(err, err_len, "'prompt' must not be empty");
            return -1;
        }
        return encode_text(g, json_string_value(pr), json_string_length(pr), add_special, err,
                           err_len);
    }
    if (!json_is_array(pr) || json_array_size(pr) == 0) {
        lora_errf(err, err_len,
                  "'prompt' must be a string, a list of strings, a list of token "
                  "ids or a list of lists of token ids, and not empty");
        return -1;
    }
    json_t *first = json_array_get(pr, 0);
    if (json_is_integer(first))
        return ids_from_json(g, pr, "prompt", err, err_len);
    if (json_array_size(pr) > FE_MAX_N) {
        lora_errf(err, err_len, "'prompt' holds at most %d prompts", FE_MAX_N);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach (pr, i, v) {
        int rc;
        if (json_is_string(v) && json_string_length(v) > 0)
            rc = encode_text(g, json_string_value(v), json_string_length(v), add_special, err,
                             err_len);
        else if (json_is_array(v))
            rc = ids_from_json(g, v, "prompt", err, err_len);
        else {
            lora_errf(err, err_len,
                      "'prompt[%zu]' must be a non-empty string or a list of "
                      "token ids",
                      i);
            rc = -1;
        }
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* The text of one message's content: a string or a list of {"type":"text","text":...} parts. */
static const char *message_text(json_t *content, size_t i, struct lora_buf *tmp, char *err,
                                size_t err_len)
{
    if (json_is_string(content))
        return json_string_value(content);
    if (json_is_null(content))
        return "";
    if (!json_is_array(content)) {
        lora_errf(err, err_len, "'messages[%zu].content' must be a string or a list of parts", i);
        return NULL;
    }
    size_t k;
    json_t *part;
    lora_buf_reset(tmp);
    lora_buf_add(tmp, "", 0);
    json_array_foreach (content, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            lora_errf(err, err_len, "'messages[%zu].content[%zu]' must be a text part", i, k);
            return NULL;
        }
        if (k > 0)
            lora_buf_add_char(tmp, '\n');
        lora_buf_add(tmp, json_string_value(text), json_string_length(text));
    }
    if (tmp->failed) {
        lora_errf(err, err_len, "out of memory");
        return NULL;
    }
    return tmp->data;
}

static int read_messages(struct completion *g, char *err, size_t err_len)
{
    struct frontend *fe = g->fe;
    json_t *msgs = json_object_get(g->body, "messages");
    bool add_gen = true;

    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        lora_errf(err, err_len, "'messages' must be a non-empty list");
        return -1;
    }
    if (json_array_size(msgs) > 4096) {
        lora_errf(err, err_len, "'messages' holds at most 4096 messages");
        return -1;
    }
    if (params_bool(g->body, "add_generation_prompt", &add_gen, err, err_len) < 0)
        return -1;
    if (!fe->has_chat) {
        lora_errf(err, err_len, "%s", fe->chat_error);
        return -1;
    }
    size_t n = json_array_size(msgs), i;
    struct lora_chat_message *cm = calloc(n, sizeof(*cm));
    struct lora_buf *parts = calloc(n, sizeof(*parts));
    json_t *m;
    int rc = cm && parts ? 0 : -1;
    if (rc)
        lora_errf(err, err_len, "out of memory");
    json_array_foreach (msgs, i, m) {
        if (rc)
            break;
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            lora_errf(err, err_len, "'messages[%zu]' must be an object with a 'role'", i);
            rc = -1;
            break;
        }
        cm[i].role = json_string_value(role);
        cm[i].content = message_text(json_object_get(m, "content"), i, &parts[i], err, err_len);
        if (!cm[i].content)
            rc = -1;
    }
    char *prompt = NULL;
    size_t len = 0;
    if (rc == 0)
        rc = lora_chat_template_render(&fe->chat, cm, n, add_gen, &prompt, &len, err, err_len);
    for (i = 0; parts && i < n; i++)
        lora_buf_release(&parts[i]);
    free(parts);
    free(cm);
    if (rc < 0)
        return -1;
    /* The template writes the special tokens itself (BOS included), as vLLM renders chat. */
    rc = encode_text(g, prompt, len, false, err, err_len);
    free(prompt);
    return rc;
}

/* truncate_prompt_tokens: each prompt keeps its last N tokens, as vLLM truncates on the left.
 * The prompt text of a truncated prompt is dropped, so echo shows the tokens that ran. */
static void truncate_prompts(struct completion *g)
{
    size_t keep = (size_t)g->p.truncate_prompt_tokens;

    for (int i = 0; keep > 0 && i < g->n_prompts; i++) {
        if (g->n_prompt[i] <= keep)
            continue;
        memmove(g->prompts[i], g->prompts[i] + (g->n_prompt[i] - keep), sizeof(int32_t) * keep);
        g->n_prompt[i] = keep;
        free(g->prompt_text[i]);
        g->prompt_text[i] = NULL;
    }
}

static void new_id(struct frontend *fe, const char *prefix, char *out, size_t len)
{
    uint64_t n = atomic_fetch_add(&fe->next_id, 1);
    snprintf(out, len, "%s%016" PRIx64 "%08" PRIx64, prefix, fe->id_prefix, n);
}

/* Checks lengths, makes the choices and submits them. 0, or -1 with status and err. */
static int submit(struct completion *g, unsigned *status, const char **param, char *err, size_t len)
{
    struct frontend *fe = g->fe;
    int max_len = fe_link_limits(&fe->link).max_model_len;

    for (int i = 0; i < g->n_prompts; i++) {
        size_t np = g->n_prompt[i];
        int want = g->p.max_tokens > 0 ? g->p.max_tokens : 1;
        if (np == 0 || (long long)np + want > max_len) {
            *param = g->p.chat ? "messages" : "prompt";
            lora_errf(err, len,
                      "this model's maximum context length is %d tokens, but the request "
                      "asks for %zu tokens (%zu in the %s, %d to generate); reduce the length "
                      "of the %s or of max_tokens",
                      max_len, np + (size_t)want, np, g->p.chat ? "messages" : "prompt", want,
                      g->p.chat ? "messages" : "prompt");
            *status = 400;
            return -1;
        }
    }
    g->n_choices = g->n_prompts * g->p.n;
    if (g->n_choices > FE_MAX_N) {
        *param = "n";
        lora_errf(err, len, "prompts times n is %d, more than %d", g->n_choices, FE_MAX_N);
        *status = 400;
        return -1;
    }
    g->choices = calloc((size_t)g->n_choices, sizeof(*g->choices));
    if (!g->choices) {
        lora_errf(err, len, "out of memory");
        *status = 503;
        return -1;
    }
    g->submitted = lora_clock_unix();
    for (int k = 0; k < g->n_choices; k++) {
        struct choice *c = &g->choices[k];
        int pi = k / g->p.n;
        char rid[FE_ID_MAX];
        snprintf(rid, sizeof(rid), "%s-%d", g->id, k);
        c->index = k;
        c->prompt_index = pi;
        c->seq = seq_new(rid);
        if (fe->tok)
            c->detok = lora_detok_new(fe->tok, g->p.skip_special_tokens);
        if (!c->seq || (fe->tok && !c->detok)) {
            lora_errf(err, len, "out of memory");
            *status = 503;
            return -1;
        }
        c->seq->cond = &g->cond;
        size_t np = g->n_prompt[pi];
        int max_tokens = g->p.max_tokens > 0 ? g->p.max_tokens : max_len - (int)np;
        struct lora_msg_request m = {
            .request_id = {rid, strlen(rid)},
            .prompt = g->prompts[pi],
            .n_prompt = np,
            .max_tokens = max_tokens,
            .min_tokens = g->p.min_tokens < max_tokens ? g->p.min_tokens : max_tokens,
            .temperature = g->p.temperature,
            .top_p = g->p.top_p,
            .top_k = g->p.top_k,
            .has_seed = g->p.has_seed,
            .seed = g->p.seed + (uint64_t)(k % g->p.n),
            .logprobs = g->p.logprobs > 0 ? g->p.logprobs : 0,
            .prompt_logprobs = (g->p.echo && g->p.logprobs >= 0) || g->p.prompt_logprobs >= 0,
            /* An explicit prompt_logprobs wins; else echo shows logprobs alternatives, as
             * vLLM sets prompt_logprobs from logprobs under echo. */
            .prompt_top_n = g->p.prompt_logprobs >= 0        ? g->p.prompt_logprobs
                            : g->p.echo && g->p.logprobs > 0 ? g->p.logprobs
                                                             : 0,
            .ignore_eos = g->p.ignore_eos,
            .n_stop_token_ids = g->p.n_stop_ids,
            .stop_token_ids = g->p.stop_ids,
            .n_allowed_token_ids = g->p.n_allowed,
            .allowed_token_ids = g->p.allowed,
        };
        int32_t stops[17];
        if (fe->eos_id >= 0 && !g->p.ignore_eos) {
            /* The tokenizer's end of turn stops too, as vLLM adds it to the stop ids. */
            memcpy(stops, g->p.stop_ids, sizeof(int32_t) * (size_t)g->p.n_stop_ids);
            stops[g->p.n_stop_ids] = fe->eos_id;
            m.stop_token_ids = stops;
            m.n_stop_token_ids = g->p.n_stop_ids + 1;
        }
        if (g->p.lora)
            m.lora = (struct lora_str){g->p.lora, strlen(g->p.lora)};
        if (link_submit(&fe->link, c->seq, &m, fe->max_pending, err, len) < 0) {
            link_forget(&fe->link, &c->seq);
            *status = 503;
            return -1;
        }
    }
    return 0;
}

/* ---- consuming outputs ------------------------------------------------------------------ */

void completions_finish_choice(struct choice *c, const char *reason)
{
    c->done = true;
    c->done_at = lora_clock_unix();
    snprintf(c->finish_reason, sizeof(c->finish_reason), "%s", reason);
}

/* Looks for a stop string in the text added since old_len; cuts the text before it, or after it
 * with include_stop_str_in_output. */
static bool find_stop(const struct gen_params *p, struct choice *c, size_t old_len)
{
    size_t from = old_len + 1 > p->max_stop_len ? old_len + 1 - p->max_stop_len : 0;
    size_t best = SIZE_MAX;
    const char *which = NULL;

    for (int i = 0; i < p->n_stop; i++) {
        const char *hit =
            memmem(c->text.data + from, c->text.len - from, p->stop[i], strlen(p->stop[i]));
        if (hit && (size_t)(hit - c->text.data) < best) {
            best = (size_t)(hit - c->text.data);
            which = p->stop[i];
        }
    }
    if (!which)
        return false;
    if (p->include_stop_str_in_output)
        best += strlen(which);
    c->text.len = best;
    c->text.data[best] = 0;
    c->stop_reason = which;
    return true;
}

static void add_text(struct choice *c, char *piece, size_t n)
{
    if (piece && n)
        lora_buf_add(&c->text, piece, n);
    else if (!c->text.data)
        lora_buf_add(&c->text, "", 0);
    free(piece);
}

/* Takes one token into the choice: detokenizes it and checks the stop strings (after
 * min_tokens, as vLLM does). Returns true when a stop string ended the choice. */
static bool take_token(struct completion *g, struct choice *c)
{
    char *piece = NULL;
    size_t n = 0, old = c->text.len;

    if (c->detok && lora_detok_push(c->detok, &c->ids[c->n - 1], 1, &piece, &n, NULL, 0) < 0)
        piece = NULL;
    add_text(c, piece, n);
    if (g->p.n_stop && (int)c->n > g->p.min_tokens && find_stop(&g->p, c, old)) {
        completions_finish_choice(c, "stop");
        return true;
    }
    return false;
}

/* Copies what the engine sent since last time into the choice, under the link's lock. */
static void advance(struct completion *g, struct choice *c)
{
    struct fe_link *l = &g->fe->link;
    struct fe_seq *s = c->seq;
    bool stopped = false;

    if (c->done || !s)
        return;
    pthread_mutex_lock(&l->mu);
    size_t upto = s->n;
    if (upto > c->n || s->finished)
        c->heard = true;
    if (seq_grow_tokens(&c->ids, &c->lps, &c->top_ids, &c->top_lps, &c->cap, upto, s->top_n) < 0) {
        pthread_mutex_unlock(&l->mu);
        snprintf(c->error, sizeof(c->error), "out of memory");
        snprintf(c->error_code, sizeof(c->error_code), "unavailable");
        completions_finish_choice(c, "error");
        return;
    }
    c->top_n = s->top_n;
    seq_copy_prompt_lps(&c->prompt, s->prompt.n, s->prompt.lps, s->prompt.ranks, s->prompt.top_n,
                        s->prompt.top_ids, s->prompt.top_lps);
    size_t from = c->n;
    for (size_t i = from; i < upto && !stopped; i++) {
        c->ids[i] = s->tokens[i];
        c->lps[i] = s->lps[i];
        if (c->top_n) {
            memcpy(c->top_ids + i * (size_t)c->top_n, s->top_ids + i * (size_t)c->top_n,
                   sizeof(int32_t) * (size_t)c->top_n);
            memcpy(c->top_lps + i * (size_t)c->top_n, s->top_lps + i * (size_t)c->top_n,
                   sizeof(float) * (size_t)c->top_n);
        }
        c->n = i + 1;
        pthread_mutex_unlock(&l->mu);
        stopped = take_token(g, c);
        pthread_mutex_lock(&l->mu);
    }
    bool finished = s->finished && c->n == s->n;
    if (finished && !stopped) {
        snprintf(c->error, sizeof(c->error), "%s", s->error);
        snprintf(c->error_code, sizeof(c->error_code), "%s", s->error_code);
        snprintf(c->finish_reason, sizeof(c->finish_reason), "%s", s->finish_reason);
    }
    c->queued = s->queued;
    c->scheduled = s->scheduled;
    c->first_token = s->first_token;
    c->finished_at = s->finished_at;
    c->first_seen = s->first_seen;
    c->sent_at = s->sent_at;
    if ((c->n > from || finished) && !c->pending_recv)
        c->pending_recv = s->last_recv;
    pthread_mutex_unlock(&l->mu);
    if (stopped) {
        link_forget(l, &c->seq); /* aborts it in the engine */
        return;
    }
    if (finished) {
        char *rest = NULL;
        size_t n = 0, old = c->text.len;
        if (c->detok && lora_detok_finish(c->detok, &rest, &n, NULL, 0) < 0)
            rest = NULL;
        add_text(c, rest, n);
        char reason[sizeof(c->finish_reason)];
        snprintf(reason, sizeof(reason), "%s", c->finish_reason);
        if (g->p.n_stop && (int)c->n > g->p.min_tokens && find_stop(&g->p, c, old))
            snprintf(reason, sizeof(reason), "stop");
        completions_finish_choice(c, reason);
    }
}

bool completions_all_done(const struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++)
        if (!g->choices[i].done)
            return false;
    return true;
}

/* Whether a choice has something new to consume. Under the link's lock. */
static bool news_locked(const struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++) {
        const struct choice *c = &g->choices[i];
        if (!c->done && c->seq && (c->seq->n > c->n || c->seq->finished))
            return true;
    }
    return false;
}

void completions_wait(struct completion *g)
{
    struct fe_link *l = &g->fe->link;
    pthread_mutex_lock(&l->mu);
    if (!news_locked(g))
        link_wait_locked(l, &g->cond, WAIT_SLICE_MS);
    pthread_mutex_unlock(&l->mu);
}

void completions_advance(struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++)
        advance(g, &g->choices[i]);
}

void completions_abort(struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++)
        link_forget(&g->fe->link, &g->choices[i].seq);
}

/* The first choice that failed with an engine error, or NULL. */
const struct choice *completions_failed_choice(const struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++)
        if (g->choices[i].done && strcmp(g->choices[i].finish_reason, "error") == 0)
            return &g->choices[i];
    return NULL;
}

/* ---- JSON pieces ------------------------------------------------------------------------ */

json_t *completions_text_json(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    return j ? j : json_string("\xef\xbf\xbd"); /* never reached: pieces are valid UTF-8 */
}

/* The text of one token, as vLLM shows it in log-probabilities: "token_id:N" with
 * return_tokens_as_token_ids (or without a tokenizer). */
static json_t *token_json(struct completion *g, int32_t id)
{
    struct frontend *fe = g->fe;
    char buf[32];
    if (!fe->tok || g->p.return_tokens_as_token_ids) {
        snprintf(buf, sizeof(buf), "token_id:%d", id);
        return json_string(buf);
    }
    char *s = NULL;
    size_t n = 0;
    if (lora_tokenizer_decode(fe->tok, &id, 1, false, &s, &n, NULL, 0) < 0) {
        snprintf(buf, sizeof(buf), "token_id:%d", id);
        return json_string(buf);
    }
    json_t *j = completions_text_json(s, n);
    free(s);
    return j;
}

static json_t *bytes_json(json_t *tok)
{
    json_t *a = json_array();
    const unsigned char *s = (const unsigned char *)json_string_value(tok);
    for (size_t i = 0; s && i < json_string_length(tok); i++)
        json_array_append_new(a, json_integer(s[i]));
    return a;
}

static double lp_value(float lp)
{
    return isfinite(lp) ? (double)lp : -9999.0; /* JSON has no -inf; OpenAI clamps the same */
}

/* Chat log-probabilities of tokens [from, to) of a choice: {"content":[...]}. */
json_t *completions_chat_logprobs(struct completion *g, const struct choice *c, size_t from,
                                  size_t to)
{
    json_t *content = json_array();
    for (size_t i = from; i < to; i++) {
        json_t *t = token_json(g, c->ids[i]);
        json_t *tops = json_array();
        for (int k = 0; k < g->p.logprobs && k < c->top_n; k++) {
            int32_t id = c->top_ids[i * (size_t)c->top_n + (size_t)k];
            json_t *tt = token_json(g, id);
            json_array_append_new(tops,
                                  json_pack("{s:O, s:f, s:o}", "token", tt, "logprob",
                                            lp_value(c->top_lps[i * (size_t)c->top_n + (size_t)k]),
                                            "bytes", bytes_json(tt)));
            json_decref(tt);
        }
        json_array_append_new(content, json_pack("{s:O, s:f, s:o, s:o}", "token", t, "logprob",
                                                 lp_value(c->lps[i]), "bytes", bytes_json(t),
                                                 "top_logprobs", tops));
        json_decref(t);
    }
    return json_pack("{s:o}", "content", content);
}

/* Completions log-probabilities (the legacy format) of tokens [from, to), with the prompt's
 * tokens first when echo is set; offset is the text offset of the first token. */
json_t *completions_text_logprobs(struct completion *g, const struct choice *c, bool with_prompt,
                                  size_t from, size_t to, size_t offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t np = g->n_prompt[c->prompt_index];
    const int32_t *prompt = g->prompts[c->prompt_index];

    for (size_t i = 0; with_prompt && i < np; i++) {
        json_t *t = token_json(g, prompt[i]);
        bool known = i > 0 && (int)i < c->prompt.n && !isnan(c->prompt.lps[i]);
        json_array_append(tokens, t);
        json_array_append_new(lps, known ? json_real(lp_value(c->prompt.lps[i])) : json_null());
        json_t *top = known ? json_object() : json_null();
        for (int k = 0; known && k < g->p.logprobs && k < c->prompt.top_n; k++) {
            size_t at = i * (size_t)c->prompt.top_n + (size_t)k;
            json_t *tt = token_json(g, c->prompt.top_ids[at]);
            json_object_set_new(top, json_string_value(tt),
                                json_real(lp_value(c->prompt.top_lps[at])));
            json_decref(tt);
        }
        if (known) /* the prompt token itself is always there */
            json_object_set_new(top, json_string_value(t), json_real(lp_value(c->prompt.lps[i])));
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += json_string_length(t);
        json_decref(t);
    }
    for (size_t i = from; i < to; i++) {
        json_t *t = token_json(g, c->ids[i]);
        json_t *top = json_object();
        for (int k = 0; k < g->p.logprobs && k < c->top_n; k++) {
            json_t *tt = token_json(g, c->top_ids[i * (size_t)c->top_n + (size_t)k]);
            json_object_set_new(top, json_string_value(tt),
                                json_real(lp_value(c->top_lps[i * (size_t)c->top_n + (size_t)k])));
            json_decref(tt);
        }
        /* The chosen token is always there, as vLLM reports it. */
        json_object_set_new(top, json_string_value(t), json_real(lp_value(c->lps[i])));
        json_array_append(tokens, t);
        json_array_append_new(lps, json_real(lp_value(c->lps[i])));
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += json_string_length(t);
        json_decref(t);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "text_offset", offs, "token_logprobs", lps, "tokens",
                     tokens, "top_logprobs", tops);
}

/* One entry of vLLM's prompt_logprobs: "ID": {"logprob", "rank", "decoded_token"}, set in pos
 * unless the id is there already. rank < 0: unknown (null). */
static void prompt_entry(struct completion *g, json_t *pos, int32_t id, float lp, int rank)
{
    char key[16], *s = NULL;
    size_t n = 0;
    json_t *text = json_null();

    snprintf(key, sizeof(key), "%" PRId32, id);
    if (json_object_get(pos, key))
        return;
    if (g->fe->tok && lora_tokenizer_decode(g->fe->tok, &id, 1, false, &s, &n, NULL, 0) == 0) {
        json_decref(text);
        text = completions_text_json(s, n);
    }
    free(s);
    json_object_set_new(pos, key,
                        json_pack("{s:f, s:o, s:o}", "logprob", lp_value(lp), "rank",
                                  rank >= 0 ? json_integer(rank) : json_null(), "decoded_token",
                                  text));
}

/* vLLM's prompt_logprobs of one prompt: null for the first token (nothing predicts it), then
 * per token the prompt token's entry followed by its position's N most likely (ranks 1 to N),
 * -inf written as -9999.0. */
static json_t *prompt_logprobs_json(struct completion *g, const struct choice *c)
{
    size_t np = g->n_prompt[c->prompt_index];
    const int32_t *prompt = g->prompts[c->prompt_index];
    json_t *a = json_array();

    for (size_t i = 0; i < np; i++) {
        if (i == 0 || (int)i >= c->prompt.n || isnan(c->prompt.lps[i])) {
            json_array_append_new(a, json_null());
            continue;
        }
        json_t *pos = json_object();
        prompt_entry(g, pos, prompt[i], c->prompt.lps[i],
                     c->prompt.ranks ? c->prompt.ranks[i] : -1);
        for (int k = 0; k < g->p.prompt_logprobs && k < c->prompt.top_n; k++) {
            size_t at = i * (size_t)c->prompt.top_n + (size_t)k;
            prompt_entry(g, pos, c->prompt.top_ids[at], c->prompt.top_lps[at], k + 1);
        }
        json_array_append_new(a, pos);
    }
    return a;
}

json_t *completions_ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

json_t *completions_usage_json(const struct completion *g)
{
    long long prompt = 0, completion = 0;
    for (int i = 0; i < g->n_prompts; i++)
        prompt += (long long)g->n_prompt[i];
    for (int i = 0; i < g->n_choices; i++)
        completion += (long long)g->choices[i].n;
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", prompt, "completion_tokens", completion,
                     "total_tokens", prompt + completion);
}

json_t *completions_stop_reason_json(const struct choice *c)
{
    return c->stop_reason ? json_string(c->stop_reason) : json_null();
}

json_t *completions_head_json(const struct completion *g, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", g->id, "object", object, "created", g->created,
                     "model", g->p.model);
}

/* ---- per-request stats ------------------------------------------------------------------ */

void completions_publish_stats(struct completion *g)
{
    for (int i = 0; i < g->n_choices; i++) {
        const struct choice *c = &g->choices[i];
        char rid[FE_ID_MAX];
        snprintf(rid, sizeof(rid), "%s-%d", g->id, i);
        struct fe_stats st = {
            .request_id = rid,
            .lora = g->p.lora,
            .finish_reason = c->done ? c->finish_reason : "abort",
            .arrival = g->arrival,
            .first_token = c->first_seen,
            .finished = c->done_at ? c->done_at : lora_clock_unix(),
            .queued = c->queued,
            .scheduled = c->scheduled,
            .engine_first_token = c->first_token,
            .engine_finished = c->finished_at,
            .prompt_tokens = (int)g->n_prompt[c->prompt_index],
            .generation_tokens = (int)c->n,
            .max_tokens = g->p.max_tokens,
            .submit_seconds = c->sent_at > 0 ? c->sent_at - g->arrival : 0,
            .output_seconds = g->delay_n ? g->delay_sum / g->delay_n : 0,
        };
        stats_publish(g->fe, &st);
    }
}

/* ---- whole responses -------------------------------------------------------------------- */

void completions_reply_engine_error(struct lora_http_request *req, const struct choice *c)
{
    reply_error(req, reply_status_of(c->error_code), c->error_code[0] == 'n' ? "model" : NULL, "%s",
                c->error[0] ? c->error : "the request failed in the engine");
}

const char *completions_prompt_text(struct completion *g, const struct choice *c, char **decoded)
{
    const char *text = g->prompt_text[c->prompt_index];
    size_t n = 0;

    *decoded = NULL;
    if (!text && g->fe->tok &&
        lora_tokenizer_decode(g->fe->tok, g->prompts[c->prompt_index], g->n_prompt[c->prompt_index],
                              false, decoded, &n, NULL, 0) == 0)
        text = *decoded;
    return text;
}

static json_t *completion_choice(struct completion *g, struct choice *c)
{
    char *decoded = NULL;
    const char *echo = g->p.echo ? completions_prompt_text(g, c, &decoded) : NULL;
    size_t echo_len = echo ? strlen(echo) : 0;

    struct lora_buf text = {0};
    lora_buf_add(&text, echo ? echo : "", echo_len);
    lora_buf_add(&text, c->text.data ? c->text.data : "", c->text.len);
    json_t *ch = json_pack(
        "{s:i, s:o, s:o, s:s, s:o}", "index", c->index, "text",
        completions_text_json(text.data, text.len), "logprobs",
        g->p.logprobs >= 0 ? completions_text_logprobs(g, c, g->p.echo, 0, c->n, 0) : json_null(),
        "finish_reason", c->finish_reason, "stop_reason", completions_stop_reason_json(c));
    json_object_set_new(ch, "prompt_logprobs",
                        g->p.prompt_logprobs >= 0 ? prompt_logprobs_json(g, c) : json_null());
    if (g->p.return_token_ids || !g->fe->tok) {
        json_object_set_new(
            ch, "prompt_token_ids",
            completions_ids_json(g->prompts[c->prompt_index], g->n_prompt[c->prompt_index]));
        json_object_set_new(ch, "token_ids", completions_ids_json(c->ids, c->n));
    }
    lora_buf_release(&text);
    free(decoded);
    return ch;
}

static json_t *chat_choice(struct completion *g, struct choice *c)
{
    json_t *ch = json_pack(
        "{s:i, s:{s:s, s:o}, s:o, s:s, s:o}", "index", c->index, "message", "role", "assistant",
        "content", completions_text_json(c->text.data ? c->text.data : "", c->text.len), "logprobs",
        g->p.logprobs >= 0 ? completions_chat_logprobs(g, c, 0, c->n) : json_null(),
        "finish_reason", c->finish_reason, "stop_reason", completions_stop_reason_json(c));
    if (g->p.return_token_ids || !g->fe->tok)
        json_object_set_new(ch, "token_ids", completions_ids_json(c->ids, c->n));
    return ch;
}

static void respond_whole(struct completion *g, struct lora_http_request *req)
{
    while (!completions_all_done(g)) {
        completions_advance(g);
        if (completions_all_done(g))
            break;
        if (lora_http_client_gone(req)) {
            completions_abort(g);
            reply_error(req, 499, NULL, "the client closed the connection");
            return;
        }
        completions_wait(g);
    }
    const struct choice *bad = completions_failed_choice(g);
    if (bad) {
        completions_reply_engine_error(req, bad);
        return;
    }
    json_t *choices = json_array();
    for (int i = 0; i < g->n_choices; i++)
        json_array_append_new(choices, g->p.chat ? chat_choice(g, &g->choices[i])
                                                 : completion_choice(g, &g->choices[i]));
    json_t *r = completions_head_json(g, g->p.chat ? "chat.completion" : "text_completion");
    json_object_set_new(r, "choices", choices);
    json_object_set_new(r, "usage", completions_usage_json(g));
    if (g->p.chat) /* one prompt: its log-probabilities sit beside the choices */
        json_object_set_new(r, "prompt_logprobs",
                            g->p.prompt_logprobs >= 0 ? prompt_logprobs_json(g, &g->choices[0])
                                                      : json_null());
    reply_json(req, 200, r);
    double last = 0;
    for (int i = 0; i < g->n_choices; i++)
        if (g->choices[i].pending_recv > last)
            last = g->choices[i].pending_recv;
    if (last > 0) {
        g->delay_sum += lora_clock_unix() - last;
        g->delay_n++;
    }
}

void completions_respond(struct completion *g, struct lora_http_request *req)
{
    respond_whole(g, req);
    completions_publish_stats(g);
    completions_free(g);
}

/* ---- the start of a request ------------------------------------------------------------- */

struct completion *completions_start(struct frontend *fe, struct lora_http_request *req,
                                     json_t *body, bool chat)
{
    char err[2048];
    const char *param = NULL;
    unsigned status = 400;
    struct completion *g = calloc(1, sizeof(*g));

    if (!g) {
        reply_error(req, 503, NULL, "out of memory");
        return NULL;
    }
    g->fe = fe;
    g->body = json_incref(body);
    g->arrival = lora_clock_unix();
    g->created = (long long)g->arrival;
    pthread_cond_init(&g->cond, NULL);
    new_id(fe, chat ? "chatcmpl-" : "cmpl-", g->id, sizeof(g->id));
    if (params_parse(fe, body, chat, &g->p, &param, err, sizeof(err)) < 0)
        goto fail;
    param = chat ? "messages" : "prompt";
    if ((chat ? read_messages(g, err, sizeof(err)) : read_prompts(g, err, sizeof(err))) < 0)
        goto fail;
    truncate_prompts(g);
    param = NULL;
    if (submit(g, &status, &param, err, sizeof(err)) < 0)
        goto fail;
    return g;
fail:
    reply_error(req, status, param, "%s", err);
    completions_abort(g);
    completions_free(g);
    return NULL;
}
