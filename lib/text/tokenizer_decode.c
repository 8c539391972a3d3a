/* tokenizer_decode: the decoders of a tokenizer.json as a streaming chain, and the two ways in:
 * lora_tokenizer_decode (all ids at once) and struct lora_detok (ids a few at a time).
 *
 * Hugging Face's decoders map a list of token strings to a list of strings, one decoder after
 * the other, and join the result. Here each decoder is a stage that receives the tokens one at
 * a time and passes on only what no later token can change:
 *   Replace, Strip, Metaspace  act on each token by itself: nothing waits;
 *   ByteFallback               holds a run of <0xNN> tokens until a token that is not a byte
 *                              ends it (the run decodes as a whole, or as one U+FFFD a byte);
 *   ByteLevel                  turns every token into bytes and holds only an unfinished UTF-8
 *                              sequence at the end (decoded as String::from_utf8_lossy);
 *   Fuse                       joins everything into one token.
 * After a Fuse or a ByteLevel there is only one token left, which arrives in fragments: Strip
 * then holds the characters it may still remove, Metaspace goes on character by character, and
 * the others (rare there) hold the whole token until finish.
 *
 * lora_tokenizer_decode pushes every id through the same chain and finishes it, so the pieces
 * of a stream always add up to the decoded text, however the ids were cut. Every stage emits
 * whole UTF-8 characters only (token strings are valid UTF-8, byte output goes through the
 * lossy decoder), so each piece is valid UTF-8 by itself.
 */
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"

static const char replacement_char[] = "\xef\xbf\xbd"; /* U+FFFD */

/* ---- parsing ------------------------------------------------------------------------------- */

static void dec_free_one(struct tk_dec *d)
{
    tk_pattern_free(&d->pat);
    free(d->content);
}

void tk_dec_free(struct lora_tokenizer *t)
{
    for (size_t i = 0; i < t->n_dec; i++)
        dec_free_one(&t->dec[i]);
    free(t->dec);
    t->dec = NULL;
    t->n_dec = 0;
}

static int parse_replace(struct tk_ctx *c, const json_t *v, struct tk_dec *d)
{
    static const char *const keys[] = {"type", "pattern", "content", NULL};
    const char *s;
    size_t len, saved;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "pattern"))
        return tk_fail_key(c, "pattern", "is missing");
    saved = tk_path_key(c, "pattern");
    if (tk_pattern_parse(c, json_object_get(v, "pattern"), &d->pat) < 0)
        return -1;
    tk_path_pop(c, saved);
    if (tk_get_str(c, v, "content", true, &s, &len) < 0)
        return -1;
    d->content = tk_strdup(c, s, len);
    d->content_len = len;
    return d->content ? 0 : -1;
}

static int parse_metaspace(struct tk_ctx *c, const json_t *v, struct tk_dec *d)
{
    static const char *const keys[] = {
        "type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep", NULL};
    const char *scheme, *unused;
    size_t len;
    bool add_prefix_space, split;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "replacement"))
        return tk_fail_key(c, "replacement", "is missing");
    if (tk_get_char(c, v, "replacement", 0x2581, &d->ch) < 0 ||
        tk_get_bool(c, v, "split", true, &split) < 0 ||
        tk_get_bool(c, v, "add_prefix_space", true, &add_prefix_space) < 0 ||
        tk_get_str(c, v, "str_rep", false, &unused, &len) < 0 ||
        tk_get_str(c, v, "prepend_scheme", false, &scheme, &len) < 0)
        return -1;
    d->prepend = add_prefix_space;
    if (!scheme)
        return 0;
    if (strcmp(scheme, "always") != 0 && strcmp(scheme, "first") != 0 &&
        strcmp(scheme, "never") != 0)
        return tk_fail_key(c, "prepend_scheme", "unsupported '%s'", scheme);
    d->prepend = strcmp(scheme, "never") != 0;
    return 0;
}

static int parse_strip(struct tk_ctx *c, const json_t *v, struct tk_dec *d)
{
    static const char *const keys[] = {"type", "content", "start", "stop", NULL};
    long long start, stop;

    if (tk_check_object(c, v, keys) < 0)
        return -1;
    if (!json_object_get(v, "content"))
        return tk_fail_key(c, "content", "is missing");
    if (tk_get_char(c, v, "content", ' ', &d->ch) < 0 ||
        tk_get_int(c, v, "start", 0, 1 << 20, 0, &start) < 0 ||
        tk_get_int(c, v, "stop", 0, 1 << 20, 0, &stop) < 0)
        return -1;
    d->start = (size_t)start;
    d->stop = (size_t)stop;
    return 0;
}

/* Appends the decoder v to the chain of the tokenizer arg. */
static int add_leaf(struct tk_ctx *c, const json_t *v, const char *type, void *arg)
{
    static const char *const only_type[] = {"type", NULL};
    static const char *const byte_level[] = {"type", "add_prefix_space", "trim_offsets",
                                             "use_regex", NULL};
    struct lora_tokenizer *t = arg;
    struct tk_dec *dec = tk_array_append(c, t->dec, &t->n_dec, sizeof(*dec)), *d;

    if (!dec)
        return -1;
    t->dec = dec;
    d = &dec[t->n_dec - 1];
    if (strcmp(type, "ByteLevel") == 0) {
        /* Its options only matter to offsets and encoding. */
        d->kind = TK_DEC_BYTE_LEVEL;
        return tk_check_object(c, v, byte_level);
    }
    if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        d->kind = type[0] == 'B' ? TK_DEC_BYTE_FALLBACK : TK_DEC_FUSE;
        return tk_check_object(c, v, only_type);
    }
    if (strcmp(type, "Replace") == 0) {
        d->kind = TK_DEC_REPLACE;
        return parse_replace(c, v, d);
    }
    if (strcmp(type, "Metaspace") == 0) {
        d->kind = TK_DEC_METASPACE;
        return parse_metaspace(c, v, d);
    }
    if (strcmp(type, "Strip") == 0) {
        d->kind = TK_DEC_STRIP;
        return parse_strip(c, v, d);
    }
    t->n_dec--;
    return tk_fail_key(c, "type", "unsupported '%s'", type);
}

int tk_dec_parse(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t)
{
    t->has_decoder = v && !json_is_null(v);
    if (!t->has_decoder)
        return 0;
    return tk_parse_flat(c, v, "decoders", add_leaf, t);
}

/* ---- the streaming chain ------------------------------------------------------------------- */

/* One decoder's state in a stream. */
struct stage {
    const struct tk_dec *d;
    bool frag;             /* its input is the fragments of one token (after Fuse, ByteLevel) */
    bool got;              /* frag: a fragment has arrived */
    bool sent;             /* a token has been passed on (Fuse, ByteLevel, frag Strip) */
    bool started;          /* Metaspace: a token has arrived */
    size_t index;          /* Metaspace: the index of the current token */
    size_t start_left;     /* frag Strip: leading characters still to test */
    size_t held;           /* frag Strip: trailing content characters held back */
    struct tk_lossy lossy; /* ByteLevel */
    struct lora_buf buf;   /* ByteFallback's run; a frag stage's whole token */
    struct lora_buf out;   /* what this stage passes on */
};

struct lora_detok {
    const struct lora_tokenizer *t;
    bool skip_special;
    size_t n_tokens;     /* tokens that reached the end (joined by spaces without a decoder) */
    struct stage *st;    /* (t->n_dec) */
    struct lora_buf out; /* final text not yet handed out */
    pcre2_match_data *md;
    char *err;
    size_t err_len;
};

static int push(struct lora_detok *d, size_t k, const char *s, size_t n, bool new_tok);

static void stage_reset(struct stage *st)
{
    st->got = st->sent = st->started = false;
    st->index = 0;
    st->start_left = st->d->start;
    st->held = 0;
    st->lossy.n_pending = 0;
    st->buf.len = 0;
}

static int oom(struct lora_detok *d)
{
    lora_errf(d->err, d->err_len, "out of memory");
    return -1;
}

/* Sends st->out on as (a fragment of) one token. */
static int pass_on(struct lora_detok *d, size_t k, bool new_tok)
{
    struct stage *st = &d->st[k];

    return push(d, k + 1, st->out.data ? st->out.data : "", st->out.len, new_tok);
}

/* Sends st->out on as the next fragment of the one token this stage makes (nothing when empty:
 * the token starts with its first text). */
static int send_fragment(struct lora_detok *d, size_t k)
{
    struct stage *st = &d->st[k];
    bool first = !st->sent;

    if (st->out.len == 0)
        return 0;
    st->sent = true;
    return pass_on(d, k, first);
}

static int replace_token(struct lora_detok *d, size_t k, const char *s, size_t n)
{
    struct stage *st = &d->st[k];
    const struct tk_dec *dec = st->d;
    size_t at = 0, from = 0, ms, me;
    int rc;

    st->out.len = 0;
    while ((rc = tk_pattern_next(&dec->pat, s, n, from, d->md, &ms, &me, d->err, d->err_len)) ==
           1) {
        if (lora_buf_add(&st->out, s + at, ms - at) < 0 ||
            lora_buf_add(&st->out, dec->content, dec->content_len) < 0)
            return oom(d);
        at = from = me;
        if (me == ms) {
            uint32_t cp;

            if (me == n)
                break;
            from += (size_t)tk_utf8_get(s + me, &cp);
        }
    }
    if (rc < 0)
        return -1;
    if (lora_buf_add(&st->out, s + at, n - at) < 0)
        return oom(d);
    return pass_on(d, k, true);
}

/* Hugging Face's test: six bytes "<0x" H H ">", where HH parses as u8::from_str_radix(_, 16)
 * does (which also takes "+H"). */
static int byte_token(const char *s, size_t n)
{
    int v = 0;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        int x = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;

        if (i == 3 && ch == '+')
            continue;
        if (x < 0)
            return -1;
        v = v * 16 + x;
    }
    return v;
}

/* Ends a run of byte tokens: its text when the bytes are valid UTF-8, else one U+FFFD token
 * per byte. */
static int byte_run_flush(struct lora_detok *d, size_t k)
{
    struct stage *st = &d->st[k];
    size_t n = st->buf.len;

    if (n == 0)
        return 0;
    st->buf.len = 0;
    if (tk_utf8_check(st->buf.data, n) == n) {
        st->out.len = 0;
        if (lora_buf_add(&st->out, st->buf.data, n) < 0)
            return oom(d);
        return pass_on(d, k, true);
    }
    for (size_t i = 0; i < n; i++)
        if (push(d, k + 1, replacement_char, 3, true) < 0)
            return -1;
    return 0;
}

static int byte_fallback_token(struct lora_detok *d, size_t k, const char *s, size_t n)
{
    struct stage *st = &d->st[k];
    int b = byte_token(s, n);
    unsigned char byte = (unsigned char)b;

    if (b >= 0)
        return lora_buf_add(&st->buf, &byte, 1) < 0 ? oom(d) : 0;
    if (byte_run_flush(d, k) < 0)
        return -1;
    return push(d, k + 1, s, n, true);
}

/* Hugging Face's Strip on one whole token: up to start leading and stop trailing content
 * characters go. */
static int strip_token(struct lora_detok *d, size_t k, const char *s, size_t n)
{
    const struct tk_dec *dec = d->st[k].d;
    size_t a = 0, b = n;
    uint32_t cp;

    for (size_t i = 0; i < dec->start && a < n; i++) {
        int len = tk_utf8_get(s + a, &cp);

        if (cp != dec->ch)
            break;
        a += (size_t)len;
    }
    for (size_t i = 0; i < dec->stop && b > a; i++) {
        size_t j = b - 1;

        while (j > a && ((unsigned char)s[j] & 0xc0) == 0x80)
            j--;
        tk_utf8_get(s + j, &cp);
        if (cp != dec->ch)
            break;
        b = j;
    }
    return push(d, k + 1, s + a, b - a, true);
}

/* Strip on the fragments of one token: leading content characters go as they come; trailing
 * ones wait (up to stop of them) until a character that is not one, or finish, decides. */
static int strip_fragment(struct lora_detok *d, size_t k, const char *s, size_t n)
{
    struct stage *st = &d->st[k];
    const struct tk_dec *dec = st->d;
    char ch[4];
    size_t ch_len = (size_t)tk_utf8_put(dec->ch, ch);

    st->out.len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = (size_t)tk_utf8_get(s + i, &cp);
        bool is_content = cp == dec->ch;

        if (st->start_left && is_content) {
            st->start_left--;
            i += len;
            continue;
        }
        st->start_left = 0;
        if (is_content && dec->stop) {
            if (st->held < dec->stop)
                st->held++;
            else if (lora_buf_add(&st->out, ch, ch_len) < 0) /* the oldest held one is safe */
                return oom(d);
            i += len;
            continue;
        }
        for (; st->held; st->held--)
            if (lora_buf_add(&st->out, ch, ch_len) < 0)
                return oom(d);
        if (lora_buf_add(&st->out, s + i, len) < 0)
            return oom(d);
        i += len;
    }
    return send_fragment(d, k);
}

static int metaspace_token(struct lora_detok *d, size_t k, const char *s, size_t n, bool new_tok)
{
    struct stage *st = &d->st[k];
    const struct tk_dec *dec = st->d;

    if (new_tok) {
        st->index += st->started;
        st->started = true;
    }
    st->out.len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = (size_t)tk_utf8_get(s + i, &cp);

        if (cp != dec->ch) {
            if (lora_buf_add(&st->out, s + i, len) < 0)
                return oom(d);
        } else if (!(st->index == 0 && dec->prepend) && lora_buf_add(&st->out, " ", 1) < 0) {
            return oom(d);
        }
        i += len;
    }
    return pass_on(d, k, new_tok);
}

/* ByteLevel: a token whose every character stands for a byte is those bytes; any other token
 * is its own UTF-8. */
static int byte_level_token(struct lora_detok *d, size_t k, const char *s, size_t n)
{
    struct stage *st = &d->st[k];
    bool all_bytes = true;
    size_t m = 0;

    if (lora_buf_reserve(&st->buf, n) < 0)
        return oom(d);
    for (size_t i = 0; i < n && all_bytes;) {
        uint32_t cp;
        int b;

        i += (size_t)tk_utf8_get(s + i, &cp);
        b = tk_char_byte(cp);
        all_bytes = b >= 0;
        st->buf.data[m++] = (char)b;
    }
    st->out.len = 0;
    if (tk_lossy_feed(&st->lossy, all_bytes ? st->buf.data : s, all_bytes ? m : n, &st->out) < 0)
        return oom(d);
    return send_fragment(d, k);
}

/* One whole token through stage k. */
static int stage_token(struct lora_detok *d, size_t k, const char *s, size_t n, bool new_tok)
{
    struct stage *st = &d->st[k];
    bool first;

    switch (st->d->kind) {
    case TK_DEC_REPLACE:
        return replace_token(d, k, s, n);
    case TK_DEC_BYTE_FALLBACK:
        return byte_fallback_token(d, k, s, n);
    case TK_DEC_STRIP:
        return strip_token(d, k, s, n);
    case TK_DEC_METASPACE:
        return metaspace_token(d, k, s, n, new_tok);
    case TK_DEC_BYTE_LEVEL:
        return byte_level_token(d, k, s, n);
    case TK_DEC_FUSE:
        first = !st->sent;
        st->sent = true;
        return push(d, k + 1, s, n, first);
    }
    return -1;
}

/* Stage k receives s[0, n): a token (new_tok), or the next fragment of the current one. */
static int push(struct lora_detok *d, size_t k, const char *s, size_t n, bool new_tok)
{
    struct stage *st;

    if (k == d->t->n_dec) {
        if (!d->t->has_decoder && new_tok && d->n_tokens++ > 0 && lora_buf_add(&d->out, " ", 1) < 0)
            return oom(d);
        return lora_buf_add(&d->out, s, n) < 0 ? oom(d) : 0;
    }
    st = &d->st[k];
    if (!st->frag)
        return stage_token(d, k, s, n, new_tok);
    switch (st->d->kind) {
    case TK_DEC_FUSE:
        return push(d, k + 1, s, n, new_tok);
    case TK_DEC_METASPACE:
        return metaspace_token(d, k, s, n, new_tok);
    case TK_DEC_STRIP:
        return strip_fragment(d, k, s, n);
    default:
        /* Held whole until finish (see the header comment). */
        st->got = true;
        return lora_buf_add(&st->buf, s, n) < 0 ? oom(d) : 0;
    }
}

/* Ends the stream at stage k and after it: what is held is decided and passed on. */
static int finish(struct lora_detok *d, size_t k)
{
    struct stage *st;

    if (k == d->t->n_dec) {
        d->n_tokens = 0;
        return 0;
    }
    st = &d->st[k];
    if (st->frag && st->got) {
        /* The whole token, held: decode it as a token now. */
        struct lora_buf whole = st->buf;
        int rc;

        st->buf = (struct lora_buf){0};
        rc = stage_token(d, k, whole.data ? whole.data : "", whole.len, true);
        lora_buf_release(&whole);
        if (rc < 0)
            return -1;
    }
    if (st->d->kind == TK_DEC_BYTE_FALLBACK && byte_run_flush(d, k) < 0)
        return -1;
    if (st->d->kind == TK_DEC_BYTE_LEVEL) {
        st->out.len = 0;
        if (tk_lossy_flush(&st->lossy, &st->out) < 0)
            return oom(d);
        if (send_fragment(d, k) < 0)
            return -1;
    }
    stage_reset(st);
    return finish(d, k + 1);
}

/* ---- decoders ------------------------------------------------------------------------------ */

static int detok_init(struct lora_detok *d, const struct lora_tokenizer *t, bool skip_special)
{
    memset(d, 0, sizeof(*d));
    d->t = t;
    d->skip_special = skip_special;
    d->md = tk_match_data_new();
    d->st = calloc(t->n_dec ? t->n_dec : 1, sizeof(*d->st));
    if (!d->md || !d->st)
        return -1;
    for (size_t k = 0; k < t->n_dec; k++) {
        d->st[k].d = &t->dec[k];
        d->st[k].frag = k > 0 && (d->st[k - 1].frag || t->dec[k - 1].kind == TK_DEC_FUSE ||
                                  t->dec[k - 1].kind == TK_DEC_BYTE_LEVEL);
        stage_reset(&d->st[k]);
    }
    return 0;
}

static void detok_release(struct lora_detok *d)
{
    for (size_t k = 0; d->st && k < d->t->n_dec; k++) {
        lora_buf_release(&d->st[k].buf);
        lora_buf_release(&d->st[k].out);
    }
    free(d->st);
    lora_buf_release(&d->out);
    pcre2_match_data_free(d->md);
    memset(d, 0, sizeof(*d));
}

/* Checks every id first, so that a bad one leaves the stream as it was. */
static int push_ids(struct lora_detok *d, const int32_t *ids, size_t n)
{
    const struct lora_tokenizer *t = d->t;

    for (size_t i = 0; i < n; i++) {
        if (!tk_vocab_has(&t->vocab, ids[i])) {
            lora_errf(d->err, d->err_len, "id %d is not in the vocabulary (size %zu)", ids[i],
                      t->vocab.n_ids);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];

        if (d->skip_special && t->special[id])
            continue;
        if (push(d, 0, t->vocab.pool + t->vocab.off[id], t->vocab.len[id], true) < 0)
            return -1;
    }
    return 0;
}

/* Hands the final text out as a new string. */
static int take_out(struct lora_detok *d, char **piece, size_t *len)
{
    *len = d->out.len;
    if (d->out.data) {
        *piece = d->out.data;
        d->out = (struct lora_buf){0};
        return 0;
    }
    *piece = calloc(1, 1);
    return *piece ? 0 : oom(d);
}

int lora_tokenizer_decode(const struct lora_tokenizer *t, const int32_t *ids, size_t n,
                          bool skip_special_tokens, char **out, size_t *out_len, char *err,
                          size_t err_len)
{
    struct lora_detok d;
    int rc = -1;

    *out = NULL;
    *out_len = 0;
    if (detok_init(&d, t, skip_special_tokens) < 0) {
        lora_errf(err, err_len, "out of memory");
        goto out;
    }
    d.err = err;
    d.err_len = err_len;
    if (push_ids(&d, ids, n) < 0 || finish(&d, 0) < 0 || take_out(&d, out, out_len) < 0)
        goto out;
    rc = 0;
out:
    detok_release(&d);
    return rc;
}

struct lora_detok *lora_detok_new(const struct lora_tokenizer *t, bool skip_special_tokens)
{
    struct lora_detok *d = malloc(sizeof(*d));

    if (!d)
        return NULL;
    if (detok_init(d, t, skip_special_tokens) < 0) {
        detok_release(d);
        free(d);
        return NULL;
    }
    return d;
}

void lora_detok_destroy(struct lora_detok **d)
{
    if (!d || !*d)
        return;
    detok_release(*d);
    free(*d);
    *d = NULL;
}

int lora_detok_push(struct lora_detok *d, const int32_t *ids, size_t n, char **piece, size_t *len,
                    char *err, size_t err_len)
{
    *piece = NULL;
    *len = 0;
    d->err = err;
    d->err_len = err_len;
    if (push_ids(d, ids, n) < 0)
        return -1;
    return take_out(d, piece, len);
}

int lora_detok_finish(struct lora_detok *d, char **piece, size_t *len, char *err, size_t err_len)
{
    *piece = NULL;
    *len = 0;
    d->err = err;
    d->err_len = err_len;
    if (finish(d, 0) < 0)
        return -1;
    return take_out(d, piece, len);
}
