/* tokenizer_pattern: the patterns of the Split pre-tokenizer and the Replace normalizer and
 * decoder: a literal string, or a regex run by PCRE2 (see tokenizer_impl.h).
 *
 * Hugging Face runs these regexes with Oniguruma in its Ruby syntax. PCRE2 with PCRE2_UTF and
 * PCRE2_UCP reads the constructs tokenizer files use the same way (\p{L}, \p{N}, \s, (?i:...),
 * lookahead); PCRE2_MULTILINE gives ^ and $ Ruby's meaning (they match at line breaks). The
 * compiled code is shared by all threads; match data belongs to each call.
 */
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"

int tk_regex_compile(struct tk_ctx *c, const char *re, size_t len, pcre2_code **out)
{
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    PCRE2_SIZE at;
    int code;
    pcre2_code *rx = pcre2_compile((PCRE2_SPTR)re, len, opts, &code, &at, NULL);

    if (!rx) {
        PCRE2_UCHAR msg[256];

        pcre2_get_error_message(code, msg, sizeof(msg));
        return tk_fail(c, "invalid regex at offset %zu: %s", (size_t)at, (const char *)msg);
    }
    /* Without JIT (an unsupported CPU, or no executable memory) the interpreter runs it. */
    pcre2_jit_compile(rx, PCRE2_JIT_COMPLETE);
    *out = rx;
    return 0;
}

int tk_pattern_parse(struct tk_ctx *c, const json_t *v, struct tk_pattern *p)
{
    static const char *const keys[] = {"String", "Regex", NULL};
    json_t *lit, *re;

    memset(p, 0, sizeof(*p));
    if (tk_check_object(c, v, keys) < 0)
        return -1;
    lit = json_object_get(v, "String");
    re = json_object_get(v, "Regex");
    if ((lit != NULL) == (re != NULL))
        return tk_fail(c, "must hold exactly one of \"String\" and \"Regex\"");
    if (lit) {
        if (!json_is_string(lit))
            return tk_fail_key(c, "String", "must be a string");
        p->lit_len = json_string_length(lit);
        p->lit = tk_strdup(c, json_string_value(lit), p->lit_len);
        return p->lit ? 0 : -1;
    }
    if (!json_is_string(re))
        return tk_fail_key(c, "Regex", "must be a string");
    size_t saved = tk_path_key(c, "Regex");
    int rc = tk_regex_compile(c, json_string_value(re), json_string_length(re), &p->re);

    tk_path_pop(c, saved);
    return rc;
}

void tk_pattern_free(struct tk_pattern *p)
{
    free(p->lit);
    pcre2_code_free(p->re);
    memset(p, 0, sizeof(*p));
}

pcre2_match_data *tk_match_data_new(void)
{
    return pcre2_match_data_create(1, NULL);
}

int tk_pattern_next(const struct tk_pattern *p, const char *s, size_t len, size_t from,
                    pcre2_match_data *md, size_t *ms, size_t *me, char *err, size_t err_len)
{
    uint32_t opts = PCRE2_NO_UTF_CHECK; /* callers pass text already checked */
    PCRE2_SIZE *ov;
    int rc;

    if (from > len)
        return 0;
    if (!p->re) {
        const char *hit = s + from, *end = s + len;

        if (p->lit_len == 0)
            return 0;
        /* Tokens are short: memchr and a compare beat memmem's set-up. */
        for (;; hit++) {
            hit = memchr(hit, p->lit[0], (size_t)(end - hit));
            if (!hit || (size_t)(end - hit) < p->lit_len)
                return 0;
            if (memcmp(hit, p->lit, p->lit_len) == 0)
                break;
        }
        *ms = (size_t)(hit - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, from, opts, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
        rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, from, opts | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];

        pcre2_get_error_message(rc, msg, sizeof(msg));
        lora_errf(err, err_len, "regex match failed: %s", (const char *)msg);
        return -1;
    }
    /* rc == 0: the one-pair ovector cannot hold the groups, but the whole match is there. */
    ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1] < ov[0] ? ov[0] : ov[1]; /* \K can put the start after the end */
    return 1;
}
