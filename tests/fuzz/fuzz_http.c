/* fuzz_http: request bodies of every POST endpoint of lora-frontend, through its own routing and
 * parsing (routes_handle: JSON body, sampling parameters, prompts and chat messages, tokenize,
 * detokenize, adapter load and unload with the path confinement under a root).
 *
 * The frontend's objects are linked as they are, but for main.c and link.c: this file stands in
 * for the engine link (never connected: a request is refused at submission and a control
 * command fails at once, after everything before them has parsed the body) and for the HTTP
 * server's request accessors. Input: byte 0 picks the endpoint, the rest is the body. Every
 * request must get exactly one response. */
#include "fuzz.h"
#include "text/chat_template.h"
#include "cmd/lora-frontend/frontend.h"
#include "http/http.h"
#include "runtime/synthetic.h"
#include "text/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *const paths[] = {
    "/v1/completions", "/v1/chat/completions",  "/tokenize",
    "/detokenize",     "/v1/load_lora_adapter", "/v1/unload_lora_adapter"};
#define N_PATHS (sizeof(paths) / sizeof(paths[0]))

static struct frontend fe;
static char root[512];

/* ---- the request accessors of lib/http/http/http.c ---- */

struct lora_http_request {
    const char *method, *path;
    const char *body;
    size_t len;
    int n_responses;
    unsigned status;
};

const char *lora_http_method(const struct lora_http_request *r)
{
    return r->method;
}

const char *lora_http_path(const struct lora_http_request *r)
{
    return r->path;
}

const char *lora_http_header(const struct lora_http_request *r, const char *name)
{
    return NULL;
}

const char *lora_http_query(const struct lora_http_request *r, const char *name)
{
    return NULL;
}

const char *lora_http_body(const struct lora_http_request *r, size_t *len)
{
    *len = r->len;
    return r->body;
}

bool lora_http_client_gone(const struct lora_http_request *r)
{
    return false;
}

int lora_http_respond(struct lora_http_request *r, unsigned status, const char *content_type,
                      const void *body, size_t len)
{
    r->n_responses++;
    r->status = status;
    return 0;
}

int lora_http_add_header(struct lora_http_request *r, const char *name, const char *value)
{
    return 0;
}

int lora_http_respond_stream(struct lora_http_request *r, unsigned status, const char *content_type,
                             lora_http_stream_read read, lora_http_stream_done done, void *ctx)
{
    r->n_responses++;
    r->status = status;
    done(ctx, false);
    return 0;
}

/* ---- the engine link of cmd/lora-frontend/link.c, never connected ---- */

void link_forget(struct fe_link *l, struct fe_seq **seq)
{
    if (*seq)
        seq_free(*seq);
    *seq = NULL;
}

int link_submit(struct fe_link *l, struct fe_seq *seq, const struct lora_msg_request *m,
                int max_pending, char *err, size_t err_len)
{
    snprintf(err, err_len, "the engine is not reachable");
    return -1;
}

void link_wait_locked(struct fe_link *l, pthread_cond_t *cond, int timeout_ms)
{
}

int link_control(struct fe_link *l, enum lora_control_op op, const char *name, const char *path,
                 int timeout_ms, char **data, size_t *data_len, char *err, size_t err_len)
{
    if (data)
        *data = NULL;
    snprintf(err, err_len, "the engine did not answer within %d ms", timeout_ms);
    return -1;
}

void link_publish(struct fe_link *l, const char *topic, const void *body, size_t len)
{
}

bool link_registry_has_locked(struct fe_link *l, const char *name)
{
    return false;
}

bool link_registry_wait(struct fe_link *l, const char *name, bool present, int timeout_ms)
{
    return false;
}

struct lora_msg_limits fe_link_limits(const struct fe_link *l)
{
    return l->limits; /* one thread here: no lock to take */
}

void fe_link_model(const struct fe_link *l, char *buf, size_t len)
{
    snprintf(buf, len, "%s", l->model);
}

/* ---- the target ---- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct lora_synthetic_model_opts o;
    char err[512], path[512];

    lora_synthetic_model_defaults(&o);
    snprintf(path, sizeof(path), "%s/model", fuzz_dir());
    if (lora_synthetic_model_write(path, &o, err, sizeof(err)) < 0)
        goto fail;
    snprintf(path, sizeof(path), "%s/model/tokenizer.json", fuzz_dir());
    if (!(fe.tok = lora_tokenizer_load(path, err, sizeof(err))))
        goto fail;
    if (lora_chat_template_by_name("llama3", &fe.chat, err, sizeof(err)) < 0)
        goto fail;
    /* an adapter root with one directory in it, so that some paths resolve */
    snprintf(root, sizeof(root), "%s/root", fuzz_dir());
    snprintf(path, sizeof(path), "%s/root/a", fuzz_dir());
    if (mkdir(root, 0700) < 0 || mkdir(path, 0700) < 0) {
        snprintf(err, sizeof(err), "mkdir: %s", strerror(errno));
        goto fail;
    }
    fe.served_name = "model";
    fe.model_dir = "model";
    fe.lora_root = root;
    fe.runtime_lora = true;
    fe.max_pending = 64;
    fe.version = "0";
    fe.has_chat = true;
    snprintf(fe.bos, sizeof(fe.bos), "<s>");
    snprintf(fe.eos, sizeof(fe.eos), "</s>");
    fe.eos_id = lora_tokenizer_token_id(fe.tok, "</s>");
    pthread_mutex_init(&fe.link.mu, NULL);
    pthread_cond_init(&fe.link.registry_cond, NULL);
    fe.link.limits.max_model_len = 4096;
    fe.link.limits.vocab_size = (int)lora_tokenizer_vocab_size(fe.tok);
    if (metrics_init(&fe.metrics, false, err, sizeof(err)) < 0)
        goto fail;
    fe.link.metrics = &fe.metrics;
    return 0;
fail:
    fprintf(stderr, "fuzz_http: %s\n", err);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *body = fuzz_strndup(data + 1, size - 1);
    struct lora_http_request r = {
        .method = "POST", .path = paths[data[0] % N_PATHS], .body = body, .len = size - 1};

    routes_handle(&fe, &r);
    if (r.n_responses != 1) {
        fprintf(stderr, "fuzz_http: %s: %d responses\n", r.path, r.n_responses);
        abort();
    }
    free(body);
    return 0;
}
