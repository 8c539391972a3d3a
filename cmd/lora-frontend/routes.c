/* lora-frontend: HTTP dispatch (docs/design.md, "HTTP API"). Every handler runs on its connection's
 * thread. With a key (--api-key, else VLLM_API_KEY), paths that start with /v1 need the bearer
 * token and every other path (/metrics, /health, /version, /tokenize, /detokenize) stays open,
 * OPTIONS too, exactly as vLLM's authentication middleware decides (it passes any path that does
 * not start with /v1): clients written for vLLM call /tokenize without a key, and a key here that
 * vLLM does not ask for would break them. What keeps the open tokenizer endpoints from being a
 * lever is bounds: prompt text longer than any prompt that fits the context is refused before it
 * is tokenized (fe_prompt_fits), and the bodies held at once are bounded (--max-body-memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "completions.h"
#include "frontend.h"
#include "params.h"
#include "sse.h"

static bool same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

static bool authorized(struct frontend *fe, struct lora_http_request *req)
{
    if (!fe->api_key || strncmp(lora_http_path(req), "/v1", 3) != 0 ||
        strcmp(lora_http_method(req), "OPTIONS") == 0)
        return true;
    const char *h = lora_http_header(req, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0 && same_secret(h + 7, fe->api_key))
        return true;
    reply_error(req, 401, NULL, "a valid 'Authorization: Bearer KEY' header is required");
    return false;
}

/* The body as a JSON object, or NULL after answering 400. */
static json_t *json_body(struct lora_http_request *req)
{
    size_t len;
    const char *s = lora_http_body(req, &len);
    json_error_t je;

    if (len == 0) {
        reply_error(req, 400, NULL, "the request needs a JSON body");
        return NULL;
    }
    json_t *j = json_loadb(s, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!j) {
        reply_error(req, 400, NULL, "invalid JSON at line %d column %d: %s", je.line, je.column,
                    je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        reply_error(req, 400, NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

static const char *module_base(struct frontend *fe, const char *name)
{
    for (int i = 0; i < fe->n_module_base; i++)
        if (strcmp(fe->module_base[i].name, name) == 0)
            return fe->module_base[i].base;
    return fe->served_name;
}

static void models(struct frontend *fe, struct lora_http_request *req)
{
    json_t *data = json_array();
    long long created = (long long)fe->start_time;
    struct fe_link *l = &fe->link;

    pthread_mutex_lock(&l->mu);
    json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id",
                                          fe->served_name, "object", "model", "created", created,
                                          "owned_by", "lora-stack", "root", fe->model_dir, "parent",
                                          "max_model_len", l->limits.max_model_len));
    for (int i = 0; i < l->n_registry; i++)
        json_array_append_new(
            data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", l->registry[i].name, "object",
                            "model", "created", created, "owned_by", "lora-stack", "root",
                            l->registry[i].path, "parent", module_base(fe, l->registry[i].name)));
    pthread_mutex_unlock(&l->mu);
    reply_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

/* POST /tokenize: {"prompt": text} or {"messages": [...]}, as vLLM's. */
static void tokenize(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    char err[1024];
    bool add_special = true, add_gen = true;
    json_t *prompt = json_object_get(body, "prompt"), *msgs = json_object_get(body, "messages");
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n = 0;

    if (!fe->tok) {
        reply_error(req, 400, NULL, "this model has no tokenizer");
        return;
    }
    if (params_bool(body, "add_special_tokens", &add_special, err, sizeof(err)) < 0 ||
        params_bool(body, "add_generation_prompt", &add_gen, err, sizeof(err)) < 0) {
        reply_error(req, 400, NULL, "%s", err);
        return;
    }
    if (json_is_string(prompt)) {
        len = json_string_length(prompt);
        if (!fe_prompt_fits(fe, len, err, sizeof(err))) {
            reply_error(req, 400, "prompt", "%s", err);
            return;
        }
        text = strndup(json_string_value(prompt), len);
    } else if (json_is_array(msgs) && json_array_size(msgs) > 0) {
        if (!fe->has_chat) {
            reply_error(req, 400, "messages", "%s", fe->chat_error);
            return;
        }
        size_t k, cnt = json_array_size(msgs);
        json_t *m;
        struct lora_chat_message *cm = calloc(cnt, sizeof(*cm));
        int bad = cm ? 0 : -1;
        json_array_foreach (msgs, k, m) {
            json_t *r = json_object_get(m, "role"), *c = json_object_get(m, "content");
            if (!cm || !json_is_string(r) || !json_is_string(c)) {
                bad = -1;
                break;
            }
            cm[k] = (struct lora_chat_message){json_string_value(r), json_string_value(c)};
        }
        if (bad)
            snprintf(err, sizeof(err), "'messages' must be a list of {role, content} strings");
        else if (lora_chat_template_render(&fe->chat, cm, cnt, add_gen, &text, &len, err,
                                           sizeof(err)) < 0)
            bad = -1;
        free(cm);
        if (bad) {
            reply_error(req, 400, "messages", "%s", err);
            return;
        }
        if (!json_object_get(body, "add_special_tokens"))
            add_special = false; /* the template wrote them */
        if (!fe_prompt_fits(fe, len, err, sizeof(err))) {
            free(text);
            reply_error(req, 400, "messages", "%s", err);
            return;
        }
    } else {
        reply_error(req, 400, "prompt", "give 'prompt' (a string) or 'messages' (a list)");
        return;
    }
    if (!text ||
        lora_tokenizer_encode(fe->tok, text, len, add_special, &ids, &n, err, sizeof(err)) < 0) {
        free(text);
        reply_error(req, 400, "prompt", "%s", text ? err : "out of memory");
        return;
    }
    free(text);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    reply_json(req, 200,
               json_pack("{s:I, s:i, s:o, s:n}", "count", (json_int_t)n, "max_model_len",
                         fe_link_limits(&fe->link).max_model_len, "tokens", a, "token_strs"));
}

static void detokenize(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    json_t *toks = json_object_get(body, "tokens");
    char err[512];

    if (!fe->tok) {
        reply_error(req, 400, NULL, "this model has no tokenizer");
        return;
    }
    if (!json_is_array(toks)) {
        reply_error(req, 400, "tokens", "'tokens' must be a list of token ids");
        return;
    }
    size_t n = json_array_size(toks), i;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    json_t *v;
    if (!ids) {
        reply_error(req, 503, NULL, "out of memory");
        return;
    }
    json_array_foreach (toks, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= INT32_MAX) {
            free(ids);
            reply_error(req, 400, "tokens", "'tokens[%zu]' must be a token id", i);
            return;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *s = NULL;
    size_t len = 0;
    int rc = lora_tokenizer_decode(fe->tok, ids, n, false, &s, &len, err, sizeof(err));
    free(ids);
    if (rc < 0) {
        reply_error(req, 400, "tokens", "%s", err);
        return;
    }
    reply_json(req, 200, json_pack("{s:s%}", "prompt", s, len));
    free(s);
}

static void health(struct frontend *fe, struct lora_http_request *req)
{
    char err[512];
    pthread_mutex_lock(&fe->link.mu);
    bool up = fe->link.connected;
    pthread_mutex_unlock(&fe->link.mu);
    if (!up) {
        reply_error(req, 503, NULL, "the engine is not reachable");
        return;
    }
    if (link_control(&fe->link, LORA_CTL_HEALTH, NULL, NULL, 2000, NULL, NULL, err, sizeof(err)) <
        0) {
        reply_error(req, 503, NULL, "the engine is unhealthy: %s", err);
        return;
    }
    lora_http_respond(req, 200, "text/plain", "", 0);
}

struct route {
    const char *method, *path;
    void (*get)(struct frontend *fe, struct lora_http_request *req);
    void (*post)(struct frontend *fe, struct lora_http_request *req, json_t *body);
};

static void version(struct frontend *fe, struct lora_http_request *req)
{
    reply_json(req, 200, json_pack("{s:s}", "version", fe->version));
}

static void metrics(struct frontend *fe, struct lora_http_request *req)
{
    metrics_serve(&fe->metrics, req);
}

/* POST /v1/completions and /v1/chat/completions: the request (completions.c), answered whole
 * or streamed as server-sent events (sse.c). */
static void completions(struct frontend *fe, struct lora_http_request *req, json_t *body, bool chat)
{
    struct completion *g = completions_start(fe, req, body, chat);

    if (!g)
        return;
    if (g->p.stream)
        sse_respond(g, req);
    else
        completions_respond(g, req);
}

static void post_completions(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    completions(fe, req, body, false);
}

static void post_chat_completions(struct frontend *fe, struct lora_http_request *req, json_t *body)
{
    completions(fe, req, body, true);
}

static const struct route routes[] = {
    {"POST", "/v1/completions", NULL, post_completions},
    {"POST", "/v1/chat/completions", NULL, post_chat_completions},
    {"GET", "/v1/models", models, NULL},
    {"POST", "/v1/load_lora_adapter", NULL, adapters_load},
    {"POST", "/v1/unload_lora_adapter", NULL, adapters_unload},
    {"POST", "/tokenize", NULL, tokenize},
    {"POST", "/detokenize", NULL, detokenize},
    {"GET", "/health", health, NULL},
    {"GET", "/version", version, NULL},
    {"GET", "/metrics", metrics, NULL},
};

void routes_handle(void *ctx, struct lora_http_request *req)
{
    struct frontend *fe = ctx;
    const char *path = lora_http_path(req), *method = lora_http_method(req);
    bool path_known = false;

    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        const struct route *r = &routes[i];
        if (strcmp(path, r->path) != 0)
            continue;
        path_known = true;
        if (strcmp(method, r->method) != 0)
            continue;
        if (!authorized(fe, req))
            return;
        if (r->get) {
            r->get(fe, req);
            return;
        }
        json_t *body = json_body(req);
        if (body) {
            r->post(fe, req, body);
            json_decref(body);
        }
        return;
    }
    if (path_known) {
        reply_error(req, 405, NULL, "method %s is not allowed on %s", method, path);
        return;
    }
    if (!authorized(fe, req))
        return;
    reply_error(req, 404, NULL, "no such endpoint: %s %s", method, path);
}
