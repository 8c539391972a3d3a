/* lora-bench: streaming completions over libcurl's multi interface, in one thread; see bench.h.
 *
 * Requests arrive at precomputed times (all at once, or Poisson/gamma intervals rescaled so
 * that the last arrives at n / rate, as vLLM does); an arrived request waits in FIFO order
 * while max_concurrency are in flight. Each response is read as server-sent events as its
 * bytes come: the first event with a choice sets the time to first token, each later one an
 * inter-token latency, the last one the end-to-end latency; the usage event gives the output
 * token count. A request succeeds only with status 200, at least one choice, no error event
 * and the closing [DONE]; anything else is a failure whose reason is kept and whose tokens are
 * never counted.
 */
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/errbuf.h"
#include "bench.h"

#define ERROR_BODY_MAX 65536     /* of a refusal's body, kept for its message */
#define EVENT_MAX      (8 << 20) /* one event's bytes: more is a broken stream */

struct run;

/* One request in flight. */
struct req {
    long i;
    struct run *run;
    CURL *h;
    struct curl_slist *hdrs;
    char *body;
    long status;
    struct lora_buf in;   /* bytes not yet parsed into lines */
    struct lora_buf data; /* the data lines of the event being read */
    bool has_data, got_done, stream_error, first;
    bool sent_usage; /* the request asked for stream_options.include_usage */
    double t_start, t_last;
    long usage_completion, usage_prompt;
    char curl_err[CURL_ERROR_SIZE];
    char event_err[512];
    struct lora_buf err_body;
};

struct run {
    const struct client_options *o;
    const struct bench_prompt *prompts;
    const char *const *models;
    struct bench_outcome *outs;
    bool usage; /* stream_options.include_usage is sent */
    bool usage_refused;
    double u0, m0;
};

static double unix_of(const struct run *run, double mono)
{
    return run->u0 + (mono - run->m0);
}

static int outcome_add_itl(struct bench_outcome *out, double v)
{
    if (out->n_itl == out->cap_itl) {
        int cap = out->cap_itl ? out->cap_itl * 2 : 64;
        double *p = realloc(out->itl, (size_t)cap * sizeof(double));
        if (!p)
            return -1;
        out->itl = p;
        out->cap_itl = cap;
    }
    out->itl[out->n_itl++] = v;
    return 0;
}

/* Records what went wrong in the stream: what, then detail. */
static void set_event_error(struct req *r, const char *what, const char *detail)
{
    if (r->stream_error)
        return; /* the first one says what went wrong */
    r->stream_error = true;
    snprintf(r->event_err, sizeof(r->event_err), "%s%s", what, detail);
}

/* One server-sent event's data. */
static void on_event(struct req *r, const char *data, size_t len, double now)
{
    struct bench_outcome *out = &r->run->outs[r->i];
    json_error_t je;

    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        r->got_done = true;
        return;
    }
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        set_event_error(r, "the stream held an event that is not a JSON object", "");
        return;
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        if (!m)
            m = json_string_value(e);
        set_event_error(r, "the server sent an error event: ", m ? m : "(no message)");
    }
    json_t *ch = json_object_get(j, "choices");
    if (json_is_array(ch) && json_array_size(ch) > 0) {
        if (!r->first) {
            r->first = true;
            out->ttft = now - r->t_start;
        } else if (outcome_add_itl(out, now - r->t_last) < 0) {
            set_event_error(r, "out of memory", "");
        }
        r->t_last = now;
        out->chunks++;
        json_t *t = json_object_get(json_array_get(ch, 0), "text");
        if (json_is_string(t)) /* a token may decode to U+0000 */
            lora_buf_add(&out->text, json_string_value(t), json_string_length(t));
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_t *c = json_object_get(u, "completion_tokens"),
               *p = json_object_get(u, "prompt_tokens");
        if (json_is_integer(c) && json_integer_value(c) >= 0)
            r->usage_completion = (long)json_integer_value(c);
        if (json_is_integer(p) && json_integer_value(p) >= 0)
            r->usage_prompt = (long)json_integer_value(p);
    }
    json_decref(j);
}

/* One line of the stream (without its end); an empty line ends the event. */
static void on_line(struct req *r, const char *line, size_t len, double now)
{
    if (len && line[len - 1] == '\r')
        len--;
    if (len == 0) {
        if (r->has_data)
            on_event(r, r->data.data ? r->data.data : "", r->data.len, now);
        lora_buf_reset(&r->data);
        r->has_data = false;
        return;
    }
    if (line[0] == ':')
        return; /* a comment: keep-alive pings */
    if (len >= 5 && memcmp(line, "data:", 5) == 0) {
        size_t skip = len > 5 && line[5] == ' ' ? 6 : 5;
        if (r->has_data)
            lora_buf_add_char(&r->data, '\n');
        lora_buf_add(&r->data, line + skip, len - skip);
        r->has_data = true;
        if (r->data.len > EVENT_MAX || r->data.failed)
            set_event_error(r, "an event longer than the bound", "");
    }
    /* event:, id:, retry: carry nothing a completion needs */
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *ctx)
{
    struct req *r = ctx;
    size_t n = size * nmemb;
    double now = lora_clock_mono();

    if (!r->status)
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status != 200) {
        size_t room = ERROR_BODY_MAX - r->err_body.len;
        lora_buf_add(&r->err_body, p, n < room ? n : room);
        return n;
    }
    if (lora_buf_add(&r->in, p, n) < 0)
        return 0; /* out of memory: curl ends the transfer with an error */
    size_t at = 0;
    for (;;) {
        char *nl = memchr(r->in.data + at, '\n', r->in.len - at);
        if (!nl)
            break;
        on_line(r, r->in.data + at, (size_t)(nl - (r->in.data + at)), now);
        at = (size_t)(nl - r->in.data) + 1;
    }
    if (at) {
        memmove(r->in.data, r->in.data + at, r->in.len - at);
        r->in.len -= at;
    }
    if (r->in.len > EVENT_MAX) {
        set_event_error(r, "a line longer than the bound", "");
        return 0;
    }
    return n;
}

static char *request_body(const struct run *run, long i)
{
    const struct bench_prompt *p = &run->prompts[i];
    json_t *ids = json_array();
    for (int k = 0; k < p->n_ids; k++)
        json_array_append_new(ids, json_integer(p->ids[k]));
    json_t *b = json_pack("{s:s, s:o, s:i, s:b}", "model", run->models[i], "prompt", ids,
                          "max_tokens", p->max_tokens, "stream", 1);
    if (!b)
        return NULL;
    if (run->usage) /* see req_finish for a server that refuses it */
        json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (run->o->ignore_eos)
        json_object_set_new(b, "ignore_eos", json_true());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void req_free(struct req *r)
{
    if (!r)
        return;
    if (r->h)
        curl_easy_cleanup(r->h);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    lora_buf_release(&r->in);
    lora_buf_release(&r->data);
    lora_buf_release(&r->err_body);
    free(r);
}

static struct req *req_start(struct run *run, CURLM *multi, long i, char *err, size_t err_len)
{
    struct req *r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    r->i = i;
    r->run = run;
    r->usage_completion = r->usage_prompt = -1;
    r->body = request_body(run, i);
    r->sent_usage = run->usage;
    r->h = curl_easy_init();
    r->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    r->hdrs = r->hdrs ? curl_slist_append(r->hdrs, "Accept: text/event-stream") : NULL;
    r->hdrs = r->hdrs ? curl_slist_append(r->hdrs, "Expect:") : NULL; /* no 100-continue */
    if (r->hdrs && run->o->api_key) {
        char auth[1024];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", run->o->api_key);
        r->hdrs = curl_slist_append(r->hdrs, auth);
    }
    if (!r->body || !r->h || !r->hdrs)
        goto oom;
    curl_easy_setopt(r->h, CURLOPT_URL, run->o->api_url);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->h, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->h, CURLOPT_USERAGENT,
                     "lora-bench/"
                     "0.1.0");
    curl_easy_setopt(r->h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    if (run->o->timeout_s > 0)
        curl_easy_setopt(r->h, CURLOPT_TIMEOUT_MS, (long)(run->o->timeout_s * 1000));
    r->t_start = lora_clock_mono();
    if (curl_multi_add_handle(multi, r->h) != CURLM_OK) {
        lora_errf(err, err_len, "unable to start a request");
        req_free(r);
        return NULL;
    }
    return r;
oom:
    req_free(r);
    lora_errf(err, err_len, "out of memory for a request");
    return NULL;
}

/* The message of a refusal's body: OpenAI's error.message, FastAPI's detail, or a plain
 * message; NULL when the body says nothing readable. */
static const char *refusal_message(const struct lora_buf *b, char *out, size_t out_len)
{
    json_error_t je;
    json_t *j = b->len ? json_loadb(b->data, b->len, 0, &je) : NULL;
    const char *m = NULL;

    if (json_is_object(j)) {
        json_t *e = json_object_get(j, "error");
        m = json_string_value(json_object_get(e, "message"));
        if (!m)
            m = json_string_value(e);
        if (!m)
            m = json_string_value(json_object_get(j, "detail"));
        if (!m)
            m = json_string_value(json_object_get(j, "message"));
    }
    if (m)
        snprintf(out, out_len, "%s", m);
    json_decref(j);
    return m ? out : NULL;
}

/* Ends request r with curl's result; returns true when it is to be sent again (the server
 * refused stream_options). */
static bool req_finish(struct req *r, CURLcode code)
{
    struct run *run = r->run;
    struct bench_outcome *out = &run->outs[r->i];
    double now = lora_clock_mono();
    char msg[1024], refusal[600];

    if (!r->status)
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status == 200 && r->in.len && !r->stream_error) {
        /* A last line without its newline. */
        on_line(r, r->in.data, r->in.len, now);
        r->in.len = 0;
    }
    if (r->status == 200 && r->has_data && !r->stream_error)
        on_line(r, "", 0, now); /* a last event without its blank line */
    out->start_unix = unix_of(run, r->t_start);
    out->end_unix = unix_of(run, now);
    msg[0] = 0;
    if (code != CURLE_OK) {
        const char *detail = r->curl_err[0] ? r->curl_err : curl_easy_strerror(code);
        if (r->status == 200)
            snprintf(msg, sizeof(msg), "stream cut short after %d chunks: %s", out->chunks, detail);
        else if (code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST)
            snprintf(msg, sizeof(msg), "unable to connect to %s: %s", run->o->api_url, detail);
        else
            snprintf(msg, sizeof(msg), "%s", detail);
    } else if (r->status != 200) {
        const char *m = refusal_message(&r->err_body, refusal, sizeof(refusal));
        /* Requests sent before the first refusal came back are refused too: each is sent
         * again, without stream_options, as the rest of the run is. */
        if (r->status == 400 && r->sent_usage && m && strstr(m, "stream_options")) {
            run->usage = false;
            run->usage_refused = true;
            return true;
        }
        snprintf(msg, sizeof(msg), "HTTP %ld: %s", r->status, m ? m : "(no error message)");
    } else if (r->stream_error) {
        snprintf(msg, sizeof(msg), "%s", r->event_err);
    } else if (!r->got_done) {
        snprintf(msg, sizeof(msg),
                 "stream cut short: the server ended it without [DONE] after %d chunks",
                 out->chunks);
    } else if (!out->chunks) {
        snprintf(msg, sizeof(msg), "no chunk carried a choice, so no token can be timed");
    }
    if (msg[0]) {
        out->success = false;
        out->error = strdup(msg);
        out->output_tokens = 0;
        out->latency = r->first ? r->t_last - r->t_start : 0;
        return false;
    }
    out->success = true;
    out->latency = r->t_last - r->t_start;
    out->tokens_from_usage = r->usage_completion >= 0;
    out->output_tokens = out->tokens_from_usage ? (int)r->usage_completion : out->chunks;
    if (r->usage_prompt >= 0)
        out->prompt_len = (int)r->usage_prompt;
    return false;
}

/* The arrival offsets in seconds, as vLLM computes them. */
static double *arrivals(const struct client_options *o, long n)
{
    double *t = calloc((size_t)n, sizeof(double));
    uint64_t st = o->seed ^ 0x5DEECE66Dull;

    if (!t || isinf(o->request_rate))
        return t;
    double acc = 0;
    for (long i = 0; i < n; i++) {
        double d = isinf(o->burstiness)
                       ? 1.0 / o->request_rate
                       : rng_gamma(&st, o->burstiness, 1.0 / (o->request_rate * o->burstiness));
        acc += d;
        t[i] = acc;
    }
    if (acc > 0) {
        double f = ((double)n / o->request_rate) / acc;
        for (long i = 0; i < n; i++)
            t[i] *= f;
    }
    return t;
}

int client_run(const struct client_options *o, const struct bench_prompt *prompts,
               const char *const *models, long n, struct bench_outcome *outs, bool *usage_refused,
               char *err, size_t err_len)
{
    struct run run = {.o = o, .prompts = prompts, .models = models, .outs = outs, .usage = true};
    double *arrive = arrivals(o, n);
    double *arrived_at = calloc((size_t)n, sizeof(double));
    long *retry = calloc((size_t)n, sizeof(long));
    struct req **live = calloc((size_t)n, sizeof(*live)); /* in flight, by request */
    CURLM *multi = curl_multi_init();
    long next = 0, started = 0, done = 0, in_flight = 0, n_retry = 0;
    int rc = -1;

    if (!arrive || !arrived_at || !retry || !live || !multi) {
        lora_errf(err, err_len, "out of memory for %ld requests", n);
        goto out;
    }
    for (long i = 0; i < n; i++) {
        outs[i].model = models[i];
        outs[i].prompt_len = prompts[i].n_ids;
    }
    run.u0 = lora_clock_unix();
    run.m0 = lora_clock_mono();
    while (done < n) {
        double now = lora_clock_mono() - run.m0;
        while (next < n && arrive[next] <= now)
            arrived_at[next++] = now + run.m0;
        /* Requests sent again first, then the arrived ones in order. */
        while ((n_retry || started < next) &&
               (!o->max_concurrency || in_flight < o->max_concurrency)) {
            long i = n_retry ? retry[--n_retry] : started++;
            if (!(live[i] = req_start(&run, multi, i, err, err_len)))
                goto out;
            in_flight++;
        }
        int running = 0;
        curl_multi_perform(multi, &running);
        int left, finished = 0;
        CURLMsg *m;
        while ((m = curl_multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            struct req *r = NULL;
            CURLcode code = m->data.result;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            curl_multi_remove_handle(multi, r->h);
            live[r->i] = NULL;
            in_flight--;
            finished++;
            if (req_finish(r, code)) {
                /* Sent again without stream_options: what it recorded starts over. */
                struct bench_outcome *out = &outs[r->i];
                free(out->itl);
                lora_buf_release(&out->text);
                *out = (struct bench_outcome){.model = models[r->i],
                                              .prompt_len = prompts[r->i].n_ids};
                retry[n_retry++] = r->i;
            } else {
                outs[r->i].queue = (r->t_start - arrived_at[r->i]);
                if (outs[r->i].queue < 0)
                    outs[r->i].queue = 0;
                done++;
                if (o->on_done)
                    o->on_done(o->on_done_ctx, done, n);
            }
            req_free(r);
        }
        if (finished)
            continue;
        long wait_ms = 200;
        if (next < n) {
            double until = arrive[next] - (lora_clock_mono() - run.m0);
            long ms = until <= 0 ? 0 : (long)ceil(until * 1000);
            if (ms < wait_ms)
                wait_ms = ms;
        }
        if (wait_ms > 0 || running)
            curl_multi_poll(multi, NULL, 0, (int)wait_ms, NULL);
    }
    rc = 0;
out:
    /* Only after an error are requests left in flight: they are abandoned. */
    for (long i = 0; live && i < n; i++) {
        if (live[i]) {
            curl_multi_remove_handle(multi, live[i]->h);
            req_free(live[i]);
        }
    }
    if (multi)
        curl_multi_cleanup(multi);
    free(live);
    free(arrive);
    free(arrived_at);
    free(retry);
    if (usage_refused)
        *usage_refused = run.usage_refused;
    return rc;
}

void client_outcomes_free(struct bench_outcome *outs, long n)
{
    if (!outs)
        return;
    for (long i = 0; i < n; i++) {
        free(outs[i].error);
        free(outs[i].itl);
        lora_buf_release(&outs[i].text);
    }
    free(outs);
}

static size_t on_get(char *p, size_t size, size_t nmemb, void *ctx)
{
    struct lora_buf *b = ctx;
    size_t n = size * nmemb;
    return lora_buf_add(b, p, n) < 0 ? 0 : n;
}

struct get_ctx {
    struct lora_buf *b;
    size_t max;
    bool too_large;
};

static size_t on_get_bounded(char *p, size_t size, size_t nmemb, void *ctx)
{
    struct get_ctx *g = ctx;
    size_t n = size * nmemb;
    if (g->b->len + n > g->max) {
        g->too_large = true;
        return 0;
    }
    return on_get(p, size, nmemb, g->b);
}

long client_get(const char *url, const char *api_key, double timeout_s, size_t max_bytes,
                struct lora_buf *body, char *err, size_t err_len)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    struct get_ctx g = {body, max_bytes, false};
    char cerr[CURL_ERROR_SIZE] = "";
    long status = -1;

    if (!h) {
        lora_errf(err, err_len, "unable to start a request");
        return -1;
    }
    if (api_key) {
        char auth[1024];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
        hdrs = curl_slist_append(NULL, auth);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_get_bounded);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &g);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode code = curl_easy_perform(h);
    if (code == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    } else if (g.too_large) {
        lora_errf(err, err_len, "%s: the answer is larger than %zu bytes", url, max_bytes);
    } else {
        lora_errf(err, err_len, "%s: %s", url, cerr[0] ? cerr : curl_easy_strerror(code));
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return status;
}
