/* lora-frontend: a /v1/completions or /v1/chat/completions request answered as server-sent
 * events (docs/design.md, "HTTP API"). The request itself (its choices, what the engine sent them,
 * the JSON pieces) is completions.c's; this file decides when the status goes out, turns what
 * changed into events and hands them to the HTTP server through a reader, which runs on the
 * connection's thread as the server asks for bytes.
 */
#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "completions.h"

/* The stream of one request. */
struct sse {
    struct completion *g;
    struct lora_buf out; /* events not yet handed to the HTTP server */
    size_t out_at;
    double out_recv; /* the oldest engine output in out, for the overhead measure */
    bool role_sent, finished, failed;
};

static void sse_event(struct sse *s, json_t *chunk)
{
    char *text = json_dumps(chunk, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(chunk);
    if (!text)
        return;
    lora_buf_add(&s->out, "data: ", 6);
    lora_buf_add(&s->out, text, strlen(text));
    lora_buf_add(&s->out, "\n\n", 2);
    free(text);
}

static json_t *stream_chunk(struct completion *g, json_t *choice)
{
    json_t *r = completions_head_json(g, g->p.chat ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(r, "choices", choice ? json_pack("[o]", choice) : json_array());
    if (g->p.include_usage)
        json_object_set_new(r, "usage", json_null());
    return r;
}

/* How much of the text may be sent: all of it once done, else all but what could still be
 * the start of a stop string, cut back to a UTF-8 character boundary. A stop string that stays
 * in the output needs no holding back: the text is cut after it as soon as it is complete, as
 * vLLM streams it. */
static size_t sendable(const struct completion *g, const struct choice *c)
{
    if (c->done || !g->p.n_stop || g->p.include_stop_str_in_output)
        return c->text.len;
    size_t hold = g->p.max_stop_len - 1;
    size_t n = c->text.len > hold ? c->text.len - hold : 0;
    while (n > 0 && n < c->text.len && ((unsigned char)c->text.data[n] & 0xC0) == 0x80)
        n--;
    return n < c->streamed ? c->streamed : n;
}

/* Events for what changed in one choice since the last call. */
static void stream_choice(struct sse *s, struct choice *c)
{
    struct completion *g = s->g;
    size_t upto = sendable(g, c);
    bool text_news = upto > c->streamed, lp_news = g->p.logprobs >= 0 && c->n > c->lp_streamed;
    bool final = c->done && !c->final_sent;

    if (!text_news && !lp_news && !final)
        return;
    json_t *text =
        completions_text_json(c->text.data ? c->text.data + c->streamed : "", upto - c->streamed);
    json_t *lps = json_null();
    if (lp_news)
        lps = g->p.chat ? completions_chat_logprobs(g, c, c->lp_streamed, c->n)
                        : completions_text_logprobs(g, c, false, c->lp_streamed, c->n, c->streamed);
    json_t *fin = final ? json_string(c->finish_reason) : json_null();
    json_t *ch;
    if (g->p.chat)
        ch = json_pack("{s:i, s:{s:o}, s:o, s:o}", "index", c->index, "delta", "content", text,
                       "logprobs", lps, "finish_reason", fin);
    else
        ch = json_pack("{s:i, s:o, s:o, s:o}", "index", c->index, "text", text, "logprobs", lps,
                       "finish_reason", fin);
    if (final) {
        json_object_set_new(ch, "stop_reason", completions_stop_reason_json(c));
        if (g->p.return_token_ids)
            json_object_set_new(ch, "token_ids", completions_ids_json(c->ids, c->n));
    }
    sse_event(s, stream_chunk(g, ch));
    if (c->pending_recv && (!s->out_recv || c->pending_recv < s->out_recv))
        s->out_recv = c->pending_recv;
    c->pending_recv = 0;
    c->streamed = upto;
    c->lp_streamed = c->n;
    c->final_sent = final || c->final_sent;
}

static void stream_step(struct sse *s)
{
    struct completion *g = s->g;

    if (g->p.chat && !s->role_sent) {
        for (int i = 0; i < g->n_choices; i++)
            sse_event(s, stream_chunk(g, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i,
                                                   "delta", "role", "assistant", "content", "",
                                                   "logprobs", "finish_reason")));
        s->role_sent = true;
    }
    if (g->p.echo && !s->role_sent) {
        for (int i = 0; i < g->n_choices; i++) {
            char *dec = NULL;
            const char *t = completions_prompt_text(g, &g->choices[i], &dec);
            sse_event(
                s, stream_chunk(g, json_pack("{s:i, s:o, s:n, s:n}", "index", i, "text",
                                             completions_text_json(t ? t : "", t ? strlen(t) : 0),
                                             "logprobs", "finish_reason")));
            free(dec);
        }
        s->role_sent = true;
    }
    completions_advance(g);
    const struct choice *bad = completions_failed_choice(g);
    if (bad && !s->failed) {
        /* An error after the stream started: one error event, as vLLM sends it. */
        unsigned status = reply_status_of(bad->error_code);
        json_t *e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message",
                              bad->error[0] ? bad->error : "the request failed in the engine",
                              "type", reply_type_of(status), "param", "code", (int)status);
        sse_event(s, e);
        s->failed = true;
        completions_abort(g);
        for (int i = 0; i < g->n_choices; i++)
            if (!g->choices[i].done)
                completions_finish_choice(&g->choices[i], "abort");
    }
    if (!s->failed)
        for (int i = 0; i < g->n_choices; i++)
            stream_choice(s, &g->choices[i]);
    if (completions_all_done(g) && !s->finished) {
        if (g->p.include_usage && !s->failed) {
            json_t *r =
                completions_head_json(g, g->p.chat ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(r, "choices", json_array());
            json_object_set_new(r, "usage", completions_usage_json(g));
            sse_event(s, r);
        }
        lora_buf_add(&s->out, "data: [DONE]\n\n", 14);
        s->finished = true;
    }
}

static ssize_t stream_read(void *ctx, const struct lora_http_request *req, char *buf, size_t max)
{
    struct sse *s = ctx;
    struct completion *g = s->g;

    for (;;) {
        if (s->out_at < s->out.len) {
            if (s->out_recv) {
                g->delay_sum += lora_clock_unix() - s->out_recv;
                g->delay_n++;
                s->out_recv = 0;
            }
            size_t n = s->out.len - s->out_at;
            if (n > max)
                n = max;
            memcpy(buf, s->out.data + s->out_at, n);
            s->out_at += n;
            if (s->out_at == s->out.len)
                s->out.len = s->out_at = 0;
            return (ssize_t)n;
        }
        if (s->finished)
            return LORA_HTTP_STREAM_END;
        stream_step(s);
        if (s->out.len)
            continue;
        if (lora_http_client_gone(req))
            return LORA_HTTP_STREAM_ERROR;
        completions_wait(g);
    }
}

static void stream_done(void *ctx, bool completed)
{
    struct sse *s = ctx;

    completions_abort(s->g); /* a client that went away: its requests end in the engine */
    completions_publish_stats(s->g);
    completions_free(s->g);
    lora_buf_release(&s->out);
    free(s);
}

void sse_respond(struct completion *g, struct lora_http_request *req)
{
    /* The status goes out with the engine's first word on every choice, so that a request the
     * engine refuses (unhealthy, full, an adapter it does not hold or that was unloaded while
     * the request waited) gets its error status, never 200 and then an error event. The first
     * word of an accepted request is its first token, which the client waits for anyway. */
    for (;;) {
        completions_advance(g);
        bool heard = true;
        for (int i = 0; i < g->n_choices; i++)
            heard &= g->choices[i].heard || g->choices[i].done;
        if (heard || completions_failed_choice(g) || lora_http_client_gone(req))
            break;
        completions_wait(g);
    }
    const struct choice *bad = completions_failed_choice(g);
    if (bad && bad->n == 0) {
        completions_reply_engine_error(req, bad);
        completions_abort(g);
        completions_free(g);
        return;
    }
    lora_http_add_header(req, "Cache-Control", "no-cache");
    struct sse *s = calloc(1, sizeof(*s));
    if (s)
        s->g = g;
    if (!s ||
        lora_http_respond_stream(req, 200, "text/event-stream", stream_read, stream_done, s) < 0) {
        reply_error(req, 503, NULL, "out of memory");
        completions_abort(g);
        completions_free(g);
        free(s);
    }
}
