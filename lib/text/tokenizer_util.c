/* tokenizer_util: the tokenizer's building blocks: id arrays, hashing, the vocabulary
 * and merge tables, UTF-8 checking and lossy decoding, and the character classes that
 * Hugging Face's Rust code takes from the standard library (see tokenizer_impl.h). */
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* ---- id arrays ----------------------------------------------------------------------------- */

int tk_ids_add(struct tk_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof(*v));

        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

void tk_ids_free(struct tk_ids *a)
{
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- hashing ------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Eight bytes a step: tokens are short, so the tail and the final mix dominate. */
uint64_t tk_hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n, w;

    while (n >= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9fb21c651e98df25ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    w = 0;
    if (n)
        memcpy(&w, s, n);
    return mix64(h ^ w);
}

/* The smallest power of two that keeps the table at most half full. */
static size_t table_size(size_t n)
{
    size_t size = 16;

    while (size < 2 * n)
        size *= 2;
    return size;
}

/* ---- vocabulary ---------------------------------------------------------------------------- */

int tk_vocab_init(struct tk_vocab *v, size_t n_ids, size_t n_model)
{
    size_t size = table_size(n_model);

    memset(v, 0, sizeof(*v));
    v->n_ids = n_ids;
    v->off = malloc((n_ids ? n_ids : 1) * sizeof(*v->off));
    v->len = calloc(n_ids ? n_ids : 1, sizeof(*v->len));
    v->slot = malloc(size * sizeof(*v->slot));
    if (!v->off || !v->len || !v->slot) {
        tk_vocab_free(v);
        return -1;
    }
    memset(v->off, 0xff, n_ids * sizeof(*v->off));  /* TK_HOLE */
    memset(v->slot, 0xff, size * sizeof(*v->slot)); /* id -1 */
    v->mask = size - 1;
    return 0;
}

void tk_vocab_free(struct tk_vocab *v)
{
    free(v->pool);
    free(v->off);
    free(v->len);
    free(v->slot);
    memset(v, 0, sizeof(*v));
}

int tk_vocab_set(struct tk_vocab *v, int32_t id, const char *s, size_t n, bool in_model)
{
    size_t need = v->pool_len + n + 1;

    if (need >= TK_HOLE || need < n)
        return -1;
    if (need > v->pool_cap) {
        size_t cap = v->pool_cap ? v->pool_cap : 4096;
        char *p;

        while (cap < need)
            cap *= 2;
        p = realloc(v->pool, cap);
        if (!p)
            return -1;
        v->pool = p;
        v->pool_cap = cap;
    }
    memcpy(v->pool + v->pool_len, s, n);
    v->pool[v->pool_len + n] = '\0';
    v->off[id] = (uint32_t)v->pool_len;
    v->len[id] = (uint32_t)n;
    v->pool_len = need;
    if (in_model) {
        uint64_t h = tk_hash(s, n);
        size_t i = h & v->mask;

        while (v->slot[i].id >= 0)
            i = (i + 1) & v->mask;
        v->slot[i].id = id;
        v->slot[i].tag = (uint32_t)(h >> 32);
        v->n_model++;
    }
    return 0;
}

int32_t tk_vocab_find(const struct tk_vocab *v, const char *s, size_t n)
{
    uint64_t h = tk_hash(s, n);
    uint32_t tag = (uint32_t)(h >> 32);

    for (size_t i = h & v->mask;; i = (i + 1) & v->mask) {
        int32_t id = v->slot[i].id;

        if (id < 0)
            return -1;
        if (v->slot[i].tag == tag && v->len[id] == n && memcmp(v->pool + v->off[id], s, n) == 0)
            return id;
    }
}

/* ---- merges -------------------------------------------------------------------------------- */

static uint64_t pair_key(int32_t a, int32_t b)
{
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

int tk_merges_init(struct tk_merges *m, size_t n)
{
    size_t size = table_size(n);

    m->slot = malloc(size * sizeof(*m->slot));
    if (!m->slot)
        return -1;
    for (size_t i = 0; i < size; i++)
        m->slot[i].key = UINT64_MAX;
    m->mask = size - 1;
    m->n = 0;
    return 0;
}

void tk_merges_free(struct tk_merges *m)
{
    free(m->slot);
    memset(m, 0, sizeof(*m));
}

void tk_merges_put(struct tk_merges *m, int32_t a, int32_t b, int32_t rank, int32_t new_id)
{
    uint64_t key = pair_key(a, b);
    size_t i = mix64(key) & m->mask;

    while (m->slot[i].key != UINT64_MAX && m->slot[i].key != key)
        i = (i + 1) & m->mask;
    if (m->slot[i].key == UINT64_MAX)
        m->n++;
    m->slot[i].key = key;
    m->slot[i].rank = rank;
    m->slot[i].new_id = new_id;
}

void tk_merges_prefetch(const struct tk_merges *m, int32_t a, int32_t b)
{
    __builtin_prefetch(&m->slot[mix64(pair_key(a, b)) & m->mask]);
}

const struct tk_merge *tk_merges_find(const struct tk_merges *m, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b);
    size_t i = mix64(key) & m->mask;

    for (;; i = (i + 1) & m->mask) {
        if (m->slot[i].key == key)
            return &m->slot[i];
        if (m->slot[i].key == UINT64_MAX)
            return NULL;
    }
}

/* ---- UTF-8 --------------------------------------------------------------------------------- */

/* For a lead byte: the number of continuation bytes, and the range the first of them must be
 * in (Unicode Table 3-7, which excludes overlong forms, surrogates and values past U+10FFFF);
 * -1 for a byte that cannot start a sequence. */
static int lead_info(unsigned c, unsigned *lo, unsigned *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        return 1;
    if (c == 0xe0) {
        *lo = 0xa0;
        return 2;
    }
    if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
        return 2;
    if (c == 0xed) {
        *hi = 0x9f;
        return 2;
    }
    if (c == 0xf0) {
        *lo = 0x90;
        return 3;
    }
    if (c >= 0xf1 && c <= 0xf3)
        return 3;
    if (c == 0xf4) {
        *hi = 0x8f;
        return 3;
    }
    return -1;
}

/* How many bytes of the sequence at p[0, n) are valid: need + 1 for a whole one, fewer when it
 * breaks (or, with n too short, stops) early; 0 (and *need -1) for an invalid lead. */
static int valid_run(const unsigned char *p, size_t n, int *need)
{
    unsigned lo, hi;
    int k;

    *need = lead_info(p[0], &lo, &hi);
    if (*need < 0)
        return 0;
    for (k = 1; k <= *need && (size_t)k < n; k++) {
        unsigned lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xbf;

        if (p[k] < lo_k || p[k] > hi_k)
            break;
    }
    return k;
}

size_t tk_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        int need, k;

        if (p[i] < 0x80) {
            i++;
            continue;
        }
        k = valid_run(p + i, n - i, &need);
        if (need < 0 || k != need + 1)
            return i;
        i += (size_t)k;
    }
    return n;
}

int tk_utf8_get(const char *s, uint32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;

    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    if (p[0] < 0xe0) {
        *cp = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
        return 2;
    }
    if (p[0] < 0xf0) {
        *cp = (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
        return 3;
    }
    *cp = (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 |
          (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
    return 4;
}

int tk_utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static const char replacement_char[] = "\xef\xbf\xbd"; /* U+FFFD */

int tk_lossy_feed(struct tk_lossy *l, const void *data, size_t n, struct lora_buf *out)
{
    const unsigned char *p = data;
    size_t i = 0, run = 0; /* p[run, i) is valid text not yet copied */

    /* First complete (or give up on) the sequence the previous feed left open. */
    while (l->n_pending && i < n) {
        unsigned char seq[4];
        int need, k;

        memcpy(seq, l->pending, (size_t)l->n_pending);
        seq[l->n_pending] = p[i];
        k = valid_run(seq, (size_t)l->n_pending + 1, &need);
        if (k == l->n_pending + 1) {
            l->pending[l->n_pending++] = p[i++];
            if (l->n_pending == need + 1) {
                if (lora_buf_add(out, l->pending, (size_t)l->n_pending) < 0)
                    return -1;
                l->n_pending = 0;
            }
        } else {
            /* The open sequence is a maximal invalid subpart; p[i] starts afresh. */
            if (lora_buf_add(out, replacement_char, 3) < 0)
                return -1;
            l->n_pending = 0;
        }
    }
    run = i;
    while (i < n) {
        int need, k;

        i += tk_utf8_check((const char *)p + i, n - i);
        if (i == n)
            break;
        k = valid_run(p + i, n - i, &need); /* an invalid or a cut sequence */
        if (lora_buf_add(out, p + run, i - run) < 0)
            return -1;
        if (k > 0 && i + (size_t)k == n) {
            /* Valid so far and cut by the end of the input: wait for more. */
            memcpy(l->pending, p + i, (size_t)k);
            l->n_pending = k;
            return 0;
        }
        if (lora_buf_add(out, replacement_char, 3) < 0)
            return -1;
        i += k > 0 ? (size_t)k : 1;
        run = i;
    }
    return lora_buf_add(out, p + run, i - run);
}

int tk_lossy_flush(struct tk_lossy *l, struct lora_buf *out)
{
    if (!l->n_pending)
        return 0;
    l->n_pending = 0;
    return lora_buf_add(out, replacement_char, 3);
}

/* ---- character classes --------------------------------------------------------------------- */

bool tk_is_whitespace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

bool tk_is_numeric(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);

    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tk_is_word_char(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return cp == 0x200c || cp == 0x200d; /* Join_Control */
    }
}
