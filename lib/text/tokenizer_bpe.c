/* tokenizer_bpe: the BPE model of a tokenizer.json (see tokenizer_impl.h): the vocabulary and
 * merge ranks, and the merge loop that turns one pre-token into ids.
 *
 * The merge loop is Hugging Face's: the characters of the word start as symbols in a linked
 * list; a min-heap holds candidate merges of adjacent symbols ordered by (rank, position); the
 * best one is applied, the right symbol dies, and the pairs it formed with its neighbours join
 * the heap. Entries whose pair has changed since they were pushed are skipped when they come
 * up. O(n log n) in the word's length, no allocation once the scratch has grown.
 */
#include "text/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A symbol of the word being merged; id -1 once merged into its left neighbour. */
struct tk_sym {
    int32_t id, prev, next;
};

void tk_bpe_free(struct tk_bpe *b)
{
    tk_merges_free(&b->merges);
    free(b->prefix);
    free(b->suffix);
    free(b->cp_id);
    memset(b, 0, sizeof(*b));
}

/* ---- loading ------------------------------------------------------------------------------- */

/* The largest id of the model's vocabulary, after checking every entry is an id in range. */
static int vocab_max_id(struct tk_ctx *c, const json_t *vocab, int32_t *max)
{
    const char *key;
    json_t *v;

    *max = -1;
    json_object_foreach ((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TK_MAX_ID)
            return tk_fail(c, "the id of '%s' must be an integer in [0, %d]", key, TK_MAX_ID);
        if (json_integer_value(v) > *max)
            *max = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int load_vocab(struct tk_ctx *c, const json_t *vocab, int32_t max_added_id,
                      struct lora_tokenizer *t)
{
    size_t saved = tk_path_key(c, "vocab");
    const char *key;
    json_t *v;
    int32_t max;

    if (!json_is_object(vocab))
        return tk_fail(c, vocab ? "must be an object" : "is missing");
    if (json_object_size(vocab) == 0)
        return tk_fail(c, "is empty");
    if (vocab_max_id(c, vocab, &max) < 0)
        return -1;
    if (max_added_id > max)
        max = max_added_id;
    if (tk_vocab_init(&t->vocab, (size_t)max + 1, json_object_size(vocab)) < 0)
        return tk_fail(c, "out of memory");
    json_object_foreach ((json_t *)vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        size_t len = strlen(key);

        if (tk_vocab_has(&t->vocab, id))
            return tk_fail(c, "id %d is given to both '%s' and '%s'", id,
                           t->vocab.pool + t->vocab.off[id], key);
        if (tk_vocab_set(&t->vocab, id, key, len, true) < 0)
            return tk_fail(c, "out of memory");
    }
    tk_path_pop(c, saved);
    return 0;
}

/* One entry of "merges": "a b" (exactly one space) or ["a", "b"]. */
static int merge_parts(struct tk_ctx *c, const json_t *m, const char **a, size_t *a_len,
                       const char **b, size_t *b_len)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');

        if (!sp || strchr(sp + 1, ' '))
            return tk_fail(c, "must be two tokens separated by one space, not '%s'", s);
        *a = s;
        *a_len = (size_t)(sp - s);
        *b = sp + 1;
        *b_len = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *a_len = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *b_len = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return tk_fail(c, "must be a string \"a b\" or an array of two strings");
}

static int find_token(struct tk_ctx *c, const struct tk_vocab *v, const char *s, size_t n,
                      int32_t *id)
{
    *id = tk_vocab_find(v, s, n);
    if (*id < 0)
        return tk_fail(c, "'%.*s' is not in the vocabulary", (int)n, s);
    return 0;
}

/* Merge i has rank i, counting after the "#version" lines that old merges.txt files begin
 * with; a merged token is a + b, less b's continuing_subword_prefix. */
static int load_merges(struct tk_ctx *c, const json_t *merges, struct lora_tokenizer *t)
{
    struct tk_bpe *bpe = &t->bpe;
    struct lora_buf joined = {0};
    size_t saved = tk_path_key(c, "merges"), i;
    int32_t rank = 0;
    json_t *m;
    int rc = -1;

    if (!json_is_array(merges))
        return tk_fail(c, merges ? "must be an array" : "is missing");
    if (tk_merges_init(&bpe->merges, json_array_size(merges)) < 0)
        return tk_fail(c, "out of memory");
    json_array_foreach (merges, i, m) {
        size_t at = tk_path_index(c, i), a_len = 0, b_len = 0;
        const char *a = NULL, *b = NULL;
        int32_t a_id, b_id, new_id;

        if (json_is_string(m) && strncmp(json_string_value(m), "#version", 8) == 0)
            continue;
        if (merge_parts(c, m, &a, &a_len, &b, &b_len) < 0 ||
            find_token(c, &t->vocab, a, a_len, &a_id) < 0 ||
            find_token(c, &t->vocab, b, b_len, &b_id) < 0)
            goto out;
        if (bpe->prefix) {
            if (b_len < bpe->prefix_len || memcmp(b, bpe->prefix, bpe->prefix_len) != 0) {
                tk_fail(c, "'%s' does not start with the continuing_subword_prefix", b);
                goto out;
            }
            b += bpe->prefix_len;
            b_len -= bpe->prefix_len;
        }
        joined.len = 0;
        if (lora_buf_add(&joined, a, a_len) < 0 || lora_buf_add(&joined, b, b_len) < 0) {
            tk_fail(c, "out of memory");
            goto out;
        }
        if (find_token(c, &t->vocab, joined.data, joined.len, &new_id) < 0)
            goto out;
        tk_merges_put(&bpe->merges, a_id, b_id, rank++, new_id);
        tk_path_pop(c, at);
    }
    tk_path_pop(c, saved);
    rc = 0;
out:
    lora_buf_release(&joined);
    return rc;
}

/* An optional string option; an empty one is no option (Hugging Face adds nothing). */
static int opt_str(struct tk_ctx *c, const json_t *model, const char *key, char **out,
                   size_t *out_len)
{
    const char *s;
    size_t len;

    if (tk_get_str(c, model, key, false, &s, &len) < 0)
        return -1;
    *out = NULL;
    *out_len = 0;
    if (!s || len == 0)
        return 0;
    *out = tk_strdup(c, s, len);
    *out_len = len;
    return *out ? 0 : -1;
}

static int load_options(struct tk_ctx *c, const json_t *model, struct lora_tokenizer *t)
{
    struct tk_bpe *b = &t->bpe;
    json_t *dropout = json_object_get(model, "dropout");
    const char *unk;
    size_t unk_len;

    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return tk_fail_key(c, "dropout", "unsupported (BPE dropout is random; must be null)");
    if (tk_get_bool(c, model, "fuse_unk", false, &b->fuse_unk) < 0 ||
        tk_get_bool(c, model, "byte_fallback", false, &b->byte_fallback) < 0 ||
        tk_get_bool(c, model, "ignore_merges", false, &b->ignore_merges) < 0 ||
        opt_str(c, model, "continuing_subword_prefix", &b->prefix, &b->prefix_len) < 0 ||
        opt_str(c, model, "end_of_word_suffix", &b->suffix, &b->suffix_len) < 0 ||
        tk_get_str(c, model, "unk_token", false, &unk, &unk_len) < 0)
        return -1;
    b->unk_id = -1;
    if (unk && (b->unk_id = tk_vocab_find(&t->vocab, unk, unk_len)) < 0)
        return tk_fail_key(c, "unk_token", "'%s' is not in the vocabulary", unk);
    return 0;
}

/* The direct tables: "<0xNN>" for byte fallback, and every one-character token. */
static int build_tables(struct tk_ctx *c, struct lora_tokenizer *t)
{
    struct tk_bpe *b = &t->bpe;
    const struct tk_vocab *v = &t->vocab;

    for (int i = 0; i < 256; i++) {
        char name[8];

        snprintf(name, sizeof(name), "<0x%02X>", i);
        b->byte_id[i] = tk_vocab_find(v, name, 6);
    }
    b->cp_id = malloc(TK_CP_FAST * sizeof(*b->cp_id));
    if (!b->cp_id)
        return tk_fail(c, "out of memory");
    memset(b->cp_id, 0xff, TK_CP_FAST * sizeof(*b->cp_id));
    for (size_t i = 0; i <= v->mask; i++) {
        int32_t id = v->slot[i].id;
        uint32_t cp;

        if (id < 0 || v->len[id] > 3 || v->len[id] == 0)
            continue;
        if ((uint32_t)tk_utf8_get(v->pool + v->off[id], &cp) == v->len[id] && cp < TK_CP_FAST)
            b->cp_id[cp] = id;
    }
    return 0;
}

int tk_bpe_parse(struct tk_ctx *c, const json_t *model, int32_t max_added_id,
                 struct lora_tokenizer *t)
{
    static const char *const keys[] = {
        "type",
        "dropout",
        "unk_token",
        "continuing_subword_prefix",
        "vocab",
        "fuse_unk",
        "byte_fallback",
        "end_of_word_suffix",
        "merges",
        "ignore_merges",
        NULL,
    };
    size_t saved = tk_path_key(c, "model");
    const char *type;

    if (!json_is_object(model))
        return tk_fail(c, model ? "must be an object" : "is missing");
    type = tk_get_type(c, model);
    if (!type)
        return -1;
    if (strcmp(type, "BPE") != 0)
        return tk_fail_key(c, "type", "unsupported '%s' (only BPE models are)", type);
    if (tk_check_object(c, model, keys) < 0 ||
        load_vocab(c, json_object_get(model, "vocab"), max_added_id, t) < 0 ||
        load_options(c, model, t) < 0 || load_merges(c, json_object_get(model, "merges"), t) < 0 ||
        build_tables(c, t) < 0)
        return -1;
    tk_path_pop(c, saved);
    return 0;
}

/* ---- merging ------------------------------------------------------------------------------- */

/* A candidate merge of symbol pos (in order) with its right neighbour right. It still stands
 * while both hold the ids it was made from: a symbol's id changes only when its token grows,
 * so the same ids mean the same pair. */
struct tk_cand {
    uint64_t order; /* rank << 32 | pos: the heap's key, Hugging Face's order */
    int32_t left_id, right_id, right, new_id;
};

void tk_bpe_scratch_free(struct tk_bpe_scratch *s)
{
    free(s->sym);
    free(s->heap);
    lora_buf_release(&s->word);
    memset(s, 0, sizeof(*s));
}

static int sym_add(struct tk_bpe_scratch *s, size_t *n, int32_t id)
{
    if (*n == s->sym_cap) {
        size_t cap = s->sym_cap ? s->sym_cap * 2 : 256;
        struct tk_sym *v = realloc(s->sym, cap * sizeof(*v));

        if (!v)
            return -1;
        s->sym = v;
        s->sym_cap = cap;
    }
    s->sym[*n].id = id;
    s->sym[*n].prev = (int32_t)*n - 1;
    s->sym[*n].next = (int32_t)*n + 1;
    (*n)++;
    return 0;
}

static int heap_push(struct tk_bpe_scratch *s, size_t *n, const struct tk_cand *c)
{
    size_t i = *n;

    if (*n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
        struct tk_cand *v = realloc(s->heap, cap * sizeof(*v));

        if (!v)
            return -1;
        s->heap = v;
        s->heap_cap = cap;
    }
    while (i > 0 && s->heap[(i - 1) / 2].order > c->order) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = *c;
    (*n)++;
    return 0;
}

static struct tk_cand heap_pop(struct tk_bpe_scratch *s, size_t *n)
{
    struct tk_cand top = s->heap[0], last = s->heap[--*n];
    size_t i = 0;

    for (;;) {
        size_t k = 2 * i + 1;

        if (k >= *n)
            break;
        if (k + 1 < *n && s->heap[k + 1].order < s->heap[k].order)
            k++;
        if (s->heap[k].order >= last.order)
            break;
        s->heap[i] = s->heap[k];
        i = k;
    }
    if (*n)
        s->heap[i] = last;
    return top;
}

/* Pushes the merge of symbol pos with its right neighbour, when there is one. */
static int candidate(const struct tk_bpe *b, struct tk_bpe_scratch *s, size_t *n_heap, int32_t pos)
{
    const struct tk_sym *sym = s->sym;
    const struct tk_merge *m;
    struct tk_cand c;

    if (pos < 0 || sym[pos].next < 0)
        return 0;
    c.right = sym[pos].next;
    c.left_id = sym[pos].id;
    c.right_id = sym[c.right].id;
    m = tk_merges_find(&b->merges, c.left_id, c.right_id);
    if (!m)
        return 0;
    c.order = (uint64_t)(uint32_t)m->rank << 32 | (uint32_t)pos;
    c.new_id = m->new_id;
    return heap_push(s, n_heap, &c);
}

static int merge_all(const struct tk_bpe *b, struct tk_bpe_scratch *s, size_t n_sym)
{
    size_t n_heap = 0;

    s->sym[n_sym - 1].next = -1;
    /* The first lookups do not depend on each other: start all their cache misses at once. */
    for (size_t i = 0; i + 1 < n_sym; i++)
        tk_merges_prefetch(&b->merges, s->sym[i].id, s->sym[i + 1].id);
    for (size_t i = 0; i + 1 < n_sym; i++)
        if (candidate(b, s, &n_heap, (int32_t)i) < 0)
            return -1;
    while (n_heap) {
        struct tk_cand c = heap_pop(s, &n_heap);
        int32_t pos = (int32_t)(c.order & 0xffffffffu);
        struct tk_sym *sym = s->sym;

        if (sym[pos].id != c.left_id || sym[pos].next != c.right || sym[c.right].id != c.right_id)
            continue; /* stale: one side has merged since */
        sym[pos].id = c.new_id;
        sym[pos].next = sym[c.right].next;
        sym[c.right].id = -1;
        if (sym[pos].next >= 0)
            sym[sym[pos].next].prev = pos;
        if (candidate(b, s, &n_heap, sym[pos].prev) < 0 || candidate(b, s, &n_heap, pos) < 0)
            return -1;
    }
    return 0;
}

/* The id of one character of the word (with the prefix or suffix it takes there), or -1. */
static int32_t char_id(const struct lora_tokenizer *t, const char *w, size_t at, size_t k,
                       size_t len, uint32_t cp, struct tk_bpe_scratch *s, const char **str,
                       size_t *str_len)
{
    const struct tk_bpe *b = &t->bpe;
    bool with_prefix = b->prefix && at > 0, with_suffix = b->suffix && at + k == len;

    *str = w + at;
    *str_len = k;
    if (!with_prefix && !with_suffix)
        return cp < TK_CP_FAST ? b->cp_id[cp] : tk_vocab_find(&t->vocab, w + at, k);
    s->word.len = 0;
    if ((with_prefix && lora_buf_add(&s->word, b->prefix, b->prefix_len) < 0) ||
        lora_buf_add(&s->word, w + at, k) < 0 ||
        (with_suffix && lora_buf_add(&s->word, b->suffix, b->suffix_len) < 0))
        return -2;
    *str = s->word.data;
    *str_len = s->word.len;
    return tk_vocab_find(&t->vocab, s->word.data, s->word.len);
}

/* Whether every byte of str has a "<0xNN>" token. */
static bool has_byte_tokens(const struct tk_bpe *b, const char *str, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b->byte_id[(unsigned char)str[i]] < 0)
            return false;
    return true;
}

/* The initial symbols, as Hugging Face's merge_word makes them: a known character is its token;
 * an unknown one falls back to its bytes' tokens, else becomes unk_token (consecutive ones
 * fused into one with fuse_unk), else is dropped. A pending unk is written when the next known
 * character comes, not before byte-fallback tokens: Hugging Face orders them so. */
static int initial_symbols(const struct lora_tokenizer *t, const char *w, size_t len,
                           struct tk_bpe_scratch *s, size_t *n_sym)
{
    const struct tk_bpe *b = &t->bpe;
    bool unk_pending = false;

    *n_sym = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)tk_utf8_get(w + i, &cp), str_len;
        const char *str;
        int32_t id = char_id(t, w, i, k, len, cp, s, &str, &str_len);

        i += k;
        if (id == -2)
            return -1;
        if (id >= 0) {
            if (unk_pending && sym_add(s, n_sym, b->unk_id) < 0)
                return -1;
            unk_pending = false;
            if (sym_add(s, n_sym, id) < 0)
                return -1;
            continue;
        }
        if (b->byte_fallback && has_byte_tokens(b, str, str_len)) {
            for (size_t j = 0; j < str_len; j++)
                if (sym_add(s, n_sym, b->byte_id[(unsigned char)str[j]]) < 0)
                    return -1;
            continue;
        }
        if (b->unk_id < 0)
            continue;
        if (unk_pending && !b->fuse_unk && sym_add(s, n_sym, b->unk_id) < 0)
            return -1;
        unk_pending = true;
    }
    if (unk_pending && sym_add(s, n_sym, b->unk_id) < 0)
        return -1;
    return 0;
}

int tk_bpe_encode(const struct lora_tokenizer *t, const char *w, size_t len, struct tk_ids *out,
                  struct tk_bpe_scratch *s)
{
    const struct tk_bpe *b = &t->bpe;
    size_t n_sym;

    if (b->ignore_merges) {
        int32_t id = tk_vocab_find(&t->vocab, w, len);

        if (id >= 0)
            return tk_ids_add(out, id);
    }
    if (initial_symbols(t, w, len, s, &n_sym) < 0)
        return -1;
    if (n_sym && merge_all(b, s, n_sym) < 0)
        return -1;
    for (int32_t i = 0; n_sym && i >= 0; i = s->sym[i].next)
        if (tk_ids_add(out, s->sym[i].id) < 0)
            return -1;
    return 0;
}
