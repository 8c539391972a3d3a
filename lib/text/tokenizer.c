/* tokenizer: loading a tokenizer.json, added tokens, post-processors, encoding and lookups
 * (see tokenizer.h; the other stages live in tokenizer_*.c, listed in tokenizer_impl.h).
 *
 * Encoding, as Hugging Face's TokenizerImpl::encode does it:
 *   1. added tokens whose "normalized" is false are cut out of the raw text (leftmost-longest,
 *      then single_word / lstrip / rstrip), leaving text segments between them;
 *   2. each segment is normalized, and added tokens whose "normalized" is true are cut out of
 *      the normalized text (their content normalized the same way at load);
 *   3. what is left is pre-tokenized, and each piece is merged by BPE;
 *   4. with add_special_tokens, the post-processor adds its tokens.
 */
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"
#include "base/json_file.h"

/* ---- added tokens -------------------------------------------------------------------------- */

static int32_t trie_new_node(struct tk_trie *tr, unsigned char byte)
{
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 256;
        struct tk_trie_node *v = realloc(tr->node, cap * sizeof(*v));

        if (!v)
            return -1;
        tr->node = v;
        tr->cap = cap;
    }
    tr->node[tr->n] = (struct tk_trie_node){.child = -1, .sibling = -1, .tok = -1, .byte = byte};
    return (int32_t)tr->n++;
}

/* Adds s (n > 0) as token tok; *existing is the token that already ended there, or -1. */
static int trie_insert(struct tk_trie *tr, const char *s, size_t n, int32_t tok, int32_t *existing)
{
    int32_t node = -1; /* -1: the root, whose children are root[byte] */

    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t next = node < 0 ? tr->root[b] : tr->node[node].child;

        while (next >= 0 && tr->node[next].byte != b)
            next = tr->node[next].sibling;
        if (next < 0) {
            next = trie_new_node(tr, b);
            if (next < 0)
                return -1;
            if (node < 0) {
                tr->root[b] = next;
            } else {
                tr->node[next].sibling = tr->node[node].child;
                tr->node[node].child = next;
            }
        }
        node = next;
    }
    *existing = tr->node[node].tok;
    if (*existing < 0)
        tr->node[node].tok = tok;
    return 0;
}

/* The leftmost match in s[from, n), the longest one there (Aho-Corasick's LeftmostLongest). */
static bool trie_find(const struct tk_trie *tr, const char *s, size_t n, size_t from, size_t *ms,
                      size_t *me, int32_t *tok)
{
    for (size_t i = from; i < n; i++) {
        int32_t node = tr->root[(unsigned char)s[i]], best = -1;
        size_t j = i, best_end = 0;

        while (node >= 0) {
            j++;
            if (tr->node[node].tok >= 0) {
                best = tr->node[node].tok;
                best_end = j;
            }
            if (j == n)
                break;
            node = tr->node[node].child;
            while (node >= 0 && tr->node[node].byte != (unsigned char)s[j])
                node = tr->node[node].sibling;
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *tok = best;
            return true;
        }
    }
    return false;
}

/* The code point that ends s[0, n) (n > 0, valid UTF-8). */
static uint32_t last_char(const char *s, size_t n, size_t *start)
{
    uint32_t cp;
    size_t i = n - 1;

    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
        i--;
    tk_utf8_get(s + i, &cp);
    *start = i;
    return cp;
}

/* Where the whitespace that ends s[0, n) begins. */
static size_t trailing_space_start(const char *s, size_t n)
{
    size_t at;

    while (n > 0 && tk_is_whitespace(last_char(s, n, &at)))
        n = at;
    return n;
}

/* The length of the whitespace that begins s[0, n). */
static size_t leading_space_len(const char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint32_t cp;
        int k = tk_utf8_get(s + i, &cp);

        if (!tk_is_whitespace(cp))
            break;
        i += (size_t)k;
    }
    return i;
}

/* Whether added token a, found at [ms, me) of s, counts: a single_word token must not touch a
 * word character on either side. */
static bool single_word_ok(const struct tk_added *a, const char *s, size_t n, size_t ms, size_t me)
{
    uint32_t cp;
    size_t at;

    if (!a->single_word)
        return true;
    if (ms > 0 && tk_is_word_char(last_char(s, ms, &at)))
        return false;
    if (me < n) {
        tk_utf8_get(s + me, &cp);
        if (tk_is_word_char(cp))
            return false;
    }
    return true;
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* One encode call's state and scratch. */
struct enc {
    const struct lora_tokenizer *t;
    struct tk_ids ids;
    struct lora_buf norm, norm_tmp;
    struct tk_pieces pieces;
    struct tk_pre_scratch pre;
    struct tk_bpe_scratch bpe;
    pcre2_match_data *md;
    char *err;
    size_t err_len;
};

typedef int (*segment_fn)(struct enc *e, const char *s, size_t n, bool at_origin);

static int enc_oom(struct enc *e)
{
    lora_errf(e->err, e->err_len, "out of memory");
    return -1;
}

/* Cuts s into the added tokens of tr (appended to the ids) and the text between them (given to
 * text()), as Hugging Face's AddedVocabulary::find_matches does. A match that single_word
 * discards is skipped whole; the search goes on after each match, lstrip and rstrip only widen
 * what the token takes. */
static int split_added(struct enc *e, const struct tk_trie *tr, const char *s, size_t n,
                       bool at_origin, segment_fn text)
{
    size_t done = 0, from = 0, ms, me;
    int32_t tok;

    while (trie_find(tr, s, n, from, &ms, &me, &tok)) {
        const struct tk_added *a = &e->t->added[tok];
        size_t start = ms, stop = me;

        from = me;
        if (!single_word_ok(a, s, n, ms, me))
            continue;
        if (a->lstrip) {
            start = trailing_space_start(s, ms);
            start = start > done ? start : done;
        }
        if (a->rstrip)
            stop += leading_space_len(s + me, n - me);
        if (start > done && text(e, s + done, start - done, at_origin && done == 0) < 0)
            return -1;
        if (tk_ids_add(&e->ids, a->id) < 0)
            return enc_oom(e);
        done = from = stop;
    }
    if (n > done)
        return text(e, s + done, n - done, at_origin && done == 0);
    return 0;
}

/* Pre-tokenizes normalized text and merges each piece. */
static int encode_pieces(struct enc *e, const char *s, size_t n, bool at_origin)
{
    const struct lora_tokenizer *t = e->t;

    e->pieces.n = 0;
    e->pieces.text.len = 0;
    if (tk_pieces_add(&e->pieces, s, n, at_origin) < 0)
        return enc_oom(e);
    if (t->pre && tk_pre_apply(t->pre, &e->pieces, &e->pre, e->md, e->err, e->err_len) < 0)
        return -1;
    for (size_t i = 0; i < e->pieces.n; i++) {
        const struct tk_piece *p = &e->pieces.v[i];

        if (tk_bpe_encode(t, e->pieces.text.data + p->off, p->len, &e->ids, &e->bpe) < 0)
            return enc_oom(e);
    }
    return 0;
}

/* A segment of raw text between added tokens: normalized, then cut by normalized tokens. */
static int encode_segment(struct enc *e, const char *s, size_t n, bool at_origin)
{
    const struct lora_tokenizer *t = e->t;

    if (t->norm) {
        if (tk_norm_apply(t->norm, s, n, &e->norm, &e->norm_tmp, e->md, e->err, e->err_len) < 0)
            return -1;
        s = e->norm.data;
        n = e->norm.len;
    }
    if (n == 0)
        return 0;
    if (t->trie_norm.n == 0)
        return encode_pieces(e, s, n, at_origin);
    return split_added(e, &t->trie_norm, s, n, at_origin, encode_pieces);
}

/* Applies the post-processor to e->ids (add_special_tokens only). */
static int post_process(struct enc *e, const struct tk_post *p)
{
    struct tk_ids out = {0};

    switch (p->kind) {
    case TK_POST_SEQUENCE:
        for (size_t i = 0; i < p->n_sub; i++)
            if (post_process(e, &p->sub[i]) < 0)
                return -1;
        return 0;
    case TK_POST_BYTE_LEVEL:
        return 0; /* it only trims offsets */
    case TK_POST_TEMPLATE:
        for (size_t i = 0; i < p->n_single; i++) {
            if (p->single[i] != TK_TEMPLATE_SEQ) {
                if (tk_ids_add(&out, p->single[i]) < 0)
                    goto oom;
                continue;
            }
            for (size_t j = 0; j < e->ids.n; j++)
                if (tk_ids_add(&out, e->ids.v[j]) < 0)
                    goto oom;
        }
        tk_ids_free(&e->ids);
        e->ids = out;
        return 0;
    }
    return 0;
oom:
    tk_ids_free(&out);
    return enc_oom(e);
}

static void enc_release(struct enc *e)
{
    tk_ids_free(&e->ids);
    lora_buf_release(&e->norm);
    lora_buf_release(&e->norm_tmp);
    tk_pieces_free(&e->pieces);
    tk_pre_scratch_free(&e->pre);
    tk_bpe_scratch_free(&e->bpe);
    pcre2_match_data_free(e->md);
}

int lora_tokenizer_encode(const struct lora_tokenizer *t, const char *text, size_t len,
                          bool add_special_tokens, int32_t **ids, size_t *n_ids, char *err,
                          size_t err_len)
{
    struct enc e = {.t = t, .err = err, .err_len = err_len};
    size_t valid = len > TK_MAX_TEXT ? 0 : tk_utf8_check(text, len);
    int rc = -1;

    *ids = NULL;
    *n_ids = 0;
    if (len > TK_MAX_TEXT) { /* symbol and piece indexes are 32-bit */
        lora_errf(err, err_len, "text is %zu bytes, more than %d", len, TK_MAX_TEXT);
        return -1;
    }
    if (valid != len) {
        lora_errf(err, err_len, "text is not valid UTF-8 at byte %zu", valid);
        return -1;
    }
    e.md = tk_match_data_new();
    if (!e.md) {
        enc_oom(&e);
        goto out;
    }
    if (split_added(&e, &t->trie_raw, text, len, true, encode_segment) < 0)
        goto out;
    if (add_special_tokens && t->post && post_process(&e, t->post) < 0)
        goto out;
    if (!e.ids.v) { /* an empty result is still an array */
        if (tk_ids_add(&e.ids, 0) < 0) {
            enc_oom(&e);
            goto out;
        }
        e.ids.n = 0;
    }
    *ids = e.ids.v;
    *n_ids = e.ids.n;
    e.ids = (struct tk_ids){0};
    rc = 0;
out:
    enc_release(&e);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------------- */

static int parse_added_one(struct tk_ctx *c, const json_t *v, struct tk_added *a,
                           const char **content, size_t *len)
{
    static const char *const keys[] = {"id",     "content",    "single_word", "lstrip",
                                       "rstrip", "normalized", "special",     NULL};
    long long id;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "id"))
        return tk_fail_key(c, "id", "is missing");
    if (tk_get_int(c, v, "id", 0, TK_MAX_ID, 0, &id) < 0 ||
        tk_get_str(c, v, "content", true, content, len) < 0 ||
        tk_get_bool(c, v, "single_word", false, &a->single_word) < 0 ||
        tk_get_bool(c, v, "lstrip", false, &a->lstrip) < 0 ||
        tk_get_bool(c, v, "rstrip", false, &a->rstrip) < 0 ||
        tk_get_bool(c, v, "normalized", true, &a->normalized) < 0 ||
        tk_get_bool(c, v, "special", false, &a->special) < 0)
        return -1;
    if (*len == 0)
        return tk_fail_key(c, "content", "must not be empty");
    a->id = (int32_t)id;
    return 0;
}

/* Reads "added_tokens" into t->added (ids only; the strings go in with place_added). */
static int parse_added(struct tk_ctx *c, const json_t *arr, struct lora_tokenizer *t,
                       int32_t *max_id)
{
    size_t saved = tk_path_key(c, "added_tokens"), i;
    json_t *v;

    *max_id = -1;
    if (!arr || json_is_null(arr)) {
        tk_path_pop(c, saved);
        return 0;
    }
    if (!json_is_array(arr))
        return tk_fail(c, "must be an array");
    t->added = calloc(json_array_size(arr) + 1, sizeof(*t->added));
    if (!t->added)
        return tk_fail(c, "out of memory");
    json_array_foreach (arr, i, v) {
        size_t at = tk_path_index(c, i), len;
        const char *content;

        if (parse_added_one(c, v, &t->added[i], &content, &len) < 0)
            return -1;
        if (t->added[i].id > *max_id)
            *max_id = t->added[i].id;
        t->n_added++;
        tk_path_pop(c, at);
    }
    tk_path_pop(c, saved);
    return 0;
}

/* The id Hugging Face gives an added token that is not in the model's vocabulary: it ignores
 * the file's "id" and numbers such tokens in order after the vocabulary (AddedVocabulary::
 * add_tokens), so a file that says otherwise would tokenize differently there. */
static int32_t hf_next_id(const struct lora_tokenizer *t, size_t n_placed)
{
    int32_t n_model = (int32_t)t->vocab.n_model, max = -1;

    for (size_t i = 0; i < n_placed; i++)
        max = t->added[i].id > max ? t->added[i].id : max;
    return max >= n_model ? max + 1 : n_model;
}

/* Gives the added tokens their strings in the vocabulary, after checking they agree with it:
 * an added token may repeat a model token (same id, same string) but not contradict one, and
 * the others must have the ids Hugging Face gives them. */
static int place_added(struct tk_ctx *c, const json_t *arr, struct lora_tokenizer *t)
{
    struct tk_vocab *v = &t->vocab;
    size_t saved = tk_path_key(c, "added_tokens");

    t->special = calloc(v->n_ids ? v->n_ids : 1, 1);
    if (!t->special)
        return tk_fail(c, "out of memory");
    for (size_t i = 0; i < t->n_added; i++) {
        json_t *jc = json_object_get(json_array_get(arr, i), "content");
        const char *s = json_string_value(jc);
        size_t len = json_string_length(jc), at = tk_path_index(c, i);
        const struct tk_added *a = &t->added[i];
        int32_t model_id = tk_vocab_find(v, s, len), existing, want;

        if (model_id >= 0 && model_id != a->id)
            return tk_fail(c, "'%s' is id %d in the vocabulary, not %d", s, model_id, a->id);
        if (trie_insert(&t->trie_raw, s, len, (int32_t)i, &existing) < 0)
            return tk_fail(c, "out of memory");
        if (existing >= 0)
            return tk_fail(c, "'%s' is also added_tokens[%d]", s, existing);
        if (model_id < 0 && tk_vocab_has(v, a->id))
            return tk_fail(c, "id %d is already '%s'", a->id, v->pool + v->off[a->id]);
        if (model_id < 0 && a->id != (want = hf_next_id(t, i)))
            return tk_fail(c,
                           "'%s' has id %d, but Hugging Face numbers added tokens after the "
                           "vocabulary in order and gives it %d",
                           s, a->id, want);
        if (model_id < 0 && tk_vocab_set(v, a->id, s, len, false) < 0)
            return tk_fail(c, "out of memory");
        t->special[a->id] = a->special;
        tk_path_pop(c, at);
    }
    tk_path_pop(c, saved);
    return 0;
}

/* The tries: each added token goes in the raw one or, normalized, in the normalized one. The
 * trie that place_added filled to find duplicates is rebuilt to hold only the first kind. */
static int build_tries(struct tk_ctx *c, struct lora_tokenizer *t)
{
    struct lora_buf norm = {0}, tmp = {0};
    pcre2_match_data *md = tk_match_data_new();
    int rc = -1;

    free(t->trie_raw.node);
    memset(&t->trie_raw, 0, sizeof(t->trie_raw));
    memset(t->trie_raw.root, 0xff, sizeof(t->trie_raw.root));
    if (!md)
        goto oom;
    for (size_t i = 0; i < t->n_added; i++) {
        const struct tk_added *a = &t->added[i];
        const char *s = t->vocab.pool + t->vocab.off[a->id];
        size_t len = t->vocab.len[a->id];
        struct tk_trie *tr = &t->trie_raw;
        int32_t existing;

        /* Normalized tokens go in their own trie even without a normalizer: Hugging Face
         * matches them in a second pass, after the raw tokens. */
        if (a->normalized)
            tr = &t->trie_norm;
        if (a->normalized && t->norm) {
            if (tk_norm_apply(t->norm, s, len, &norm, &tmp, md, c->err, c->err_len) < 0)
                goto out;
            s = norm.data;
            len = norm.len;
            if (len == 0) {
                size_t at = tk_path_index(c, i);

                tk_fail(c, "'%s' normalizes to nothing", t->vocab.pool + t->vocab.off[a->id]);
                tk_path_pop(c, at);
                goto out;
            }
        }
        if (trie_insert(tr, s, len, (int32_t)i, &existing) < 0)
            goto oom;
    }
    rc = 0;
    goto out;
oom:
    tk_fail(c, "out of memory");
out:
    lora_buf_release(&norm);
    lora_buf_release(&tmp);
    pcre2_match_data_free(md);
    return rc;
}

/* ---- post-processors ----------------------------------------------------------------------- */

static void post_free_inner(struct tk_post *p)
{
    for (size_t i = 0; i < p->n_sub; i++)
        post_free_inner(&p->sub[i]);
    free(p->sub);
    free(p->single);
}

/* The ids of special token name in a TemplateProcessing's special_tokens. */
static int template_special(struct tk_ctx *c, const json_t *specials, const char *name,
                            const struct lora_tokenizer *t, struct tk_ids *out)
{
    json_t *sp = json_object_get(specials, name), *ids, *id;
    size_t i;

    if (!json_is_object(sp))
        return tk_fail(c, "'%s' is not in special_tokens", name);
    ids = json_object_get(sp, "ids");
    if (!json_is_array(ids))
        return tk_fail(c, "special_tokens['%s'].ids must be an array", name);
    json_array_foreach (ids, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > TK_MAX_ID ||
            !tk_vocab_has(&t->vocab, (int32_t)json_integer_value(id)))
            return tk_fail(c, "special_tokens['%s'].ids[%zu] is not an id of the vocabulary", name,
                           i);
        if (tk_ids_add(out, (int32_t)json_integer_value(id)) < 0)
            return tk_fail(c, "out of memory");
    }
    return 0;
}

/* One piece of a template: {"SpecialToken": {"id": name, "type_id": n}} or
 * {"Sequence": {"id": "A" or "B", "type_id": n}}. single allows only "A". */
static int template_piece(struct tk_ctx *c, const json_t *v, const json_t *specials, bool single,
                          const struct lora_tokenizer *t, struct tk_ids *out)
{
    static const char *const outer[] = {"SpecialToken", "Sequence", NULL};
    static const char *const inner[] = {"id", "type_id", NULL};
    json_t *sp = json_object_get(v, "SpecialToken"), *seq = json_object_get(v, "Sequence");
    json_t *in = sp ? sp : seq;
    const char *id;
    size_t len, saved;
    long long type_id;

    if (tk_check_object(c, v, outer) < 0)
        return -1;
    if (json_object_size(v) != 1)
        return tk_fail(c, "must hold one of \"SpecialToken\" and \"Sequence\"");
    saved = tk_path_key(c, sp ? "SpecialToken" : "Sequence");
    if (tk_check_object(c, in, inner) < 0 || tk_get_str(c, in, "id", true, &id, &len) < 0 ||
        tk_get_int(c, in, "type_id", 0, 1 << 20, 0, &type_id) < 0) /* type ids are not kept */
        return -1;
    tk_path_pop(c, saved);
    if (sp)
        return template_special(c, specials, id, t, out);
    if (strcmp(id, "A") != 0 && (single || strcmp(id, "B") != 0))
        return tk_fail(c, "unsupported sequence '%s'", id);
    return tk_ids_add(out, TK_TEMPLATE_SEQ) < 0 ? tk_fail(c, "out of memory") : 0;
}

static int parse_template(struct tk_ctx *c, const json_t *v, const struct lora_tokenizer *t,
                          struct tk_post *p)
{
    static const char *const keys[] = {"type", "single", "pair", "special_tokens", NULL};
    const json_t *specials = json_object_get(v, "special_tokens");
    static const char *const which[] = {"single", "pair"};
    struct tk_ids pair = {0};

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (specials && !json_is_object(specials))
        return tk_fail_key(c, "special_tokens", "must be an object");
    for (int w = 0; w < 2; w++) {
        json_t *arr = json_object_get(v, which[w]), *item;
        struct tk_ids out = {0};
        size_t saved = tk_path_key(c, which[w]), i;

        if (!json_is_array(arr)) {
            tk_fail(c, arr ? "must be an array" : "is missing");
            return -1;
        }
        json_array_foreach (arr, i, item) {
            size_t at = tk_path_index(c, i);

            if (template_piece(c, item, specials, w == 0, t, &out) < 0) {
                tk_ids_free(&out);
                return -1;
            }
            tk_path_pop(c, at);
        }
        tk_path_pop(c, saved);
        if (w == 0) {
            p->single = out.v;
            p->n_single = out.n;
        } else {
            pair = out; /* checked only: this module encodes single sequences */
            tk_ids_free(&pair);
        }
    }
    return 0;
}

static int parse_post_into(struct tk_ctx *c, const json_t *v, const struct lora_tokenizer *t,
                           struct tk_post *p);

static int parse_post_sequence(struct tk_ctx *c, const json_t *v, const struct lora_tokenizer *t,
                               struct tk_post *p)
{
    static const char *const keys[] = {"type", "processors", NULL};
    json_t *arr = json_object_get(v, "processors"), *item;
    size_t i, saved;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_is_array(arr))
        return tk_fail_key(c, "processors", arr ? "must be an array" : "is missing");
    p->sub = calloc(json_array_size(arr) + 1, sizeof(*p->sub));
    if (!p->sub)
        return tk_fail(c, "out of memory");
    saved = tk_path_key(c, "processors");
    json_array_foreach (arr, i, item) {
        size_t at = tk_path_index(c, i);

        p->n_sub++;
        if (parse_post_into(c, item, t, &p->sub[i]) < 0)
            return -1;
        tk_path_pop(c, at);
    }
    tk_path_pop(c, saved);
    return 0;
}

static int parse_post_into(struct tk_ctx *c, const json_t *v, const struct lora_tokenizer *t,
                           struct tk_post *p)
{
    static const char *const byte_level[] = {"type", "add_prefix_space", "trim_offsets",
                                             "use_regex", NULL};
    const char *type = tk_get_type(c, v);

    if (!type)
        return -1;
    if (strcmp(type, "Sequence") == 0) {
        p->kind = TK_POST_SEQUENCE;
        return parse_post_sequence(c, v, t, p);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        p->kind = TK_POST_BYTE_LEVEL;
        return tk_check_object(c, v, byte_level);
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        p->kind = TK_POST_TEMPLATE;
        return parse_template(c, v, t, p);
    }
    return tk_fail_key(c, "type", "unsupported '%s'", type);
}

/* ---- the tokenizer ------------------------------------------------------------------------- */

/* A member that, when set, changes what encode returns in ways this module does not do. */
static int must_be_null(struct tk_ctx *c, const json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);

    if (v && !json_is_null(v))
        return tk_fail_key(c, key, "unsupported (must be null)");
    return 0;
}

static int part_norm(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t)
{
    return tk_norm_parse(c, v, &t->norm);
}

static int part_tries(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t)
{
    return build_tries(c, t);
}

static int part_pre(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t)
{
    return tk_pre_parse(c, v, &t->pre);
}

static int part_post(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t)
{
    if (!v || json_is_null(v))
        return 0;
    t->post = calloc(1, sizeof(*t->post));
    if (!t->post)
        return tk_fail(c, "out of memory");
    return parse_post_into(c, v, t, t->post);
}

/* Runs part on root[key] with key on the path. */
static int load_part(struct tk_ctx *c, const json_t *root, const char *key,
                     struct lora_tokenizer *t,
                     int (*part)(struct tk_ctx *, const json_t *, struct lora_tokenizer *))
{
    size_t saved = tk_path_key(c, key);

    if (part(c, json_object_get(root, key), t) < 0)
        return -1;
    tk_path_pop(c, saved);
    return 0;
}

/* In the order the parts depend on each other: the vocabulary needs the added tokens' ids,
 * the normalized added tokens the normalizer, the templates the vocabulary. */
static int load(struct tk_ctx *c, const json_t *root, struct lora_tokenizer *t)
{
    static const char *const keys[] = {
        "version",       "truncation", "padding",        "added_tokens", "normalizer",
        "pre_tokenizer", "model",      "post_processor", "decoder",      NULL};
    const json_t *added = json_object_get(root, "added_tokens");
    int32_t max_added_id;

    memset(t->trie_raw.root, 0xff, sizeof(t->trie_raw.root));
    memset(t->trie_norm.root, 0xff, sizeof(t->trie_norm.root));
    if (tk_check_object(c, root, keys) < 0 || must_be_null(c, root, "truncation") < 0 ||
        must_be_null(c, root, "padding") < 0 || parse_added(c, added, t, &max_added_id) < 0 ||
        tk_bpe_parse(c, json_object_get(root, "model"), max_added_id, t) < 0 ||
        place_added(c, added, t) < 0 || load_part(c, root, "normalizer", t, part_norm) < 0 ||
        load_part(c, root, "added_tokens", t, part_tries) < 0 ||
        load_part(c, root, "pre_tokenizer", t, part_pre) < 0 ||
        load_part(c, root, "post_processor", t, part_post) < 0 ||
        load_part(c, root, "decoder", t, tk_dec_parse) < 0)
        return -1;
    return 0;
}

struct lora_tokenizer *lora_tokenizer_load(const char *tokenizer_json_path, char *err,
                                           size_t err_len)
{
    struct tk_ctx c = {.file = tokenizer_json_path, .err = err, .err_len = err_len};
    struct lora_tokenizer *t;
    json_t *root = lora_json_file_load(tokenizer_json_path, err, err_len);

    if (!root)
        return NULL;
    t = calloc(1, sizeof(*t));
    if (!t) {
        lora_errf_path(err, err_len, tokenizer_json_path, "out of memory");
        json_decref(root);
        errno = ENOMEM;
        return NULL;
    }
    if (load(&c, root, t) < 0) {
        lora_tokenizer_destroy(&t);
        json_decref(root);
        errno = err && err_len && strstr(err, "out of memory") ? ENOMEM : EINVAL;
        return NULL;
    }
    json_decref(root);
    return t;
}

void lora_tokenizer_destroy(struct lora_tokenizer **tp)
{
    struct lora_tokenizer *t;

    if (!tp || !*tp)
        return;
    t = *tp;
    tk_vocab_free(&t->vocab);
    free(t->special);
    free(t->added);
    free(t->trie_raw.node);
    free(t->trie_norm.node);
    tk_norm_free(t->norm);
    tk_pre_free(t->pre);
    tk_bpe_free(&t->bpe);
    if (t->post) {
        post_free_inner(t->post);
        free(t->post);
    }
    tk_dec_free(t);
    free(t);
    *tp = NULL;
}

/* ---- lookups ------------------------------------------------------------------------------- */

int32_t lora_tokenizer_token_id(const struct lora_tokenizer *t, const char *token)
{
    size_t len = strlen(token);

    for (size_t i = 0; i < t->n_added; i++) {
        int32_t id = t->added[i].id;

        if (t->vocab.len[id] == len && memcmp(t->vocab.pool + t->vocab.off[id], token, len) == 0)
            return id;
    }
    return tk_vocab_find(&t->vocab, token, len);
}

const char *lora_tokenizer_token_str(const struct lora_tokenizer *t, int32_t id)
{
    return tk_vocab_has(&t->vocab, id) ? t->vocab.pool + t->vocab.off[id] : NULL;
}

bool lora_tokenizer_is_special(const struct lora_tokenizer *t, int32_t id)
{
    return tk_vocab_has(&t->vocab, id) && t->special[id];
}

size_t lora_tokenizer_vocab_size(const struct lora_tokenizer *t)
{
    return t->vocab.n_ids;
}
