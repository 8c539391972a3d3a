/* lora-frontend: request fields, checked as vLLM's OpenAI server checks them. Absent and null
 * are the same (clients send null for "default"). Fields we do not know are ignored, as vLLM
 * ignores them; fields vLLM knows and we do not implement (penalties, best_of above n,
 * logit_bias, structured output, tools, beam search, suffix, bad words, logits processors,
 * priority, custom chat templates and their arguments, ...) are refused with 400 naming the
 * field unless they hold their neutral value, so a client never gets a silently different
 * answer. Sampling fields a request leaves out take the model's generation config defaults
 * (--generation-config), as vLLM's do. */
#include "params.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/errbuf.h"

int params_int(json_t *body, const char *key, long long lo, long long hi, long long *out,
               char *err, size_t err_len)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        lora_errf(err, err_len, "'%s' must be an integer", key);
        return -1;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        lora_errf(err, err_len, "'%s' must be between %lld and %lld, not %lld", key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

static int get_float(json_t *body, const char *key, double lo, double hi, float *out, char *err,
                     size_t err_len)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        lora_errf(err, err_len, "'%s' must be a number", key);
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        lora_errf(err, err_len, "'%s' must be between %g and %g, not %g", key, lo, hi, x);
        return -1;
    }
    *out = (float)x;
    return 0;
}

int params_bool(json_t *body, const char *key, bool *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        lora_errf(err, err_len, "'%s' must be true or false", key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int get_stop(json_t *body, struct gen_params *p, char *err, size_t err_len)
{
    json_t *v = json_object_get(body, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        p->stop[0] = json_string_value(v);
        p->n_stop = 1;
    } else if (json_is_array(v)) {
        if (json_array_size(v) > FE_MAX_STOP) {
            lora_errf(err, err_len, "'stop' holds at most %d strings", FE_MAX_STOP);
            return -1;
        }
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s)) {
                lora_errf(err, err_len, "'stop' must be a string or a list of strings");
                return -1;
            }
            p->stop[p->n_stop++] = json_string_value(s);
        }
    } else {
        lora_errf(err, err_len, "'stop' must be a string or a list of strings");
        return -1;
    }
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = strlen(p->stop[i]);
        if (n == 0 || n > FE_STOP_BYTES) {
            lora_errf(err, err_len, "each 'stop' string must be 1 to %d bytes", FE_STOP_BYTES);
            return -1;
        }
        if (n > p->max_stop_len)
            p->max_stop_len = n;
    }
    return 0;
}

static int get_stop_ids(json_t *body, struct gen_params *p, int vocab, char *err, size_t len)
{
    json_t *v = json_object_get(body, "stop_token_ids");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) > 15) {
        lora_errf(err, len, "'stop_token_ids' must be a list of at most 15 token ids");
        return -1;
    }
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab) {
            lora_errf(err, len, "'stop_token_ids' must hold token ids below %d", vocab);
            return -1;
        }
        p->stop_ids[p->n_stop_ids++] = (int32_t)json_integer_value(t);
    }
    return 0;
}

/* A boolean field that must hold its neutral value (or be absent or null). */
static int neutral_bool(json_t *body, const char *key, bool neutral, const char **param,
                        char *err, size_t len)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v) || (json_is_boolean(v) && json_is_true(v) == neutral))
        return 0;
    *param = key;
    lora_errf(err, len, "'%s' is not supported by this server (only %s)", key,
              neutral ? "true" : "false");
    return -1;
}

/* Fields we know and do not implement: refused unless neutral. */
static int unsupported(json_t *body, bool chat, const char **param, char *err, size_t len)
{
    static const struct {
        const char *key;
        double neutral;
    } nums[] = {{"presence_penalty", 0}, {"frequency_penalty", 0}, {"repetition_penalty", 1},
                {"min_p", 0}};
    /* Refused unless null (or an empty object or list). "lora" is llama-server's per-request
     * adapter list: here the adapter is named in "model". */
    static const char *const objs[] = {
        "logit_bias",         "tools",         "functions",      "guided_json",
        "guided_regex",       "guided_choice", "guided_grammar", "structural_tag",
        "structured_outputs", "lora",          "bad_words",      "logits_processors",
        "kv_transfer_params", "prompt_embeds",
        /* Chat only (a completion request's are unknown fields): a template of the request's
         * own, its arguments and documents for it. */
        "chat_template",      "chat_template_kwargs", "documents"};
    size_t n_objs = sizeof(objs) / sizeof(objs[0]) - (chat ? 0 : 3);

    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        json_t *v = json_object_get(body, nums[i].key);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_number(v) || json_number_value(v) != nums[i].neutral) {
            *param = nums[i].key;
            lora_errf(err, len, "'%s' is not supported by this server (only %g)", nums[i].key,
                      nums[i].neutral);
            return -1;
        }
    }
    for (size_t i = 0; i < n_objs; i++) {
        json_t *v = json_object_get(body, objs[i]);
        if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0) &&
            !(json_is_array(v) && json_array_size(v) == 0)) {
            *param = objs[i];
            lora_errf(err, len, "'%s' is not supported by this server", objs[i]);
            return -1;
        }
    }
    /* Booleans that would change the prompt or the text: continue_final_message and chat's
     * echo reshape the conversation, spaces_between_special_tokens false the detokenization. */
    if (neutral_bool(body, "spaces_between_special_tokens", true, param, err, len) < 0 ||
        (chat && neutral_bool(body, "continue_final_message", false, param, err, len) < 0) ||
        (chat && neutral_bool(body, "echo", false, param, err, len) < 0))
        return -1;
    /* vLLM refuses a priority without priority scheduling, which this server does not have. */
    json_t *v = json_object_get(body, "priority");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0)) {
        *param = "priority";
        lora_errf(err, len, "'priority' is not supported by this server (only 0)");
        return -1;
    }
    /* Refused unless null: vLLM refuses a suffix whatever it holds. */
    v = json_object_get(body, "suffix");
    if (v && !json_is_null(v)) {
        *param = "suffix";
        lora_errf(err, len, "'suffix' is not supported by this server");
        return -1;
    }
    v = json_object_get(body, "use_beam_search");
    if (v && !json_is_null(v) && !json_is_false(v)) {
        *param = "use_beam_search";
        lora_errf(err, len, "'use_beam_search' is not supported by this server (only false)");
        return -1;
    }
    /* Plain text is what we produce; any other format would need guided decoding. */
    v = json_object_get(body, "response_format");
    if (v && !json_is_null(v)) {
        json_t *type = json_object_get(v, "type");
        *param = "response_format";
        if (!json_is_object(v) || !json_is_string(type)) {
            lora_errf(err, len, "'response_format' must be an object with a 'type'");
            return -1;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            lora_errf(err, len, "'response_format' of type '%s' is not supported by this "
                                "server (only 'text')", json_string_value(type));
            return -1;
        }
    }
    /* Without tools, "none" and "auto" both mean a plain answer, and so does "required" with
     * an empty tools list (vLLM turns it into "none", as OpenAI does); anything else asks for
     * a tool call we cannot make. */
    v = json_object_get(body, "tool_choice");
    json_t *tools = json_object_get(body, "tools");
    const char *choice = json_is_string(v) ? json_string_value(v) : "";
    if (v && !json_is_null(v) && strcmp(choice, "none") != 0 && strcmp(choice, "auto") != 0 &&
        !(strcmp(choice, "required") == 0 && json_is_array(tools) &&
          json_array_size(tools) == 0)) {
        *param = "tool_choice";
        lora_errf(err, len, "'tool_choice' other than \"none\" or \"auto\" is not supported by "
                            "this server, which has no tool calling");
        return -1;
    }
    return 0;
}

/* allowed_token_ids: a non-empty list of token ids of the vocabulary, as vLLM requires. */
static int get_allowed(json_t *body, struct gen_params *p, int vocab, char *err, size_t len)
{
    json_t *v = json_object_get(body, "allowed_token_ids");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) == 0 ||
        json_array_size(v) > LORA_MSG_MAX_ALLOWED) {
        lora_errf(err, len, "'allowed_token_ids' must be a list of 1 to %d token ids",
                  LORA_MSG_MAX_ALLOWED);
        return -1;
    }
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab) {
            lora_errf(err, len, "'allowed_token_ids' must hold token ids from 0 to %d",
                      vocab - 1);
            return -1;
        }
        p->allowed[p->n_allowed++] = (int32_t)json_integer_value(t);
    }
    return 0;
}

void params_note_defaults(const struct frontend *fe)
{
    const struct lora_generation_config *g = &fe->gen;
    char buf[256] = "";
    size_t n = 0;

    if (!lora_generation_config_any(g))
        return;
    if (g->has_temperature)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, " temperature %g", g->temperature);
    if (g->has_top_p && n < sizeof(buf))
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, " top_p %g", g->top_p);
    if (g->has_top_k && n < sizeof(buf))
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, " top_k %d", g->top_k);
    if (g->has_max_tokens && n < sizeof(buf))
        snprintf(buf + n, sizeof(buf) - n, " max_tokens at most %d", g->max_tokens);
    fprintf(stderr, "lora-frontend: note: default sampling parameters from '%s':%s "
                    "(--generation-config vllm ignores them)\n", g->source, buf);
}

int params_parse(struct frontend *fe, json_t *body, bool chat, struct gen_params *p,
                 const char **param, char *err, size_t err_len)
{
    struct lora_msg_limits lim = fe_link_limits(&fe->link);
    long long v;
#define FIELD(name, call)                                                                         \
    do {                                                                                           \
        *param = name;                                                                             \
        if ((call) < 0)                                                                            \
            return -1;                                                                             \
    } while (0)

    memset(p, 0, sizeof(*p));
    p->chat = chat;
    p->max_tokens = chat ? -1 : 16; /* OpenAI's and vLLM's defaults */
    p->temperature = fe->gen.has_temperature ? (float)fe->gen.temperature : 1.0f;
    p->top_p = fe->gen.has_top_p ? (float)fe->gen.top_p : 1.0f;
    p->n = 1;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
    p->skip_special_tokens = true;

    json_t *m = json_object_get(body, "model");
    *param = "model";
    if (m && !json_is_null(m)) {
        if (!json_is_string(m) || !*json_string_value(m)) {
            lora_errf(err, err_len, "'model' must be a non-empty string");
            return -1;
        }
        p->model = json_string_value(m);
        if (strlen(p->model) > FE_NAME_MAX) {
            lora_errf(err, err_len, "'model' is longer than %d bytes", FE_NAME_MAX);
            return -1;
        }
        if (strcmp(p->model, fe->served_name) != 0)
            p->lora = p->model;
    } else {
        p->model = fe->served_name;
    }
    v = p->max_tokens;
    FIELD("max_tokens", params_int(body, "max_tokens", 1, INT32_MAX / 2, &v, err, err_len));
    if (chat) /* the newer name wins */
        FIELD("max_completion_tokens", params_int(body, "max_completion_tokens", 1,
                                                  INT32_MAX / 2, &v, err, err_len));
    p->max_tokens = (int)v;
    /* The generation config's max_new_tokens caps every request, as vLLM takes the smallest of
     * the request's, the context's and the config's. */
    if (fe->gen.has_max_tokens && (p->max_tokens < 0 || p->max_tokens > fe->gen.max_tokens))
        p->max_tokens = fe->gen.max_tokens;
    v = 0;
    FIELD("min_tokens", params_int(body, "min_tokens", 0, INT32_MAX / 2, &v, err, err_len));
    p->min_tokens = (int)v;
    if (p->max_tokens > 0 && p->min_tokens > p->max_tokens) {
        lora_errf(err, err_len, "'min_tokens' (%d) must not exceed 'max_tokens' (%d)",
                  p->min_tokens, p->max_tokens);
        return -1;
    }
    FIELD("temperature", get_float(body, "temperature", 0, 100, &p->temperature, err, err_len));
    FIELD("top_p", get_float(body, "top_p", 1e-9, 1, &p->top_p, err, err_len));
    v = fe->gen.has_top_k ? fe->gen.top_k : 0;
    FIELD("top_k", params_int(body, "top_k", -1, INT32_MAX, &v, err, err_len));
    p->top_k = v < 0 ? 0 : (int)v; /* -1 and 0 both mean off, as in vLLM */
    json_t *seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        FIELD("seed", params_int(body, "seed", INT64_MIN, INT64_MAX, &v, err, err_len));
        p->has_seed = true;
        p->seed = (uint64_t)v;
    }
    v = 1;
    FIELD("n", params_int(body, "n", 1, FE_MAX_N, &v, err, err_len));
    p->n = (int)v;
    v = p->n;
    FIELD("best_of", params_int(body, "best_of", 1, FE_MAX_N, &v, err, err_len));
    if (v != p->n) {
        lora_errf(err, err_len, "'best_of' other than 'n' is not supported by this server");
        return -1;
    }
    FIELD("stream", params_bool(body, "stream", &p->stream, err, err_len));
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        *param = "stream_options";
        if (!json_is_object(so)) {
            lora_errf(err, err_len, "'stream_options' must be an object");
            return -1;
        }
        if (!p->stream) {
            lora_errf(err, err_len, "'stream_options' needs 'stream': true");
            return -1;
        }
        FIELD("stream_options.include_usage",
              params_bool(so, "include_usage", &p->include_usage, err, err_len));
    }
    FIELD("ignore_eos", params_bool(body, "ignore_eos", &p->ignore_eos, err, err_len));
    FIELD("skip_special_tokens",
          params_bool(body, "skip_special_tokens", &p->skip_special_tokens, err, err_len));
    FIELD("return_token_ids",
          params_bool(body, "return_token_ids", &p->return_token_ids, err, err_len));
    if (chat) {
        bool want = false;
        FIELD("logprobs", params_bool(body, "logprobs", &want, err, err_len));
        v = 0;
        FIELD("top_logprobs",
              params_int(body, "top_logprobs", 0, FE_MAX_LOGPROBS, &v, err, err_len));
        if (v > 0 && !want) {
            lora_errf(err, err_len, "'top_logprobs' needs 'logprobs': true");
            return -1;
        }
        p->logprobs = want ? (int)v : -1;
    } else {
        v = -1;
        FIELD("logprobs", params_int(body, "logprobs", 0, FE_MAX_LOGPROBS, &v, err, err_len));
        p->logprobs = (int)v;
        FIELD("echo", params_bool(body, "echo", &p->echo, err, err_len));
    }
    FIELD("stop", get_stop(body, p, err, err_len));
    FIELD("stop_token_ids", get_stop_ids(body, p, lim.vocab_size, err, err_len));
    json_t *user = json_object_get(body, "user");
    *param = "user";
    if (user && !json_is_null(user)) {
        if (!json_is_string(user)) {
            lora_errf(err, err_len, "'user' must be a string");
            return -1;
        }
        p->user = json_string_value(user);
    }
    FIELD("include_stop_str_in_output",
          params_bool(body, "include_stop_str_in_output", &p->include_stop_str_in_output, err,
                      err_len));
    FIELD("return_tokens_as_token_ids",
          params_bool(body, "return_tokens_as_token_ids", &p->return_tokens_as_token_ids, err,
                      err_len));
    FIELD("allowed_token_ids", get_allowed(body, p, lim.vocab_size, err, err_len));
    /* -1 keeps as many tokens as the context holds, as in vLLM. */
    v = 0;
    FIELD("truncate_prompt_tokens", params_int(body, "truncate_prompt_tokens", -1,
                                               INT32_MAX, &v, err, err_len));
    if (v == 0 && json_is_integer(json_object_get(body, "truncate_prompt_tokens"))) {
        lora_errf(err, err_len, "'truncate_prompt_tokens' must be -1 or at least 1");
        return -1;
    }
    if (v < 0)
        v = lim.max_model_len;
    if (v > lim.max_model_len) {
        lora_errf(err, err_len,
                  "'truncate_prompt_tokens' (%lld) cannot be greater than the model's maximum "
                  "context length (%d)", v, lim.max_model_len);
        return -1;
    }
    p->truncate_prompt_tokens = (int)v;
    /* Each prompt token's log-probability, with the N most likely tokens of its position. */
    v = -1;
    FIELD("prompt_logprobs",
          params_int(body, "prompt_logprobs", 0, FE_MAX_LOGPROBS, &v, err, err_len));
    p->prompt_logprobs = (int)v;
    if (p->prompt_logprobs >= 0 && p->stream) {
        /* vLLM's stream chunks have no place for them (it refuses above 0, and drops 0). */
        lora_errf(err, err_len, "'prompt_logprobs' are not available when 'stream' is true");
        return -1;
    }
    *param = NULL;
    return unsupported(body, chat, param, err, err_len);
#undef FIELD
}
