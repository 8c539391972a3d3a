/* tokenizer_normalize: the normalizers of a tokenizer.json (see tokenizer_impl.h): Sequence,
 * NFC, NFD, NFKC, NFKD (utf8proc), Replace, Prepend, Strip and Lowercase, with Hugging Face's
 * semantics. Nested Sequences are flattened at load, so a loaded normalizer is one Sequence of
 * leaves applied in order. */
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/errbuf.h"

static void norm_free_inner(struct tk_norm *n)
{
    for (size_t i = 0; i < n->n_sub; i++)
        norm_free_inner(&n->sub[i]);
    free(n->sub);
    tk_pattern_free(&n->pat);
    free(n->text);
}

void tk_norm_free(struct tk_norm *n)
{
    if (!n)
        return;
    norm_free_inner(n);
    free(n);
}

static int parse_leaf(struct tk_ctx *c, const json_t *v, const char *type, struct tk_norm *n)
{
    static const char *const only_type[] = {"type", NULL};
    static const char *const replace[] = {"type", "pattern", "content", NULL};
    static const char *const prepend[] = {"type", "prepend", NULL};
    static const char *const strip[] = {"type", "strip_left", "strip_right", NULL};
    static const struct {
        const char *name;
        enum tk_norm_kind kind;
    } simple[] = {
        {"NFC", TK_NORM_NFC},
        {"NFD", TK_NORM_NFD},
        {"NFKC", TK_NORM_NFKC},
        {"NFKD", TK_NORM_NFKD},
        {"Lowercase", TK_NORM_LOWERCASE},
    };
    const char *s;
    size_t len;

    for (size_t i = 0; i < sizeof(simple) / sizeof(simple[0]); i++) {
        if (strcmp(type, simple[i].name) == 0) {
            n->kind = simple[i].kind;
            return tk_check_object(c, v, only_type);
        }
    }
    if (strcmp(type, "Replace") == 0) {
        n->kind = TK_NORM_REPLACE;
        if (tk_check_object(c, v, replace) < 0)
            return -1;
        if (!json_object_get(v, "pattern"))
            return tk_fail_key(c, "pattern", "is missing");
        size_t saved = tk_path_key(c, "pattern");
        if (tk_pattern_parse(c, json_object_get(v, "pattern"), &n->pat) < 0)
            return -1;
        tk_path_pop(c, saved);
        if (tk_get_str(c, v, "content", true, &s, &len) < 0)
            return -1;
    } else if (strcmp(type, "Prepend") == 0) {
        n->kind = TK_NORM_PREPEND;
        if (tk_check_object(c, v, prepend) < 0 || tk_get_str(c, v, "prepend", true, &s, &len) < 0)
            return -1;
    } else if (strcmp(type, "Strip") == 0) {
        n->kind = TK_NORM_STRIP;
        if (tk_check_object(c, v, strip) < 0)
            return -1;
        return tk_get_bool(c, v, "strip_left", true, &n->left) < 0 ||
                       tk_get_bool(c, v, "strip_right", true, &n->right) < 0
                   ? -1
                   : 0;
    } else {
        return tk_fail_key(c, "type", "unsupported '%s'", type);
    }
    n->text = tk_strdup(c, s, len);
    n->text_len = len;
    return n->text ? 0 : -1;
}

/* Appends the leaf v to the Sequence arg. */
static int add_leaf(struct tk_ctx *c, const json_t *v, const char *type, void *arg)
{
    struct tk_norm *seq = arg, *sub = tk_array_append(c, seq->sub, &seq->n_sub, sizeof(*sub));

    if (!sub)
        return -1;
    seq->sub = sub;
    return parse_leaf(c, v, type, &sub[seq->n_sub - 1]);
}

int tk_norm_parse(struct tk_ctx *c, const json_t *v, struct tk_norm **out)
{
    struct tk_norm *seq;

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    seq = calloc(1, sizeof(*seq));
    if (!seq)
        return tk_fail(c, "out of memory");
    seq->kind = TK_NORM_SEQUENCE;
    if (tk_parse_flat(c, v, "normalizers", add_leaf, seq) < 0) {
        tk_norm_free(seq);
        return -1;
    }
    *out = seq;
    return 0;
}

/* ---- applying ------------------------------------------------------------------------------ */

static int oom(char *err, size_t err_len)
{
    lora_errf(err, err_len, "out of memory");
    return -1;
}

/* Whether the Unicode normalization form is the identity on s: for NFC, text below U+0300
 * (every UTF-8 byte below 0xcc) is composed and has no combining marks; for the others, ASCII. */
static bool normal_already(enum tk_norm_kind kind, const char *s, size_t len)
{
    unsigned limit = kind == TK_NORM_NFC ? 0xcc : 0x80;

    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= limit)
            return false;
    return true;
}

static int unicode_form(enum tk_norm_kind kind, const char *s, size_t len, struct lora_buf *dst,
                        char *err, size_t err_len)
{
    utf8proc_option_t opt = UTF8PROC_STABLE;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t n;
    int rc;

    if (normal_already(kind, s, len))
        return lora_buf_add(dst, s, len) < 0 ? oom(err, err_len) : 0;
    opt |= kind == TK_NORM_NFC || kind == TK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (kind == TK_NORM_NFKC || kind == TK_NORM_NFKD)
        opt |= UTF8PROC_COMPAT;
    n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &res, opt);
    if (n < 0) {
        lora_errf(err, err_len, "unicode normalization failed: %s", utf8proc_errmsg(n));
        return -1;
    }
    rc = lora_buf_add(dst, res, (size_t)n);
    free(res);
    return rc < 0 ? oom(err, err_len) : 0;
}

/* Hugging Face replaces every match, an empty one by inserting the content there. */
static int replace(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *dst,
                   pcre2_match_data *md, char *err, size_t err_len)
{
    size_t at = 0, from = 0, ms, me;
    int rc;

    while ((rc = tk_pattern_next(&n->pat, s, len, from, md, &ms, &me, err, err_len)) == 1) {
        if (lora_buf_add(dst, s + at, ms - at) < 0 || lora_buf_add(dst, n->text, n->text_len) < 0)
            return oom(err, err_len);
        at = me;
        from = me;
        if (me == ms) {
            uint32_t cp;

            if (me == len)
                break;
            from = me + (size_t)tk_utf8_get(s + me, &cp);
        }
    }
    if (rc < 0)
        return -1;
    return lora_buf_add(dst, s + at, len - at) < 0 ? oom(err, err_len) : 0;
}

static int strip(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *dst)
{
    size_t start = 0, end = len;
    uint32_t cp;

    while (n->left && start < end) {
        int k = tk_utf8_get(s + start, &cp);

        if (!tk_is_whitespace(cp))
            break;
        start += (size_t)k;
    }
    while (n->right && end > start) {
        size_t k = end - 1;

        while (k > start && ((unsigned char)s[k] & 0xc0) == 0x80)
            k--;
        tk_utf8_get(s + k, &cp);
        if (!tk_is_whitespace(cp))
            break;
        end = k;
    }
    return lora_buf_add(dst, s + start, end - start);
}

/* Rust's char::to_lowercase, one character at a time (no final-sigma context, as Hugging Face
 * applies it). U+0130 is the one unconditional lowercase mapping to two characters. */
static int lowercase(const char *s, size_t len, struct lora_buf *dst)
{
    if (lora_buf_reserve(dst, len + 16) < 0)
        return -1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        char buf[4];
        int k = tk_utf8_get(s + i, &cp);

        i += (size_t)k;
        if (cp < 0x80) {
            buf[0] = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
            if (lora_buf_add(dst, buf, 1) < 0)
                return -1;
            continue;
        }
        if (cp == 0x130) {
            if (lora_buf_add(dst, "i\xcc\x87", 3) < 0)
                return -1;
            continue;
        }
        cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        if (lora_buf_add(dst, buf, (size_t)tk_utf8_put(cp, buf)) < 0)
            return -1;
    }
    return 0;
}

static int prepend(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *dst)
{
    if (len == 0) /* Hugging Face prepends to non-empty text only */
        return lora_buf_add(dst, "", 0);
    if (lora_buf_add(dst, n->text, n->text_len) < 0)
        return -1;
    return lora_buf_add(dst, s, len);
}

static int apply_leaf(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *dst,
                      pcre2_match_data *md, char *err, size_t err_len)
{
    int rc;

    dst->len = 0;
    switch (n->kind) {
    case TK_NORM_NFC:
    case TK_NORM_NFD:
    case TK_NORM_NFKC:
    case TK_NORM_NFKD:
        return unicode_form(n->kind, s, len, dst, err, err_len);
    case TK_NORM_REPLACE:
        return replace(n, s, len, dst, md, err, err_len);
    case TK_NORM_PREPEND:
        rc = prepend(n, s, len, dst);
        break;
    case TK_NORM_STRIP:
        rc = strip(n, s, len, dst);
        break;
    case TK_NORM_LOWERCASE:
        rc = lowercase(s, len, dst);
        break;
    default:
        rc = lora_buf_add(dst, s, len); /* TK_NORM_SEQUENCE never nests after parsing */
        break;
    }
    return rc < 0 ? oom(err, err_len) : 0;
}

int tk_norm_apply(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *out,
                  struct lora_buf *tmp, pcre2_match_data *md, char *err, size_t err_len)
{
    out->len = 0;
    if (n->n_sub == 0)
        return lora_buf_add(out, s, len) < 0 ? oom(err, err_len) : 0;
    /* Leaf i reads what leaf i - 1 wrote; the two buffers trade places after each. */
    for (size_t i = 0; i < n->n_sub; i++) {
        struct lora_buf swap;

        if (i == 0) {
            if (apply_leaf(&n->sub[0], s, len, out, md, err, err_len) < 0)
                return -1;
            continue;
        }
        swap = *tmp;
        *tmp = *out;
        *out = swap;
        if (apply_leaf(&n->sub[i], tmp->data, tmp->len, out, md, err, err_len) < 0)
            return -1;
    }
    return 0;
}
