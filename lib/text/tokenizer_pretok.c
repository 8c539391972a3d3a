/* tokenizer_pretok: the pre-tokenizers of a tokenizer.json (see tokenizer_impl.h): Sequence,
 * Split, ByteLevel, Metaspace and Digits, cutting normalized text into the pieces BPE merges
 * within, with Hugging Face's semantics:
 * - a pattern cuts a piece into spans, matches and the gaps between them, in order;
 * - the split behaviour decides which spans are kept and which join their neighbour;
 * - pieces that come out empty are dropped.
 * Nested Sequences are flattened at load; a loaded pre-tokenizer is one Sequence of leaves.
 */
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"

/* GPT-2's regex, which ByteLevel applies when use_regex is set. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Printable bytes stand for themselves; the others, in byte order, take U+0100 onwards:
 * 0x00-0x20 -> U+0100-U+0120, 0x7f-0xa0 -> U+0121-U+0142, 0xad -> U+0143. */
uint32_t tk_byte_char(unsigned b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7f && b <= 0xa0)
        return 0x121 + (b - 0x7f);
    if (b == 0xad)
        return 0x143;
    return b;
}

int tk_char_byte(uint32_t cp)
{
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(cp - 0x121 + 0x7f);
    if (cp == 0x143)
        return 0xad;
    if (cp > 0x20 && cp < 0x100 && !(cp >= 0x7f && cp <= 0xa0) && cp != 0xad)
        return (int)cp;
    return -1;
}

/* ---- piece lists --------------------------------------------------------------------------- */

/* Records text[off, end of text) as a piece when it is not empty. */
static int piece_close(struct tk_pieces *l, size_t off, bool at_origin)
{
    if (l->text.len == off)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct tk_piece *v = realloc(l->v, cap * sizeof(*v));

        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].off = off;
    l->v[l->n].len = l->text.len - off;
    l->v[l->n].at_origin = at_origin;
    l->n++;
    return 0;
}

int tk_pieces_add(struct tk_pieces *l, const char *s, size_t n, bool at_origin)
{
    size_t off = l->text.len;

    if (lora_buf_add(&l->text, s, n) < 0)
        return -1;
    return piece_close(l, off, at_origin);
}

void tk_pieces_free(struct tk_pieces *l)
{
    lora_buf_release(&l->text);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

void tk_pre_scratch_free(struct tk_pre_scratch *s)
{
    tk_pieces_free(&s->tmp);
    tk_pieces_free(&s->sub);
    lora_buf_release(&s->str);
}

/* ---- split behaviours ---------------------------------------------------------------------- */

/* Receives the spans of one piece in order and writes the pieces the behaviour makes of them.
 * The last piece stays open (have, [cs, ce)) because the next span may still extend it. */
struct splitter {
    enum tk_split_behavior behavior;
    bool invert, at_origin;
    const char *s;
    struct tk_pieces *out;
    bool have, prev_match;
    size_t cs, ce;
};

static int sp_flush(struct splitter *sp)
{
    if (!sp->have)
        return 0;
    sp->have = false;
    return tk_pieces_add(sp->out, sp->s + sp->cs, sp->ce - sp->cs, sp->at_origin && sp->cs == 0);
}

static int sp_open(struct splitter *sp, size_t s, size_t e)
{
    if (sp_flush(sp) < 0)
        return -1;
    sp->have = true;
    sp->cs = s;
    sp->ce = e;
    return 0;
}

/* Hugging Face's NormalizedString::split, one span at a time. MergedWithNext, which it folds
 * from the end, is the same as holding a match until the span after it is known. */
static int sp_span(struct splitter *sp, size_t s, size_t e, bool match)
{
    bool prev = sp->prev_match;

    match ^= sp->invert;
    sp->prev_match = match;
    switch (sp->behavior) {
    case TK_SPLIT_REMOVED:
        return match ? sp_flush(sp) : sp_open(sp, s, e);
    case TK_SPLIT_ISOLATED:
        return sp_open(sp, s, e);
    case TK_SPLIT_CONTIGUOUS:
        if (sp->have && match == prev) {
            sp->ce = e;
            return 0;
        }
        return sp_open(sp, s, e);
    case TK_SPLIT_MERGED_WITH_PREVIOUS:
        if (sp->have && match && !prev) {
            sp->ce = e;
            return 0;
        }
        return sp_open(sp, s, e);
    case TK_SPLIT_MERGED_WITH_NEXT:
        if (sp->have && prev && !match) {
            sp->ce = e; /* the held match takes this span in */
            return sp_flush(sp);
        }
        return sp_open(sp, s, e);
    }
    return -1;
}

static void sp_init(struct splitter *sp, const struct tk_pre *p, enum tk_split_behavior b,
                    const char *s, bool at_origin, struct tk_pieces *out)
{
    memset(sp, 0, sizeof(*sp));
    sp->behavior = b;
    sp->invert = p && p->kind == TK_PRE_SPLIT && p->invert;
    sp->at_origin = at_origin;
    sp->s = s;
    sp->out = out;
}

/* Feeds the spans a pattern makes of s[0, n): each match, and each gap between matches. */
static int split_pattern(struct splitter *sp, const struct tk_pattern *pat, size_t n,
                         pcre2_match_data *md, char *err, size_t err_len)
{
    size_t prev = 0, from = 0, ms, me;
    int rc;

    while ((rc = tk_pattern_next(pat, sp->s, n, from, md, &ms, &me, err, err_len)) == 1) {
        if (ms > prev && sp_span(sp, prev, ms, false) < 0)
            return -1;
        if (sp_span(sp, ms, me, true) < 0)
            return -1;
        prev = from = me;
        if (me == ms) { /* an empty match: search on from the next character */
            uint32_t cp;

            if (me == n)
                break;
            from += (size_t)tk_utf8_get(sp->s + me, &cp);
        }
    }
    if (rc < 0)
        return -1;
    if (n > prev && sp_span(sp, prev, n, false) < 0)
        return -1;
    return sp_flush(sp);
}

/* Feeds the spans that a character class makes: each matching character on its own. */
static int split_chars(struct splitter *sp, size_t n, bool (*is)(uint32_t, uint32_t), uint32_t arg)
{
    size_t prev = 0;

    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = (size_t)tk_utf8_get(sp->s + i, &cp);

        if (is(cp, arg)) {
            if (i > prev && sp_span(sp, prev, i, false) < 0)
                return -1;
            if (sp_span(sp, i, i + k, true) < 0)
                return -1;
            prev = i + k;
        }
        i += k;
    }
    if (n > prev && sp_span(sp, prev, n, false) < 0)
        return -1;
    return sp_flush(sp);
}

static bool is_cp(uint32_t cp, uint32_t want)
{
    return cp == want;
}

static bool is_digit(uint32_t cp, uint32_t unused)
{
    return tk_is_numeric(cp);
}

/* ---- the pre-tokenizers -------------------------------------------------------------------- */

/* Appends the byte-level form of s[0, n) (each byte as its GPT-2 character) to out's text. */
static int byte_map(struct tk_pieces *out, const char *s, size_t n, bool at_origin)
{
    size_t off = out->text.len;

    if (lora_buf_reserve(&out->text, 2 * n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char *d = out->text.data + out->text.len;

        out->text.len += (size_t)tk_utf8_put(tk_byte_char((unsigned char)s[i]), d);
    }
    out->text.data[out->text.len] = '\0';
    return piece_close(out, off, at_origin);
}

static int byte_level(const struct tk_pre *p, const char *s, size_t n, bool at_origin,
                      struct tk_pieces *out, struct tk_pre_scratch *ps, pcre2_match_data *md,
                      char *err, size_t err_len)
{
    struct lora_buf *str = &ps->str;
    struct tk_pieces *sub = &ps->sub;
    struct splitter sp;

    /* Hugging Face adds the space to every piece that reaches it, not only the first. */
    str->len = 0;
    if (p->add_prefix_space && (n == 0 || s[0] != ' ') && lora_buf_add(str, " ", 1) < 0)
        return -1;
    if (lora_buf_add(str, s, n) < 0)
        return -1;
    if (!p->pat.re)
        return byte_map(out, str->data, str->len, at_origin);
    sub->n = 0;
    sub->text.len = 0;
    sp_init(&sp, NULL, TK_SPLIT_ISOLATED, str->data, at_origin, sub);
    if (split_pattern(&sp, &p->pat, str->len, md, err, err_len) < 0)
        return -1;
    for (size_t i = 0; i < sub->n; i++)
        if (byte_map(out, sub->text.data + sub->v[i].off, sub->v[i].len, sub->v[i].at_origin) < 0)
            return -1;
    return 0;
}

static int metaspace(const struct tk_pre *p, const char *s, size_t n, bool at_origin,
                     struct tk_pieces *out, struct lora_buf *scratch)
{
    char rep[4];
    size_t rep_len = (size_t)tk_utf8_put(p->replacement, rep), skip = rep_len;
    bool starts_with_rep;
    struct splitter sp;

    /* Spaces become the replacement first, then the replacement may be prepended. */
    scratch->len = 0;
    if (lora_buf_add(scratch, rep, rep_len) < 0)
        return -1;
    for (size_t i = 0; i < n;) {
        const char *space = memchr(s + i, ' ', n - i);
        size_t end = space ? (size_t)(space - s) : n;

        if (lora_buf_add(scratch, s + i, end - i) < 0 ||
            (space && lora_buf_add(scratch, rep, rep_len) < 0))
            return -1;
        i = end + 1;
    }
    /* scratch holds the replacement, then the text: skip the first unless it is wanted. */
    starts_with_rep =
        scratch->len >= 2 * rep_len && memcmp(scratch->data + rep_len, rep, rep_len) == 0;
    if (!starts_with_rep &&
        (p->prepend == TK_PREPEND_ALWAYS || (p->prepend == TK_PREPEND_FIRST && at_origin)))
        skip = 0;
    if (!p->split)
        return tk_pieces_add(out, scratch->data + skip, scratch->len - skip, at_origin);
    sp_init(&sp, p, TK_SPLIT_MERGED_WITH_NEXT, scratch->data + skip, at_origin, out);
    return split_chars(&sp, scratch->len - skip, is_cp, p->replacement);
}

static int apply_leaf(const struct tk_pre *p, const struct tk_pieces *in, struct tk_pieces *out,
                      struct tk_pre_scratch *ps, pcre2_match_data *md, char *err, size_t err_len)
{
    out->n = 0;
    out->text.len = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.data + in->v[i].off;
        size_t n = in->v[i].len;
        bool origin = in->v[i].at_origin;
        struct splitter sp;
        int rc;

        switch (p->kind) {
        case TK_PRE_SPLIT:
            sp_init(&sp, p, p->behavior, s, origin, out);
            rc = split_pattern(&sp, &p->pat, n, md, err, err_len);
            break;
        case TK_PRE_BYTE_LEVEL:
            rc = byte_level(p, s, n, origin, out, ps, md, err, err_len);
            break;
        case TK_PRE_METASPACE:
            rc = metaspace(p, s, n, origin, out, &ps->str);
            break;
        case TK_PRE_DIGITS:
            sp_init(&sp, p, p->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS, s,
                    origin, out);
            rc = split_chars(&sp, n, is_digit, 0);
            break;
        default:
            rc = tk_pieces_add(out, s, n, origin);
            break;
        }
        if (rc < 0) {
            if (err && err_len && !err[0])
                lora_errf(err, err_len, "out of memory");
            return -1;
        }
    }
    return 0;
}

int tk_pre_apply(const struct tk_pre *p, struct tk_pieces *io, struct tk_pre_scratch *s,
                 pcre2_match_data *md, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    for (size_t i = 0; i < p->n_sub; i++) {
        struct tk_pieces swap;

        if (apply_leaf(&p->sub[i], io, &s->tmp, s, md, err, err_len) < 0)
            return -1;
        swap = *io;
        *io = s->tmp;
        s->tmp = swap;
    }
    return 0;
}

/* ---- parsing ------------------------------------------------------------------------------- */

static void pre_free_inner(struct tk_pre *p)
{
    for (size_t i = 0; i < p->n_sub; i++)
        pre_free_inner(&p->sub[i]);
    free(p->sub);
    tk_pattern_free(&p->pat);
}

void tk_pre_free(struct tk_pre *p)
{
    if (!p)
        return;
    pre_free_inner(p);
    free(p);
}

static int parse_split(struct tk_ctx *c, const json_t *v, struct tk_pre *p)
{
    static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
    static const char *const names[] = {
        [TK_SPLIT_REMOVED] = "Removed",
        [TK_SPLIT_ISOLATED] = "Isolated",
        [TK_SPLIT_MERGED_WITH_PREVIOUS] = "MergedWithPrevious",
        [TK_SPLIT_MERGED_WITH_NEXT] = "MergedWithNext",
        [TK_SPLIT_CONTIGUOUS] = "Contiguous",
    };
    const char *b;
    size_t len, saved;
    int i;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "pattern"))
        return tk_fail_key(c, "pattern", "is missing");
    saved = tk_path_key(c, "pattern");
    if (tk_pattern_parse(c, json_object_get(v, "pattern"), &p->pat) < 0)
        return -1;
    tk_path_pop(c, saved);
    if (tk_get_str(c, v, "behavior", true, &b, &len) < 0)
        return -1;
    for (i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (strcmp(b, names[i]) == 0)
            break;
    if (i == (int)(sizeof(names) / sizeof(names[0])))
        return tk_fail_key(c, "behavior", "unsupported '%s'", b);
    p->behavior = (enum tk_split_behavior)i;
    return tk_get_bool(c, v, "invert", false, &p->invert);
}

static int parse_byte_level(struct tk_ctx *c, const json_t *v, struct tk_pre *p)
{
    static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex",
                                       NULL};
    bool use_regex, trim;

    if (tk_check_object(c, v, keys) < 0 ||
        tk_get_bool(c, v, "add_prefix_space", true, &p->add_prefix_space) < 0 ||
        tk_get_bool(c, v, "trim_offsets", true, &trim) < 0 || /* offsets only */
        tk_get_bool(c, v, "use_regex", true, &use_regex) < 0)
        return -1;
    if (!use_regex)
        return 0;
    return tk_regex_compile(c, gpt2_regex, sizeof(gpt2_regex) - 1, &p->pat.re);
}

static int parse_metaspace(struct tk_ctx *c, const json_t *v, struct tk_pre *p)
{
    static const char *const keys[] = {
        "type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep", NULL};
    const char *scheme, *unused;
    size_t len;
    bool add_prefix_space;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "replacement"))
        return tk_fail_key(c, "replacement", "is missing");
    if (tk_get_char(c, v, "replacement", 0x2581, &p->replacement) < 0 ||
        tk_get_bool(c, v, "split", true, &p->split) < 0 ||
        tk_get_bool(c, v, "add_prefix_space", true, &add_prefix_space) < 0 ||
        tk_get_str(c, v, "str_rep", false, &unused, &len) < 0 || /* older files' copy */
        tk_get_str(c, v, "prepend_scheme", false, &scheme, &len) < 0)
        return -1;
    /* Files from before prepend_scheme say add_prefix_space instead. */
    p->prepend = add_prefix_space ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
    if (!scheme)
        return 0;
    if (strcmp(scheme, "always") == 0)
        p->prepend = TK_PREPEND_ALWAYS;
    else if (strcmp(scheme, "first") == 0)
        p->prepend = TK_PREPEND_FIRST;
    else if (strcmp(scheme, "never") == 0)
        p->prepend = TK_PREPEND_NEVER;
    else
        return tk_fail_key(c, "prepend_scheme", "unsupported '%s'", scheme);
    return 0;
}

/* Appends the leaf v to the Sequence arg. */
static int add_leaf(struct tk_ctx *c, const json_t *v, const char *type, void *arg)
{
    static const char *const digits_keys[] = {"type", "individual_digits", NULL};
    struct tk_pre *seq = arg, *sub = tk_array_append(c, seq->sub, &seq->n_sub, sizeof(*sub)), *p;

    if (!sub)
        return -1;
    seq->sub = sub;
    p = &sub[seq->n_sub - 1];
    if (strcmp(type, "Split") == 0) {
        p->kind = TK_PRE_SPLIT;
        return parse_split(c, v, p);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        p->kind = TK_PRE_BYTE_LEVEL;
        return parse_byte_level(c, v, p);
    }
    if (strcmp(type, "Metaspace") == 0) {
        p->kind = TK_PRE_METASPACE;
        return parse_metaspace(c, v, p);
    }
    if (strcmp(type, "Digits") == 0) {
        p->kind = TK_PRE_DIGITS;
        if (tk_check_object(c, v, digits_keys) < 0)
            return -1;
        return tk_get_bool(c, v, "individual_digits", false, &p->individual_digits);
    }
    seq->n_sub--;
    return tk_fail_key(c, "type", "unsupported '%s'", type);
}

int tk_pre_parse(struct tk_ctx *c, const json_t *v, struct tk_pre **out)
{
    struct tk_pre *seq;

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    seq = calloc(1, sizeof(*seq));
    if (!seq)
        return tk_fail(c, "out of memory");
    seq->kind = TK_PRE_SEQUENCE;
    if (tk_parse_flat(c, v, "pretokenizers", add_leaf, seq) < 0) {
        tk_pre_free(seq);
        return -1;
    }
    *out = seq;
    return 0;
}
