/* lora-frontend: JSON responses and OpenAI-style errors, as vLLM's server writes them:
 * {"error":{"message","type","param","code"}} with the HTTP status in code. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

const char *reply_type_of(unsigned status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 401:
        return "AuthenticationError";
    case 404:
        return "NotFoundError";
    case 405:
        return "MethodNotAllowedError";
    case 413:
        return "RequestEntityTooLargeError";
    case 429:
        return "RateLimitError";
    case 503:
        return "ServiceUnavailableError";
    default:
        return "InternalServerError";
    }
}

void reply_json(struct lora_http_request *req, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"InternalServerError\",\"param\":null,\"code\":500}}";
        lora_http_respond(req, 500, "application/json", oom, sizeof(oom) - 1);
        return;
    }
    lora_http_respond(req, status, "application/json", s, strlen(s));
    free(s);
}

/* A JSON string of s; bytes of s that are not valid UTF-8 (a client's name echoed in a message)
 * become '?'. */
static json_t *safe_string(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return NULL;
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

void reply_error(struct lora_http_request *req, unsigned status, const char *param,
                 const char *fmt, ...)
{
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:{s:o, s:s, s:o, s:i}}", "error", "message", safe_string(msg),
                          "type", reply_type_of(status), "param",
                          param ? safe_string(param) : json_null(), "code", (int)status);
    if (status == 401)
        lora_http_add_header(req, "WWW-Authenticate", "Bearer");
    reply_json(req, status, e);
}

unsigned reply_status_of(const char *error_code)
{
    if (!error_code || !*error_code)
        return 500;
    if (strcmp(error_code, "not_found") == 0)
        return 404;
    if (strcmp(error_code, "invalid") == 0)
        return 400;
    return 503;
}

bool fe_prompt_fits(const struct frontend *fe, size_t len, char *err, size_t err_len)
{
    if (len <= fe->prompt_max_bytes)
        return true;
    snprintf(err, err_len,
             "the prompt text is %zu bytes, more than the %zu bytes any prompt that fits this "
             "model's maximum context length of %d tokens can have",
             len, fe->prompt_max_bytes, fe_link_limits(&fe->link).max_model_len);
    return false;
}
