/* chat_template: recognising a Jinja chat template's family and rendering it natively; see
 * chat_template.h. In the order data flows: growable strings, the canonical form of a template,
 * detection per family, built-in templates, tokenizer_config.json, rendering.
 */
#include "text/chat_template.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <utf8proc.h>

#include "base/errbuf.h"

#define HINT "pass --chat-template chatml|llama3|llama2|mistral"

/* A template file beside tokenizer_config.json is read whole; real ones are a few KiB. */
#define MAX_TEMPLATE_BYTES (1 << 20)

/* ---- growable strings ------------------------------------------------------------------ */

/* Prompts hold user input of any size, so growth is a try-alloc: a failure sets oom, later
 * appends do nothing, and the caller reports it once. p is NUL-terminated once allocated. */
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static bool sb_reserve(struct sbuf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (b->oom)
        return false;
    if (extra > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return false;
    }
    need = b->len + extra + 1;
    if (need <= b->cap)
        return true;
    cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (!sb_reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void sb_char(struct sbuf *b, char ch)
{
    sb_add(b, &ch, 1);
}

/* Appends b's own bytes [off, off + n): reserving first keeps the source valid. */
static void sb_add_self(struct sbuf *b, size_t off, size_t n)
{
    if (!sb_reserve(b, n))
        return;
    memmove(b->p + b->len, b->p + off, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_free(struct sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- canonical form ---------------------------------------------------------------------
 *
 * The template is lexed as Jinja2 does under transformers' settings (trim_blocks,
 * lstrip_blocks, "-" whitespace control, one trailing newline dropped) and written back as:
 * - {%TOKENS%} per statement and {{TOKENS}} per output expression, with no whitespace except
 *   one space between two adjacent words or numbers;
 * - every string as "..." with \\, \" and \n escaped; x['y'] as x.y; "a" + "b" as "ab";
 * - an output that is a string concatenation split into one {{...}} per term;
 * - literal output (strings and raw text) merged across adjacent outputs into one {{"..."}};
 * - the variable of a loop over messages (or loop_messages) renamed to message;
 * - comments dropped.
 * Detection then matches snippets written in Jinja and put through the same function, so
 * quoting and spacing choices of a template do not matter.
 */

enum tag_kind { TAG_NONE, TAG_EXPR, TAG_BLOCK, TAG_COMMENT };
enum tok_kind { TK_WORD, TK_NUM, TK_STR, TK_OP };

struct tok {
    enum tok_kind kind;
    const char *fixed; /* static text (a rewritten token), else off/len below */
    bool in_strs;      /* text at strs + off (decoded strings), else at src + off */
    size_t off, len;
};

#define MAX_LOOPS 16

struct loop_var {
    size_t off, len; /* the name in src; len 0 for a loop we do not rename */
    bool is_message;
};

struct canon {
    const char *src;
    size_t len;
    struct sbuf *out;
    struct sbuf lit;  /* pending literal output */
    struct sbuf strs; /* decoded string literals of the current tag */
    struct tok *toks;
    size_t n_toks, cap_toks;
    struct loop_var loops[MAX_LOOPS];
    int depth;    /* loop nesting; only the first MAX_LOOPS are recorded */
    bool partial; /* a snippet may end inside a tag: it is written without its close */
    bool oom;
    const char *error; /* a syntax error, at byte error_at */
    size_t error_at;
};

static bool is_blank(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool is_word_start(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static bool is_digit(char ch)
{
    return ch >= '0' && ch <= '9';
}

static bool is_word_char(char ch)
{
    return is_word_start(ch) || is_digit(ch);
}

static const char *tok_text(const struct canon *c, const struct tok *t)
{
    if (t->fixed)
        return t->fixed;
    return t->in_strs ? c->strs.p + t->off : c->src + t->off;
}

static bool tok_is(const struct canon *c, const struct tok *t, enum tok_kind kind, const char *s)
{
    return t->kind == kind && t->len == strlen(s) && memcmp(tok_text(c, t), s, t->len) == 0;
}

static void push_tok(struct canon *c, struct tok t)
{
    if (c->n_toks == c->cap_toks) {
        size_t cap = c->cap_toks ? c->cap_toks * 2 : 64;
        struct tok *p = realloc(c->toks, cap * sizeof(*p));

        if (!p) {
            c->oom = true;
            return;
        }
        c->toks = p;
        c->cap_toks = cap;
    }
    c->toks[c->n_toks++] = t;
}

static int hex_value(char ch)
{
    if (is_digit(ch))
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static void put_codepoint(struct canon *c, int32_t v)
{
    utf8proc_uint8_t buf[4];

    sb_add(&c->strs, (const char *)buf, (size_t)utf8proc_encode_char(v, buf));
}

/* Decodes one escape of a Jinja string (Python's unicode-escape) at src[*p] (after the
 * backslash) into c->strs. An unknown escape keeps its backslash, as Python does. */
static int lex_escape(struct canon *c, size_t *p)
{
    static const char simple_in[] = "nrt\\'\"abfv";
    static const char simple_out[] = "\n\r\t\\'\"\a\b\f\v";
    char ch = c->src[*p];
    const char *hit = strchr(simple_in, ch);
    int digits = ch == 'x' ? 2 : ch == 'u' ? 4 : ch == 'U' ? 8 : 0;

    if (ch && hit) {
        sb_char(&c->strs, simple_out[hit - simple_in]);
        (*p)++;
        return 0;
    }
    if (ch >= '0' && ch <= '7') {
        int32_t v = 0;

        for (int i = 0; i < 3 && c->src[*p] >= '0' && c->src[*p] <= '7'; i++)
            v = v * 8 + (c->src[(*p)++] - '0');
        put_codepoint(c, v);
        return 0;
    }
    if (digits > 0) {
        uint32_t v = 0; /* eight digits overflow int32_t */

        for (int i = 1; i <= digits; i++) {
            int h = hex_value(c->src[*p + (size_t)i]);

            if (h < 0)
                return -1;
            v = v * 16 + (uint32_t)h;
        }
        if (v > 0x10ffff || !utf8proc_codepoint_valid((utf8proc_int32_t)v))
            return -1;
        *p += (size_t)digits + 1;
        put_codepoint(c, (int32_t)v);
        return 0;
    }
    sb_char(&c->strs, '\\');
    return 0;
}

/* Lexes the string literal at src[*p] (its opening quote) into c->strs. */
static int lex_string(struct canon *c, size_t *p)
{
    char quote = c->src[*p];
    struct tok t = {.kind = TK_STR, .in_strs = true, .off = c->strs.len};
    size_t start = *p;

    (*p)++;
    while (*p < c->len && c->src[*p] != quote) {
        if (c->src[*p] != '\\') {
            sb_char(&c->strs, c->src[(*p)++]);
            continue;
        }
        (*p)++;
        if (*p >= c->len || lex_escape(c, p) < 0) {
            c->error = "invalid escape in a string";
            c->error_at = start;
            return -1;
        }
    }
    if (*p >= c->len) {
        c->error = "unterminated string";
        c->error_at = start;
        return -1;
    }
    (*p)++;
    t.len = c->strs.len - t.off;
    push_tok(c, t);
    return 0;
}

/* Lexes the body of a {{ }} or {% %} tag from src[*p] to its closing delimiter, leaving *p
 * after it. *strip is set for "-}}" / "-%}", *keep_newline for "+%}". Returns 0, 1 when a
 * partial snippet ends inside the tag, or -1. */
static int lex_tag(struct canon *c, size_t *p, enum tag_kind kind, bool *strip, bool *keep_newline)
{
    static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
    char close = kind == TAG_EXPR ? '}' : '%';
    size_t start = *p;
    int curly = 0;

    c->n_toks = 0;
    c->strs.len = 0;
    *strip = *keep_newline = false;
    for (;;) {
        while (*p < c->len && is_blank(c->src[*p]))
            (*p)++;
        if (*p >= c->len && c->partial)
            return 1;
        if (*p >= c->len) {
            c->error = kind == TAG_EXPR ? "unterminated {{" : "unterminated {%";
            c->error_at = start;
            return -1;
        }
        const char *s = c->src + *p;
        if (curly == 0 && s[0] == close && s[1] == '}') {
            *p += 2;
            return 0;
        }
        if (curly == 0 && (s[0] == '-' || s[0] == '+') && s[1] == close && s[2] == '}') {
            *strip = s[0] == '-';
            *keep_newline = s[0] == '+';
            *p += 3;
            return 0;
        }
        if (s[0] == '\'' || s[0] == '"') {
            if (lex_string(c, p) < 0)
                return -1;
            continue;
        }
        struct tok t = {.kind = TK_OP, .off = *p, .len = 1};
        if (is_word_start(s[0])) {
            t.kind = TK_WORD;
            while (is_word_char(c->src[*p + t.len]))
                t.len++;
        } else if (is_digit(s[0])) {
            t.kind = TK_NUM;
            while (is_digit(c->src[*p + t.len]))
                t.len++;
            if (c->src[*p + t.len] == '.' && is_digit(c->src[*p + t.len + 1])) {
                t.len++;
                while (is_digit(c->src[*p + t.len]))
                    t.len++;
            }
        } else {
            for (size_t i = 0; i < sizeof(two) / sizeof(two[0]); i++)
                if (s[0] == two[i][0] && s[1] == two[i][1])
                    t.len = 2;
            curly += s[0] == '{' ? 1 : s[0] == '}' ? -1 : 0;
        }
        *p += t.len;
        push_tok(c, t);
    }
}

static bool is_prefix_op(const struct canon *c, const struct tok *t)
{
    static const char *const ops[] = {"*", "/", "%", "//", "**", "|", ".", "-"};

    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        if (tok_is(c, t, TK_OP, ops[i]))
            return true;
    return false;
}

static bool is_postfix_op(const struct canon *c, const struct tok *t)
{
    return tok_is(c, t, TK_OP, "|") || tok_is(c, t, TK_OP, ".") || tok_is(c, t, TK_OP, "[") ||
           tok_is(c, t, TK_OP, "(");
}

/* "a" + "b" -> "ab", where nothing binding tighter touches either string. */
static void merge_concat(struct canon *c)
{
    size_t i = 0;

    while (i + 2 < c->n_toks) {
        struct tok *a = &c->toks[i], *op = &c->toks[i + 1], *b = &c->toks[i + 2];
        bool concat = tok_is(c, op, TK_OP, "+") || tok_is(c, op, TK_OP, "~");

        if (a->kind != TK_STR || b->kind != TK_STR || !concat ||
            (i > 0 && is_prefix_op(c, &c->toks[i - 1])) ||
            (i + 3 < c->n_toks && is_postfix_op(c, &c->toks[i + 3]))) {
            i++;
            continue;
        }
        size_t off = c->strs.len;
        sb_add_self(&c->strs, a->off, a->len);
        sb_add_self(&c->strs, b->off, b->len);
        a->off = off;
        a->len += b->len;
        memmove(op, b + 1, (c->n_toks - i - 3) * sizeof(*op));
        c->n_toks -= 2;
    }
}

static bool is_identifier(const char *s, size_t n)
{
    if (n == 0 || !is_word_start(s[0]))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!is_word_char(s[i]))
            return false;
    return true;
}

/* x['y'] -> x.y when y is an identifier. */
static void normalise_subscripts(struct canon *c)
{
    for (size_t i = 1; i + 2 < c->n_toks; i++) {
        struct tok *prev = &c->toks[i - 1], *s = &c->toks[i + 1];

        if (!tok_is(c, &c->toks[i], TK_OP, "[") || s->kind != TK_STR ||
            !tok_is(c, &c->toks[i + 2], TK_OP, "]") || !is_identifier(tok_text(c, s), s->len))
            continue;
        if (prev->kind != TK_WORD && !tok_is(c, prev, TK_OP, ")") && !tok_is(c, prev, TK_OP, "]"))
            continue;
        c->toks[i] = (struct tok){.kind = TK_OP, .fixed = ".", .len = 1};
        s->kind = TK_WORD;
        memmove(&c->toks[i + 2], &c->toks[i + 3], (c->n_toks - i - 3) * sizeof(*s));
        c->n_toks--;
    }
}

/* Records the variable of {% for NAME in messages|loop_messages ... %}; pops on endfor. */
static void track_loops(struct canon *c)
{
    struct tok *t = c->toks;

    if (c->n_toks >= 1 && tok_is(c, &t[0], TK_WORD, "endfor")) {
        if (c->depth > 0)
            c->depth--;
        return;
    }
    if (c->n_toks < 1 || !tok_is(c, &t[0], TK_WORD, "for"))
        return;
    if (c->depth < MAX_LOOPS) {
        struct loop_var *v = &c->loops[c->depth];

        memset(v, 0, sizeof(*v));
        if (c->n_toks >= 4 && t[1].kind == TK_WORD && !t[1].in_strs &&
            tok_is(c, &t[2], TK_WORD, "in")) {
            v->off = t[1].off;
            v->len = t[1].len;
            v->is_message =
                tok_is(c, &t[3], TK_WORD, "messages") || tok_is(c, &t[3], TK_WORD, "loop_messages");
        }
    }
    c->depth++;
}

/* The name a word is written as: a loop variable over the messages becomes "message". */
static const char *word_alias(const struct canon *c, const struct tok *t)
{
    const char *s = tok_text(c, t);
    int top = c->depth < MAX_LOOPS ? c->depth : MAX_LOOPS;

    for (int i = top - 1; i >= 0; i--) {
        const struct loop_var *v = &c->loops[i];

        if (v->len == t->len && memcmp(c->src + v->off, s, t->len) == 0)
            return v->is_message ? "message" : NULL;
    }
    return NULL;
}

static void put_escaped(struct sbuf *b, const char *s, size_t n)
{
    sb_char(b, '"');
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' || s[i] == '"')
            sb_char(b, '\\');
        if (s[i] == '\n')
            sb_str(b, "\\n");
        else
            sb_char(b, s[i]);
    }
    sb_char(b, '"');
}

static void flush_lit(struct canon *c)
{
    if (c->lit.len == 0)
        return;
    sb_str(c->out, "{{");
    put_escaped(c->out, c->lit.p, c->lit.len);
    sb_str(c->out, "}}");
    c->lit.len = 0;
}

static void put_tokens(struct canon *c, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        const struct tok *t = &c->toks[i];
        bool wordish = t->kind == TK_WORD || t->kind == TK_NUM;

        if (i > from && wordish &&
            (c->toks[i - 1].kind == TK_WORD || c->toks[i - 1].kind == TK_NUM))
            sb_char(c->out, ' ');
        if (t->kind == TK_STR) {
            put_escaped(c->out, tok_text(c, t), t->len);
            continue;
        }
        const char *alias = NULL;
        if (t->kind == TK_WORD && (i == 0 || !tok_is(c, &c->toks[i - 1], TK_OP, ".")))
            alias = word_alias(c, t);
        if (alias)
            sb_str(c->out, alias);
        else
            sb_add(c->out, tok_text(c, t), t->len);
    }
}

/* Whether the expression is a top-level chain of + / ~, so it can be written as one output
 * per term. A bare number among the terms makes it an addition, which is left whole. */
static bool is_string_chain(const struct canon *c)
{
    static const char *const words[] = {"if", "else", "and", "or", "not", "in", "is"};
    int depth = 0;
    size_t n_concat = 0, term_len = 0;
    bool has_number = false;

    for (size_t i = 0; i < c->n_toks; i++) {
        const struct tok *t = &c->toks[i];
        const char *s = tok_text(c, t);

        if (t->kind == TK_OP && t->len == 1 && strchr("([{", s[0]))
            depth++;
        else if (t->kind == TK_OP && t->len == 1 && strchr(")]}", s[0]))
            depth--;
        else if (depth == 0 && t->kind == TK_OP) {
            if (tok_is(c, t, TK_OP, "+") || tok_is(c, t, TK_OP, "~")) {
                n_concat++;
                term_len = 0;
                continue;
            }
            if (!tok_is(c, t, TK_OP, "|") && !tok_is(c, t, TK_OP, "."))
                return false;
        } else if (depth == 0 && t->kind == TK_WORD && !t->in_strs && !t->fixed) {
            for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
                if (tok_is(c, t, TK_WORD, words[w]))
                    return false;
        }
        term_len++;
        bool next_ends = i + 1 == c->n_toks || tok_is(c, &c->toks[i + 1], TK_OP, "+") ||
                         tok_is(c, &c->toks[i + 1], TK_OP, "~");
        if (depth == 0 && term_len == 1 && t->kind == TK_NUM && next_ends)
            has_number = true;
    }
    return n_concat > 0 && !has_number;
}

static void put_expr(struct canon *c)
{
    size_t from = 0;

    merge_concat(c);
    normalise_subscripts(c);
    if (!is_string_chain(c)) {
        if (c->n_toks == 1 && c->toks[0].kind == TK_STR) {
            sb_add(&c->lit, tok_text(c, &c->toks[0]), c->toks[0].len);
            return;
        }
        flush_lit(c);
        sb_str(c->out, "{{");
        put_tokens(c, 0, c->n_toks);
        sb_str(c->out, "}}");
        return;
    }
    int depth = 0;
    for (size_t i = 0; i <= c->n_toks; i++) {
        bool end = i == c->n_toks;

        if (!end) {
            const struct tok *t = &c->toks[i];
            const char *s = tok_text(c, t);

            if (t->kind == TK_OP && t->len == 1 && strchr("([{", s[0]))
                depth++;
            if (t->kind == TK_OP && t->len == 1 && strchr(")]}", s[0]))
                depth--;
            end = depth == 0 && (tok_is(c, t, TK_OP, "+") || tok_is(c, t, TK_OP, "~"));
        }
        if (!end)
            continue;
        if (i - from == 1 && c->toks[from].kind == TK_STR) {
            sb_add(&c->lit, tok_text(c, &c->toks[from]), c->toks[from].len);
        } else {
            flush_lit(c);
            sb_str(c->out, "{{");
            put_tokens(c, from, i);
            sb_str(c->out, "}}");
        }
        from = i + 1;
    }
}

static void put_block(struct canon *c)
{
    /* transformers' {% generation %} marks assistant text for masks; it renders its body */
    if (c->n_toks == 1 && (tok_is(c, &c->toks[0], TK_WORD, "generation") ||
                           tok_is(c, &c->toks[0], TK_WORD, "endgeneration")))
        return;
    merge_concat(c);
    normalise_subscripts(c);
    track_loops(c);
    flush_lit(c);
    sb_str(c->out, "{%");
    put_tokens(c, 0, c->n_toks);
    sb_str(c->out, "%}");
}

/* The unclosed tag a partial snippet ends with, as its canonical opening. */
static void put_partial(struct canon *c, enum tag_kind kind)
{
    merge_concat(c);
    normalise_subscripts(c);
    flush_lit(c);
    sb_str(c->out, kind == TAG_EXPR ? "{{" : "{%");
    put_tokens(c, 0, c->n_toks);
}

/* Raw text src[s, e) between the previous tag and the next one, after trim_blocks,
 * lstrip_blocks and "-" control, becomes literal output. */
static void put_text(struct canon *c, size_t s, size_t e, enum tag_kind prev, bool prev_strip,
                     bool prev_keep, enum tag_kind next, bool next_strip, bool next_plus)
{
    size_t start = s;
    bool prev_block = prev == TAG_BLOCK || prev == TAG_COMMENT;
    bool next_block = next == TAG_BLOCK || next == TAG_COMMENT;

    if (prev_block && !prev_strip && !prev_keep && s < e && c->src[s] == '\n')
        s++;
    if (prev_strip)
        while (s < e && is_blank(c->src[s]))
            s++;
    if (next_block && !next_strip && !next_plus) {
        size_t k = e;

        while (k > start && (c->src[k - 1] == ' ' || c->src[k - 1] == '\t'))
            k--;
        if (k == 0 || (k > start && c->src[k - 1] == '\n'))
            e = k > s ? k : s;
    }
    if (next_strip)
        while (e > s && is_blank(c->src[e - 1]))
            e--;
    if (e > s)
        sb_add(&c->lit, c->src + s, e - s);
}

/* The position of the next tag opening at or after pos, or len. */
static size_t next_tag(const struct canon *c, size_t pos)
{
    for (size_t i = pos; i + 1 < c->len; i++)
        if (c->src[i] == '{' && strchr("{%#", c->src[i + 1]))
            return i;
    return c->len;
}

/* Appends the canonical form of src to out; partial: src is a snippet that may end inside a
 * tag. Returns 0, or -1 with *what and *at set (what is NULL when out of memory). */
static int canonicalise(const char *src, bool partial, struct sbuf *out, const char **what,
                        size_t *at)
{
    struct canon c = {.src = src, .len = strlen(src), .out = out, .partial = partial};
    enum tag_kind prev = TAG_NONE;
    bool prev_strip = false, prev_keep = false;
    size_t pos = 0;
    int rc = -1;

    if (c.len && src[c.len - 1] == '\n')
        c.len--;
    sb_str(&c.lit, ""); /* allocated from the start: tokens point into strs even when empty */
    sb_str(&c.strs, "");
    for (;;) {
        size_t open = next_tag(&c, pos);
        enum tag_kind next = TAG_NONE;
        bool next_strip = false, next_plus = false, strip = false, keep = false;

        if (open < c.len) {
            char k = src[open + 1];

            next = k == '{' ? TAG_EXPR : k == '%' ? TAG_BLOCK : TAG_COMMENT;
            next_strip = open + 2 < c.len && src[open + 2] == '-';
            next_plus = open + 2 < c.len && src[open + 2] == '+';
        }
        put_text(&c, pos, open, prev, prev_strip, prev_keep, next, next_strip, next_plus);
        if (open >= c.len)
            break;
        size_t p = open + 2 + (next_strip || next_plus);
        if (next == TAG_COMMENT) {
            const char *end = strstr(src + p, "#}");

            if (!end || (size_t)(end - src) + 2 > c.len) {
                c.error = "unterminated {#";
                c.error_at = open;
                goto out;
            }
            strip = (size_t)(end - src) > p && end[-1] == '-';
            pos = (size_t)(end - src) + 2;
        } else {
            int lexed = lex_tag(&c, &p, next, &strip, &keep);

            if (lexed < 0)
                goto out;
            if (lexed > 0) {
                put_partial(&c, next);
                rc = 0;
                goto out;
            }
            if (next == TAG_EXPR)
                put_expr(&c);
            else
                put_block(&c);
            pos = p;
        }
        prev = next;
        prev_strip = strip;
        prev_keep = keep;
    }
    flush_lit(&c);
    rc = 0;
out:
    if (c.oom || c.lit.oom || c.strs.oom || out->oom) {
        c.error = NULL;
        rc = -1;
    }
    if (rc < 0) {
        *what = c.error;
        *at = c.error_at;
    }
    sb_free(&c.lit);
    sb_free(&c.strs);
    free(c.toks);
    return rc;
}

int lora_chat_template_canonical(const char *jinja_source, char **out, size_t *out_len, char *err,
                                 size_t err_len)
{
    struct sbuf b = {0};
    const char *what;
    size_t at;

    *out = NULL;
    *out_len = 0;
    if (!jinja_source) {
        lora_errf(err, err_len, "no template");
        return -1;
    }
    sb_str(&b, "");
    if (b.oom || canonicalise(jinja_source, false, &b, &what, &at) < 0) {
        if (b.oom || !what)
            lora_errf(err, err_len, "out of memory canonicalising a template");
        else
            lora_errf(err, err_len, "the template does not parse: %s at byte %zu", what, at);
        sb_free(&b);
        return -1;
    }
    *out = b.p;
    *out_len = b.len;
    return 0;
}

/* ---- detection ---------------------------------------------------------------------------
 *
 * Snippets are Jinja; "message" stands for the loop variable over the messages. A detector
 * finds each snippet in the canonical template and reads parameters from the literals next
 * to it. Where the template differs, the error says which part was not found.
 */

struct det {
    struct sbuf canon; /* of the template */
    struct sbuf snip;  /* of the last snippet */
    struct sbuf text;  /* the last literal read */
    bool oom;
    char *err;
    size_t err_len;
};

static int det_fail(struct det *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int det_fail(struct det *d, const char *fmt, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    lora_errf(d->err, d->err_len, "unable to render chat template: %s; " HINT, what);
    return -1;
}

/* The canonical snippet, or a string no template contains when it cannot be built. */
static const char *snippet(struct det *d, const char *jinja)
{
    const char *what;
    size_t at;

    d->snip.len = 0;
    sb_str(&d->snip, "");
    if (d->snip.oom || canonicalise(jinja, true, &d->snip, &what, &at) < 0) {
        d->oom = true;
        return "\x01";
    }
    return d->snip.p;
}

/* Where snippet jinja occurs in the canonical template at or after from (NULL: the start). */
static const char *find_from(struct det *d, const char *from, const char *jinja)
{
    return strstr(from ? from : d->canon.p, snippet(d, jinja));
}

static const char *find(struct det *d, const char *jinja)
{
    return find_from(d, NULL, jinja);
}

/* The position after the first occurrence of snippet jinja at or after from, or NULL. */
static const char *find_end(struct det *d, const char *from, const char *jinja)
{
    const char *p = find_from(d, from, jinja);

    return p ? p + strlen(d->snip.p) : NULL;
}

/* The last occurrence of snippet jinja that starts before limit, or NULL. */
static const char *find_last_before(struct det *d, const char *limit, const char *jinja)
{
    const char *s = snippet(d, jinja), *hit = NULL, *p = d->canon.p;

    while ((p = strstr(p, s)) != NULL && p < limit)
        hit = p++;
    return hit;
}

/* The position after canonical text s if p starts with it, else NULL. */
static const char *match_raw(const char *p, const char *s)
{
    return p && strncmp(p, s, strlen(s)) == 0 ? p + strlen(s) : NULL;
}

/* The position after snippet jinja if the canonical text at p starts with it, else NULL. */
static const char *match_at(struct det *d, const char *p, const char *jinja)
{
    const char *s = snippet(d, jinja);
    size_t n = strlen(s);

    return p && strncmp(p, s, n) == 0 ? p + n : NULL;
}

static bool ends_with_at(const struct det *d, const char *p, const char *s)
{
    size_t n = strlen(s);

    return (size_t)(p - d->canon.p) >= n && memcmp(p - n, s, n) == 0;
}

/* Reads the canonical string "..." at p into d->text; returns the position after it. */
static const char *read_str(struct det *d, const char *p)
{
    d->text.len = 0;
    sb_str(&d->text, "");
    if (!p || *p != '"')
        return NULL;
    for (p++; *p && *p != '"'; p++) {
        if (*p == '\\') {
            p++;
            sb_char(&d->text, *p == 'n' ? '\n' : *p);
        } else {
            sb_char(&d->text, *p);
        }
    }
    if (!*p || d->text.oom) {
        d->oom |= d->text.oom;
        return NULL;
    }
    return p + 1;
}

/* Reads the literal output {{"..."}} at p into d->text; returns the position after it. */
static const char *read_lit(struct det *d, const char *p)
{
    if (!p || strncmp(p, "{{\"", 3) != 0)
        return NULL;
    p = read_str(d, p + 2);
    return p && strncmp(p, "}}", 2) == 0 ? p + 2 : NULL;
}

/* Copies d->text into dst (cap bytes); false when it does not fit. */
static bool take_text(const struct det *d, char *dst, size_t cap)
{
    if (d->text.len >= cap)
        return false;
    memcpy(dst, d->text.p, d->text.len + 1);
    return true;
}

static bool has_raw(const struct det *d, const char *s)
{
    return strstr(d->canon.p, s) != NULL;
}

/* Conditions that are false when no tools are passed (tools set to none when undefined):
 * blocks under them are skipped when locating the parts a plain conversation renders. */
static const char *const tool_conditions[] = {
    "{% if builtin_tools is defined or tools is not none %}",
    "{% if builtin_tools is defined %}",
    "{% if tools is not none %}",
    "{% if tools is not none and not tools_in_user_message %}",
    "{% if tools_in_user_message and not tools is none %}",
    "{% if tools is not none and (message == user_messages[-1]) %}",
};

/* The position after the {% endif %} closing the {% if %} that starts at p. */
static const char *skip_if_block(const char *p)
{
    int depth = 0;

    while (*p) {
        if (strncmp(p, "{%if ", 5) == 0)
            depth++;
        else if (strncmp(p, "{%endif%}", 9) == 0 && --depth == 0)
            return p + 9;
        p++;
    }
    return NULL;
}

static const char *skip_tool_blocks(struct det *d, const char *p)
{
    bool again = true;

    while (p && again) {
        again = false;
        for (size_t i = 0; i < sizeof(tool_conditions) / sizeof(tool_conditions[0]); i++) {
            if (match_at(d, p, tool_conditions[i])) {
                p = skip_if_block(p);
                again = true;
                break;
            }
        }
    }
    return p;
}

/* Every raise_exception must be one the detector accounted for (allowed, n of them) or be
 * about tools, which a plain conversation cannot reach. */
static int check_raises(struct det *d, const char *const *allowed, size_t n)
{
    const char *p = d->canon.p;

    while ((p = strstr(p, "raise_exception(")) != NULL) {
        const char *q = read_str(d, p + strlen("raise_exception("));
        bool ok = q && (strstr(d->text.p, "tool") || strstr(d->text.p, "Tool"));

        for (size_t i = 0; q && !ok && i < n; i++)
            ok = allowed[i] && strcmp(d->text.p, allowed[i]) == 0;
        if (!ok)
            return det_fail(d, "the template raises an error this renderer does not model (%.80s)",
                            q ? d->text.p : "a computed message");
        p += strlen("raise_exception(");
    }
    return 0;
}

/* The position after the canonical item ({{...}} or {%...%}) that starts at p, or NULL. */
static const char *item_end(const char *p)
{
    bool expr = p[1] == '{';
    int depth = 0;

    for (p += 2; *p; p++) {
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1])
                    p++;
            if (!*p)
                return NULL;
        } else if (expr && *p == '{') {
            depth++;
        } else if (expr && *p == '}' && depth > 0) {
            depth--;
        } else if (p[0] == (expr ? '}' : '%') && p[1] == '}') {
            return p + 2;
        }
    }
    return NULL;
}

static bool mentions_any(const char *text, const char *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strstr(text, words[i]))
            return true;
    return false;
}

/* Whether the canonical item [p, end) is one of the snippets. */
static bool is_one_of(struct det *d, const char *p, const char *end, const char *const *snippets,
                      size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *s = snippets[i] ? snippet(d, snippets[i]) : "";

        if (snippets[i] && strlen(s) == (size_t)(end - p) && memcmp(s, p, strlen(s)) == 0)
            return true;
    }
    return false;
}

/* What a family's outputs may be: literals that hold one of its markers, and expressions that
 * mention a content. */
struct inventory {
    const char *family; /* with its article: "a ChatML" */
    const char *const *markers;
    size_t n_markers;
    const char *const *literals; /* exact texts; NULL entries are skipped */
    size_t n_literals;
    const char *const *contents; /* Jinja snippets; NULL entries are skipped */
    size_t n_contents;
};

/* The fingerprints show the essential parts are there; this shows nothing else writes the
 * family's markers or a message's content, as a variant with another header for one role,
 * or a trim on one branch, would. */
static int check_inventory(struct det *d, const struct inventory *inv)
{
    const char *p = d->canon.p;

    while (*p) {
        const char *end = item_end(p);
        bool is_lit = strncmp(p, "{{\"", 3) == 0 && read_lit(d, p) == end;

        if (!end)
            return det_fail(d, "%s template whose canonical form does not split", inv->family);
        if (is_lit && mentions_any(d->text.p, inv->markers, inv->n_markers)) {
            bool known = false;

            for (size_t i = 0; i < inv->n_literals && !known; i++)
                known = inv->literals[i] && strcmp(d->text.p, inv->literals[i]) == 0;
            if (!known)
                return det_fail(d, "%s template that also writes %.*s", inv->family,
                                (int)(end - p > 80 ? 80 : end - p), p);
        }
        if (!is_lit && p[1] == '{' && memmem(p, (size_t)(end - p), "content", 7) &&
            !is_one_of(d, p, end, inv->contents, inv->n_contents))
            return det_fail(d, "%s template that also writes %.*s", inv->family,
                            (int)(end - p > 80 ? 80 : end - p), p);
        p = end;
    }
    return 0;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ChatML ----------------------------------------------------------------------------------- */

static const char CHATML_TURN[] =
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}";
static const char CHATML_GEN[] = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}";
static const char QWEN3_GEN_TAIL[] =
    "{% if enable_thinking is defined and enable_thinking is false "
    "%}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}";

static const char QWEN25_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful "
                                    "assistant.";
static const char QWEN2_SYSTEM[] = "You are a helpful assistant.";

/* The parts of Qwen3's assistant turn: the last user query, the <think> split of the content,
 * and the <think> block on turns after that query. */
static const char *const qwen3_parts[] = {
    "{% set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}",
    "{% for message in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
    "{% if ns.multi_step_tool and message.role == 'user' and not(message.content.startswith("
    "'<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{% set ns.multi_step_tool = false %}{% set ns.last_query_index = index %}{% endif %}"
    "{% endfor %}",
    "{% if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% elif message.role == 'assistant' %}{% set content = message.content %}"
    "{% set reasoning_content = '' %}{% if message.reasoning_content is defined and "
    "message.reasoning_content is not none %}{% set reasoning_content = "
    "message.reasoning_content %}{% else %}{% if '</think>' in message.content %}"
    "{% set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{% set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}{% endif %}{% endif %}"
    "{% if loop.index0 > ns.last_query_index %}{% if loop.last or (not loop.last and "
    "reasoning_content) %}{{ '<|im_start|>' + message.role + '\\n<think>\\n' + "
    "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + content }}{% endif %}{% else %}"
    "{{ '<|im_start|>' + message.role + '\\n' + content }}{% endif %}",
    "{% endif %}{{ '<|im_end|>\\n' }}{% elif message.role == 'tool' %}",
    "{% if messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% endif %}",
};

/* Guards under which a fixed "<|im_start|>system\n...<|im_end|>\n" is the default system
 * message: Qwen2.5 (else of the messages[0] system branch) and Qwen2 (first loop turn). */
static const char QWEN25_GUARD[] =
    "{% if messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% else %}";
static const char QWEN2_GUARD[] = "{% if loop.first and messages[0].role != 'system' %}";

static int detect_default_system(struct det *d, struct lora_chat_template *t)
{
    static const char head[] = "{{\"<|im_start|>system\\n";
    static const char tail[] = "<|im_end|>\n";
    const char *p = d->canon.p;

    while ((p = strstr(p, head)) != NULL) {
        const char *after = read_lit(d, p);
        size_t n = d->text.len, tn = strlen(tail);
        size_t hn = strlen("<|im_start|>system\n");

        if (!after || n < hn + tn || strcmp(d->text.p + n - tn, tail) != 0) {
            p += strlen(head);
            continue;
        }
        d->text.p[n - tn] = '\0';
        const char *text = d->text.p + hn;
        bool guarded = (ends_with_at(d, p, snippet(d, QWEN25_GUARD)) ||
                        ends_with_at(d, p, snippet(d, QWEN2_GUARD))) &&
                       match_at(d, after, "{% endif %}");
        if (!guarded)
            return det_fail(d,
                            "a fixed system message ('%.60s') under a condition that is "
                            "not a default for a missing system message",
                            text);
        if (t->chatml.has_default_system && strcmp(t->chatml.default_system, text) != 0)
            return det_fail(d, "two different default system messages");
        if (strlen(text) >= sizeof(t->chatml.default_system))
            return det_fail(d, "a default system message of %zu bytes (at most %zu)", strlen(text),
                            sizeof(t->chatml.default_system) - 1);
        strcpy(t->chatml.default_system, text);
        t->chatml.has_default_system = true;
        p = after;
    }
    return 0;
}

static int check_chatml_inventory(struct det *d, const struct lora_chat_template *t)
{
    static const char *const markers[] = {"<|im_start|>"};
    static const char *const think[] = {"{{ content }}", "{{ content.lstrip('\\n') }}",
                                        "{{ reasoning_content.strip('\\n') }}"};
    char with_default[LORA_CHAT_DEFAULT_BYTES + 64];
    const char *literals[] = {"<|im_start|>", "<|im_start|>system\n", "<|im_start|>assistant\n",
                              "<|im_start|>user", NULL};
    const char *contents[] = {"{{ message.content }}", "{{ messages[0].content }}", NULL, NULL,
                              NULL};
    struct inventory inv = {"a ChatML",     markers,  N_OF(markers), literals,
                            N_OF(literals), contents, N_OF(contents)};

    if (t->chatml.has_default_system) {
        snprintf(with_default, sizeof(with_default), "<|im_start|>system\n%s<|im_end|>\n",
                 t->chatml.default_system);
        literals[4] = with_default;
    }
    if (t->chatml.qwen3_think)
        memcpy(&contents[2], think, sizeof(think));
    return check_inventory(d, &inv);
}

static int detect_chatml(struct det *d, struct lora_chat_template *t)
{
    const char *gen, *after;

    t->family = LORA_CHAT_CHATML;
    if (!find(d, CHATML_TURN))
        return det_fail(d, "ChatML markers, but no turn '<|im_start|>' + role + '\\n' + "
                           "content + '<|im_end|>\\n'");
    gen = find(d, CHATML_GEN);
    after = gen ? gen + strlen(snippet(d, CHATML_GEN)) : NULL;
    if (!gen || (!match_at(d, after, "{% endif %}") && !match_at(d, after, QWEN3_GEN_TAIL)))
        return det_fail(d, "a ChatML template whose generation prompt is not "
                           "'<|im_start|>assistant\\n' under add_generation_prompt");
    if (strstr(strstr(d->canon.p, "add_generation_prompt") + 1, "add_generation_prompt"))
        return det_fail(d, "a ChatML template that tests add_generation_prompt twice");
    if (check_raises(d, NULL, 0) < 0)
        return -1;
    if (has_raw(d, "think>")) {
        for (size_t i = 0; i < sizeof(qwen3_parts) / sizeof(qwen3_parts[0]); i++)
            if (!find(d, qwen3_parts[i]))
                return det_fail(d,
                                "a ChatML template with <think> handling that is not "
                                "Qwen3's (part %zu differs)",
                                i + 1);
        t->chatml.qwen3_think = true;
    }
    if (detect_default_system(d, t) < 0 || check_chatml_inventory(d, t) < 0)
        return -1;
    if (t->chatml.qwen3_think)
        snprintf(t->name, sizeof(t->name), "qwen3");
    else if (!t->chatml.has_default_system)
        snprintf(t->name, sizeof(t->name), "chatml");
    else if (strcmp(t->chatml.default_system, QWEN25_SYSTEM) == 0)
        snprintf(t->name, sizeof(t->name), "qwen2.5");
    else if (strcmp(t->chatml.default_system, QWEN2_SYSTEM) == 0)
        snprintf(t->name, sizeof(t->name), "qwen2");
    else
        snprintf(t->name, sizeof(t->name), "chatml-default-system");
    return 0;
}

/* Llama 3 ---------------------------------------------------------------------------------- */

#define L3_TURN_HEAD "'<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + "
static const char *const l3_turn[] = {
    "{{ " L3_TURN_HEAD "message.content + '<|eot_id|>' }}",
    "{{ " L3_TURN_HEAD "message.content | trim + '<|eot_id|>' }}",
};
static const char *const l3_set_turn[] = {
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = " L3_TURN_HEAD "message.content + '<|eot_id|>' %}",
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = " L3_TURN_HEAD "message.content | trim + '<|eot_id|>' %}",
};
static const char L3_SET_BOS[] =
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}";
static const char L3_GEN_IF[] = "{% if add_generation_prompt %}"
                                "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                                "{% endif %}";
static const char L3_GEN_ALWAYS[] =
    "{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}";
static const char L31_LOOP[] = "{% for message in messages %}{% if not (message.role == 'ipython' "
                               "or message.role == 'tool' or 'tool_calls' in message) %}";
static const char L31_SYSTEM[] = "{% if messages[0].role == 'system' %}{% set system_message = "
                                 "messages[0].content | trim %}{% set messages = messages[1:] %}"
                                 "{% else %}{% set system_message = '' %}{% endif %}";
static const char TOOLS_NONE[] = "{% if not tools is defined %}{% set tools = none %}{% endif %}";

/* strftime directives both Python and the renderer here produce the same way. */
static bool is_date_format(const char *f)
{
    for (; *f; f++) {
        if (*f != '%')
            continue;
        if (!f[1] || !strchr("dmYbBHM%", f[1]))
            return false;
        f++;
    }
    return true;
}

static int detect_llama31_dates(struct det *d, struct lora_chat_template *t)
{
    static const char from_clock[] = "{% if not date_string is defined %}{% if strftime_now is "
                                     "defined %}{% set date_string = strftime_now(";
    static const char fixed[] = "{% if not date_string is defined %}{% set date_string = ";
    const char *p = find_end(d, NULL, from_clock);

    if (p) {
        p = read_str(d, p);
        if (!p || !take_text(d, t->llama3.date_format, sizeof(t->llama3.date_format)) ||
            !is_date_format(t->llama3.date_format))
            return det_fail(d, "a Llama 3.1 date from strftime_now in a format other than "
                               "%%d %%m %%Y %%b %%B %%H %%M");
        p = match_raw(p, ")%}{%else%}{%set date_string=");
    } else {
        p = find_end(d, NULL, fixed);
    }
    p = read_str(d, p);
    if (!p || !take_text(d, t->llama3.date_default, sizeof(t->llama3.date_default)))
        return det_fail(d, "a Llama 3.1 'Today Date' without a literal default date_string");
    return 0;
}

static int detect_llama31(struct det *d, struct lora_chat_template *t)
{
    static const char prefix[] = "Cutting Knowledge Date: ";
    static const char suffix[] = "Today Date: ";
    const char *p;

    if (!find(d, L31_SYSTEM) || !find(d, TOOLS_NONE))
        return det_fail(d, "a Llama 3.1-style system block, but the system message is not "
                           "taken from messages[0] | trim, or tools are not set to none");
    p = find_end(d, NULL, "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}");
    p = read_lit(d, skip_tool_blocks(d, p));
    if (!p || strncmp(d->text.p, prefix, strlen(prefix)) != 0 || d->text.len < strlen(suffix) ||
        strcmp(d->text.p + d->text.len - strlen(suffix), suffix) != 0 ||
        !take_text(d, t->llama3.date_prefix, sizeof(t->llama3.date_prefix)))
        return det_fail(d, "a Llama 3.1-style system block not of the form 'Cutting Knowledge "
                           "Date: ...\\nToday Date: ' + date_string");
    p = match_at(d, p, "{{ date_string }}{{ '\\n\\n' }}");
    p = match_at(d, skip_tool_blocks(d, p), "{{ system_message }}{{ '<|eot_id|>' }}");
    if (!p)
        return det_fail(d, "a Llama 3.1-style system block that does not end with "
                           "date_string + '\\n\\n' + system_message + '<|eot_id|>'");
    t->llama3.system_block = true;
    return detect_llama31_dates(d, t);
}

/* Whether the first output of the template is bos_token. */
static bool is_bos_first(const struct det *d)
{
    const char *p = strstr(d->canon.p, "{{");

    return p && strncmp(p, "{{bos_token}}", 13) == 0;
}

/* The turn, as {% set content = ... %}{{ content }} (Llama 3.0) or as one output; sets
 * trim_content and emits_bos. Returns whether one was found. */
static bool detect_llama3_turn(struct det *d, struct lora_chat_template *t, bool dated)
{
    const char *head = dated ? L31_LOOP : "{% for message in messages %}";

    for (int trim = 0; trim < 2; trim++) {
        const char *p = find_end(d, NULL, l3_set_turn[trim]), *q;

        t->llama3.trim_content = trim;
        if (p && !dated) {
            q = match_at(d, p, L3_SET_BOS);
            t->emits_bos = q != NULL;
            if (match_at(d, q ? q : p, "{{ content }}{% endfor %}"))
                return true;
        }
        q = find(d, l3_turn[trim]);
        if (q && ends_with_at(d, q, snippet(d, head))) {
            t->emits_bos = is_bos_first(d);
            return true;
        }
    }
    return false;
}

/* Llama 3.1's tool branches write the ipython and user headers and the untrimmed content of
 * tool results; a plain conversation does not reach them. */
static int check_llama3_inventory(struct det *d, const struct lora_chat_template *t)
{
    static const char *const markers[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    static const char *const literals[] = {
        "<|start_header_id|>",
        "<|end_header_id|>\n\n",
        "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "<|start_header_id|>ipython<|end_header_id|>\n\n",
        "<|start_header_id|>user<|end_header_id|>\n\n",
    };
    bool dated = t->llama3.system_block;
    const char *contents[] = {
        t->llama3.trim_content ? "{{ message.content | trim }}" : "{{ message.content }}",
        "{{ content }}",
        dated ? "{{ message.content }}" : NULL,
        dated ? "{{ message.content | tojson }}" : NULL,
    };
    struct inventory inv = {"a Llama 3",    markers,  N_OF(markers), literals,
                            N_OF(literals), contents, N_OF(contents)};

    return check_inventory(d, &inv);
}

static int detect_llama3(struct det *d, struct lora_chat_template *t)
{
    bool dated = has_raw(d, "Cutting Knowledge Date");

    t->family = LORA_CHAT_LLAMA3;
    if (!detect_llama3_turn(d, t, dated))
        return det_fail(d, "Llama 3 markers, but no turn '<|start_header_id|>' + role + "
                           "'<|end_header_id|>\\n\\n' + content + '<|eot_id|>' in a loop over "
                           "the messages");
    if (find(d, L3_GEN_IF))
        t->llama3.gen_prompt_always = false;
    else if (ends_with_at(d, d->canon.p + d->canon.len, snippet(d, L3_GEN_ALWAYS)))
        t->llama3.gen_prompt_always = true;
    else
        return det_fail(d, "a Llama 3 template without the generation prompt "
                           "'<|start_header_id|>assistant<|end_header_id|>\\n\\n'");
    if (check_raises(d, NULL, 0) < 0)
        return -1;
    if ((dated && detect_llama31(d, t) < 0) || check_llama3_inventory(d, t) < 0)
        return -1;
    snprintf(t->name, sizeof(t->name), "%s",
             !dated                     ? "llama3"
             : t->llama3.date_format[0] ? "llama3.2"
                                        : "llama3.1");
    return 0;
}

/* [INST] ------------------------------------------------------------------------------------ */

static const char *const inst_opens[] = {"[INST] ", " [INST] ", "[INST]"};
static const char *const inst_closes[] = {" [/INST]", "[/INST]"};
static const char *const spaces[] = {"", " "};

/* The static string equal to text among choices, or NULL. */
static const char *pick(const char *text, const char *const *choices, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(text, choices[i]) == 0)
            return choices[i];
    return NULL;
}

/* Taking the system message off the front, in either order of the two sets. */
static const char *const llama2_splits[] = {
    "{% if messages[0].role == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0].content %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}",
    "{% if messages[0].role == 'system' %}{% set system_message = messages[0].content %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}",
};
static const char LLAMA2_SYS[] =
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message.content %}{% else %}"
    "{% set content = message.content %}{% endif %}";
static const char *const mistral_splits[] = {
    "{% if messages[0].role == 'system' %}{% set system_message = messages[0].content %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}"
    "{% endif %}",
    "{% if messages[0].role == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0].content %}{% else %}{% set loop_messages = messages %}"
    "{% endif %}",
};
static const char *const inst_alternations[] = {
    "{% if (message.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception(",
    "{% if (message.role == 'user') != (ns.index % 2 == 0) %}{{ raise_exception(",
};
static const char NS_ALTERNATION_LOOP[] =
    "{% for message in loop_messages %}{% if not (message.role == 'tool' or message.role == "
    "'tool_results' or (message.tool_calls is defined and message.tool_calls is not none)) %}";

static bool has_any(struct det *d, const char *const *snippets, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (find(d, snippets[i]))
            return true;
    return false;
}

/* Reads the literal at p as one of choices into *out; returns the position after it. */
static const char *read_choice(struct det *d, const char *p, const char *const *choices, size_t n,
                               const char **out)
{
    p = read_lit(d, p);
    *out = p ? pick(d->text.p, choices, n) : NULL;
    return *out ? p : NULL;
}

/* An optional literal space at p into *out (""); NULL when the literal is anything else. */
static const char *read_space(struct det *d, const char *p, const char **out)
{
    *out = "";
    if (!p || strncmp(p, "{{\"", 3) != 0)
        return p;
    return read_choice(d, p, spaces, N_OF(spaces), out);
}

/* [bos_token] OPEN content CLOSE. The content is the <<SYS>> block's own variable or the
 * message's, possibly stripped. */
static const char *detect_inst_turn(struct det *d, struct lora_chat_template *t, const char *p,
                                    const char **open, const char **close)
{
    static const char *const contents[] = {"{{ message.content }}", "{{ content }}",
                                           "{{ content.strip() }}", "{{ message.content.strip() }}",
                                           "{{ message.content | trim }}"};
    bool sys_block = t->inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK;
    const char *q = NULL;

    if (match_at(d, p, "{{ bos_token }}")) {
        t->inst.bos_per_user = true;
        p = match_at(d, p, "{{ bos_token }}");
    }
    p = read_choice(d, p, inst_opens, N_OF(inst_opens), open);
    for (size_t i = 0; p && !q && i < N_OF(contents); i++) {
        bool own_var = i == 1 || i == 2;

        if (own_var != sys_block)
            continue;
        q = match_at(d, p, contents[i]);
        t->inst.user_strip = i >= 2;
    }
    return read_choice(d, q, inst_closes, N_OF(inst_closes), close);
}

/* The user branch; for Mistral, the turn with the system message first under loop.first
 * (v1) or loop.last (v3), then the plain turn. */
static const char *detect_inst_user(struct det *d, struct lora_chat_template *t, const char *p)
{
    const char *open, *close;

    p = skip_tool_blocks(d, p);
    if (t->inst.system_slot == LORA_CHAT_SYSTEM_FIRST_USER) {
        const char *q = match_at(d, p, "{% if loop.first and system_message is defined %}");

        if (!q) {
            q = match_at(d, p, "{% if loop.last and system_message is defined %}");
            t->inst.system_slot = LORA_CHAT_SYSTEM_LAST_USER;
        }
        q = read_choice(d, q, inst_opens, N_OF(inst_opens), &t->inst.open);
        q = match_at(d, q, "{{ system_message }}{{ '\\n\\n' }}{{ message.content }}");
        q = read_choice(d, q, inst_closes, N_OF(inst_closes), &t->inst.close);
        p = match_at(d, q, "{% else %}");
        p = detect_inst_turn(d, t, p, &open, &close);
        if (!p || open != t->inst.open || close != t->inst.close || t->inst.user_strip)
            return NULL;
        return match_at(d, p, "{% endif %}");
    }
    p = detect_inst_turn(d, t, p, &t->inst.open, &t->inst.close);
    return p;
}

/* [LEAD] content [MID] eos_token [TAIL], then the next branch. */
static const char *detect_inst_assistant(struct det *d, struct lora_chat_template *t, const char *p)
{
    static const char *const contents[] = {
        "{{ message.content }}", "{{ content }}", "{{ message.content | trim }}",
        "{{ message.content.strip() }}", "{{ content.strip() }}"};
    bool sys_block = t->inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK;
    const char *q = NULL;

    p = read_space(d, p, &t->inst.asst_lead);
    for (size_t i = 0; p && !q && i < N_OF(contents); i++) {
        bool own_var = i == 1 || i == 4;

        if (own_var != sys_block)
            continue;
        q = match_at(d, p, contents[i]);
        t->inst.asst_strip = i >= 2;
    }
    q = read_space(d, q, &t->inst.asst_mid);
    q = match_at(d, q, "{{ eos_token }}");
    q = read_space(d, q, &t->inst.asst_tail);
    return match_raw(q, "{%") ? q : NULL;
}

static int detect_inst_rules(struct det *d, struct lora_chat_template *t, const char *asst)
{
    const char *allowed[2] = {NULL, NULL};
    const char *p = NULL;

    for (size_t i = 0; i < N_OF(inst_alternations) && !p; i++) {
        const char *hit = find(d, inst_alternations[i]);

        if (hit && i == 1 && !ends_with_at(d, hit, snippet(d, NS_ALTERNATION_LOOP)))
            return det_fail(d, "an [INST] template that counts turns in a way not recognised");
        p = hit ? find_end(d, hit, inst_alternations[i]) : NULL;
    }
    if (p) {
        p = read_str(d, p);
        if (!p || !take_text(d, t->inst.alternate_error, sizeof(t->inst.alternate_error)))
            return det_fail(d, "an [INST] alternation check without a literal message");
        t->inst.alternate = true;
        allowed[0] = t->inst.alternate_error;
    }
    p = find_end(d, asst, "{% else %}{{ raise_exception(");
    if (p) {
        p = read_str(d, p);
        if (!p || !take_text(d, t->inst.role_error, sizeof(t->inst.role_error)))
            return det_fail(d, "an [INST] role check without a literal message");
        allowed[1] = t->inst.role_error;
    }
    return check_raises(d, allowed, N_OF(allowed));
}

/* bos_token once before the loop, or before each [INST] (told by the user turn). */
static int detect_inst_bos(struct det *d, struct lora_chat_template *t, const char *loop)
{
    const char *bos = strstr(d->canon.p, "{{bos_token}}");

    if (t->inst.bos_per_user) {
        t->emits_bos = true;
        return 0;
    }
    if (!bos)
        return 0;
    if (bos > loop || strstr(bos + 1, "{{bos_token}}"))
        return det_fail(d, "an [INST] template with bos_token where it is not recognised");
    t->emits_bos = true;
    return 0;
}

static int detect_inst_system(struct det *d, struct lora_chat_template *t)
{
    if (has_raw(d, "<<SYS>>")) {
        if (!has_any(d, llama2_splits, N_OF(llama2_splits)) || !find(d, LLAMA2_SYS))
            return det_fail(d, "a <<SYS>> template whose system block is not "
                               "'<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + first user turn");
        t->inst.system_slot = LORA_CHAT_SYSTEM_SYS_BLOCK;
    } else if (has_raw(d, "system_message")) {
        if (!has_any(d, mistral_splits, N_OF(mistral_splits)))
            return det_fail(d, "an [INST] template that takes the system message in a way "
                               "not recognised");
        t->inst.system_slot = LORA_CHAT_SYSTEM_FIRST_USER; /* or last: the user turn tells */
    } else {
        t->inst.system_slot = LORA_CHAT_SYSTEM_NONE;
    }
    return 0;
}

/* The content forms are the ones the turn parsers accept, where they check the positions;
 * Mistral v3's tool results write content | string. */
static int check_inst_inventory(struct det *d, const struct lora_chat_template *t)
{
    static const char *const markers[] = {"[INST]", "[/INST]", "<<SYS>>"};
    static const char *const contents[] = {
        "{{ message.content }}",        "{{ content }}",
        "{{ content.strip() }}",        "{{ message.content.strip() }}",
        "{{ message.content | trim }}", "{{ content | string }}",
    };
    const char *literals[] = {t->inst.open, t->inst.close};
    struct inventory inv = {"an [INST]",    markers,  N_OF(markers), literals,
                            N_OF(literals), contents, N_OF(contents)};

    return check_inventory(d, &inv);
}

static int detect_inst(struct det *d, struct lora_chat_template *t)
{
    static const char user[] = "{% if message.role == 'user' %}";
    static const char assistant[] = "{% elif message.role == 'assistant' %}";
    const char *p, *loop;

    if (detect_inst_system(d, t) < 0)
        return -1;
    t->family =
        t->inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK ? LORA_CHAT_LLAMA2 : LORA_CHAT_MISTRAL;
    p = find_end(d, NULL, user);
    loop = p ? find_last_before(d, p,
                                t->inst.system_slot == LORA_CHAT_SYSTEM_NONE
                                    ? "{% for message in messages %}"
                                    : "{% for message in loop_messages %}")
             : NULL;
    if (!loop)
        return det_fail(d, "an [INST] template without a user branch in a loop over the "
                           "messages");
    p = detect_inst_user(d, t, p);
    if (!p)
        return det_fail(d, "an [INST] user turn not of the form [bos_token] '[INST] ' + "
                           "content + ' [/INST]'");
    p = detect_inst_assistant(d, t, find_end(d, p, assistant));
    if (!p)
        return det_fail(d, "an [INST] assistant turn not of the form [' '] + content + "
                           "eos_token");
    if (has_raw(d, "add_generation_prompt"))
        return det_fail(d, "an [INST] template that uses add_generation_prompt");
    if (detect_inst_rules(d, t, p) < 0 || detect_inst_bos(d, t, loop) < 0 ||
        check_inst_inventory(d, t) < 0)
        return -1;
    t->emits_eos = true;
    snprintf(t->name, sizeof(t->name), "%s",
             t->inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK    ? "llama2"
             : t->inst.system_slot == LORA_CHAT_SYSTEM_FIRST_USER ? "mistral-v1"
             : t->inst.system_slot != LORA_CHAT_SYSTEM_LAST_USER  ? "mistral-v0.1"
             : strcmp(t->inst.open, "[INST]") == 0                ? "mistral-v3-tekken"
                                                                  : "mistral-v3");
    return 0;
}

static void template_init(struct lora_chat_template *t)
{
    memset(t, 0, sizeof(*t));
    t->inst.open = t->inst.close = "";
    t->inst.asst_lead = t->inst.asst_mid = t->inst.asst_tail = "";
}

int lora_chat_template_detect(const char *jinja_source, struct lora_chat_template *out, char *err,
                              size_t err_len)
{
    struct det d = {.err = err, .err_len = err_len};
    struct lora_chat_template t;
    const char *what = NULL;
    size_t at = 0;
    int rc = -1;

    template_init(&t);
    if (!jinja_source) {
        lora_errf(err, err_len, "unable to render chat template: no template; " HINT);
        return -1;
    }
    sb_str(&d.canon, "");
    if (d.canon.oom || canonicalise(jinja_source, false, &d.canon, &what, &at) < 0) {
        if (what)
            det_fail(&d, "the template does not parse (%s at byte %zu)", what, at);
        else
            d.oom = true;
        goto out;
    }
    bool chatml = has_raw(&d, "<|im_start|>"), llama3 = has_raw(&d, "<|start_header_id|>");
    bool inst = has_raw(&d, "[INST]");
    if (chatml + llama3 + inst > 1)
        det_fail(&d, "the template mixes ChatML, Llama 3 and [INST] markers");
    else if (chatml)
        rc = detect_chatml(&d, &t);
    else if (llama3)
        rc = detect_llama3(&d, &t);
    else if (inst)
        rc = detect_inst(&d, &t);
    else
        det_fail(&d, "not a ChatML, Llama 3 or [INST] template");
out:
    if (d.oom) {
        lora_errf(err, err_len, "unable to render chat template: out of memory");
        rc = -1;
    }
    if (rc == 0)
        *out = t;
    sb_free(&d.canon);
    sb_free(&d.snip);
    sb_free(&d.text);
    return rc;
}

/* ---- built-in templates ----------------------------------------------------------------- */

static const char MISTRAL_ALTERNATE[] = "After the optional system message, conversation roles "
                                        "must alternate user/assistant/user/assistant/...";
static const char MISTRAL_ROLES[] = "Only user and assistant roles are supported, with the "
                                    "exception of an initial optional system message!";

static void set_chatml(struct lora_chat_template *t, const char *name, const char *system,
                       bool think)
{
    t->family = LORA_CHAT_CHATML;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->chatml.has_default_system = system != NULL;
    snprintf(t->chatml.default_system, sizeof(t->chatml.default_system), "%s",
             system ? system : "");
    t->chatml.qwen3_think = think;
    snprintf(t->eos_token, sizeof(t->eos_token), "<|im_end|>");
}

static void set_llama3(struct lora_chat_template *t, const char *name, bool dated)
{
    t->family = LORA_CHAT_LLAMA3;
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->bos_token, sizeof(t->bos_token), "<|begin_of_text|>");
    snprintf(t->eos_token, sizeof(t->eos_token), "<|eot_id|>");
    t->emits_bos = true;
    t->llama3.trim_content = true;
    t->llama3.system_block = dated;
    if (dated) {
        snprintf(t->llama3.date_prefix, sizeof(t->llama3.date_prefix),
                 "Cutting Knowledge Date: December 2023\nToday Date: ");
        snprintf(t->llama3.date_default, sizeof(t->llama3.date_default), "26 Jul 2024");
    }
}

static void set_inst(struct lora_chat_template *t, const char *name, enum lora_chat_system_slot s)
{
    t->family = s == LORA_CHAT_SYSTEM_SYS_BLOCK ? LORA_CHAT_LLAMA2 : LORA_CHAT_MISTRAL;
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->bos_token, sizeof(t->bos_token), "<s>");
    snprintf(t->eos_token, sizeof(t->eos_token), "</s>");
    t->emits_bos = t->emits_eos = true;
    t->inst.system_slot = s;
    t->inst.alternate = true;
    t->inst.asst_lead = " ";
    if (s == LORA_CHAT_SYSTEM_SYS_BLOCK) {
        t->inst.bos_per_user = t->inst.user_strip = t->inst.asst_strip = true;
        t->inst.open = "[INST] ";
        t->inst.close = " [/INST]";
        t->inst.asst_mid = " ";
        snprintf(t->inst.alternate_error, sizeof(t->inst.alternate_error),
                 "Conversation roles must alternate user/assistant/user/assistant/...");
        return;
    }
    t->inst.open = s == LORA_CHAT_SYSTEM_FIRST_USER ? " [INST] " : "[INST] ";
    t->inst.close = s == LORA_CHAT_SYSTEM_FIRST_USER ? " [/INST]" : "[/INST]";
    t->inst.asst_strip = s == LORA_CHAT_SYSTEM_LAST_USER;
    snprintf(t->inst.alternate_error, sizeof(t->inst.alternate_error), "%s", MISTRAL_ALTERNATE);
    snprintf(t->inst.role_error, sizeof(t->inst.role_error), "%s", MISTRAL_ROLES);
}

int lora_chat_template_by_name(const char *name, struct lora_chat_template *out, char *err,
                               size_t err_len)
{
    struct lora_chat_template t;

    template_init(&t);
    if (!name)
        name = "(null)";
    if (strcmp(name, "chatml") == 0)
        set_chatml(&t, "chatml", NULL, false);
    else if (strcmp(name, "qwen2.5") == 0)
        set_chatml(&t, "qwen2.5", QWEN25_SYSTEM, false);
    else if (strcmp(name, "qwen3") == 0)
        set_chatml(&t, "qwen3", NULL, true);
    else if (strcmp(name, "llama3") == 0)
        set_llama3(&t, "llama3", false);
    else if (strcmp(name, "llama3.1") == 0)
        set_llama3(&t, "llama3.1", true);
    else if (strcmp(name, "llama2") == 0)
        set_inst(&t, "llama2", LORA_CHAT_SYSTEM_SYS_BLOCK);
    else if (strcmp(name, "mistral") == 0 || strcmp(name, "mistral-v3") == 0)
        set_inst(&t, "mistral-v3", LORA_CHAT_SYSTEM_LAST_USER);
    else if (strcmp(name, "mistral-v1") == 0)
        set_inst(&t, "mistral-v1", LORA_CHAT_SYSTEM_FIRST_USER);
    else {
        lora_errf(err, err_len,
                  "unknown chat template '%.64s' (known: chatml, qwen2.5, qwen3, llama3, "
                  "llama3.1, llama2, mistral, mistral-v1, mistral-v3)",
                  name);
        return -1;
    }
    *out = t;
    return 0;
}

int lora_chat_template_set_tokens(struct lora_chat_template *t, const char *bos, const char *eos,
                                  char *err, size_t err_len)
{
    if ((bos && strlen(bos) >= sizeof(t->bos_token)) ||
        (eos && strlen(eos) >= sizeof(t->eos_token))) {
        lora_errf(err, err_len, "a bos_token or eos_token longer than %zu bytes",
                  sizeof(t->bos_token) - 1);
        return -1;
    }
    if (bos)
        strcpy(t->bos_token, bos);
    if (eos)
        strcpy(t->eos_token, eos);
    return 0;
}

/* ---- tokenizer_config.json ------------------------------------------------------------- */

/* Loads the config as lora_json_file_load does, but with integers past 64 bits read as reals:
 * transformers writes model_max_length as int(1e30) into many tokenizer_config.json files. */
static json_t *load_config(const char *path, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *root;
    FILE *f = fopen(path, "rb");

    if (!f) {
        int e = errno;

        lora_errf_path(err, err_len, path, "unable to open: %s", strerror(e));
        errno = e;
        return NULL;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    fclose(f);
    if (!root) {
        lora_errf_path(err, err_len, path, "invalid JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
        errno = EINVAL;
        return NULL;
    }
    if (!json_is_object(root)) {
        lora_errf_path(err, err_len, path, "top level must be a JSON object");
        json_decref(root);
        errno = EINVAL;
        return NULL;
    }
    return root;
}

/* A token as a string, an {"content": "..."} object (AddedToken), null or absent (NULL).
 * Returns 0, or -1 for any other shape. */
static int config_token(json_t *root, const char *key, const char **out)
{
    json_t *v = json_object_get(root, key);

    *out = NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return -1;
    *out = json_string_value(v);
    return 0;
}

/* Reads chat_template.jinja beside path into *out (malloc'd). Returns 0, -1 with errno
 * ENOENT when there is none, or -1 with err set. */
static int read_sibling_template(const char *path, char **out, char *err, size_t err_len)
{
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    char *file = malloc(dir_len + sizeof("chat_template.jinja"));
    struct sbuf b = {0};
    char chunk[4096];
    size_t n;
    FILE *f;

    *out = NULL;
    if (!file) {
        lora_errf_path(err, err_len, path, "out of memory");
        return -1;
    }
    memcpy(file, path, dir_len);
    strcpy(file + dir_len, "chat_template.jinja");
    f = fopen(file, "rb");
    if (!f) {
        int e = errno;

        if (e != ENOENT)
            lora_errf_path(err, err_len, file, "unable to open: %s", strerror(e));
        free(file);
        errno = e;
        return -1;
    }
    sb_str(&b, "");
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0 && b.len <= MAX_TEMPLATE_BYTES)
        sb_add(&b, chunk, n);
    if (ferror(f) || b.oom || b.len > MAX_TEMPLATE_BYTES || memchr(b.p, '\0', b.len)) {
        lora_errf_path(err, err_len, file, "unable to read: %s",
                       ferror(f)                    ? strerror(errno)
                       : b.oom                      ? "out of memory"
                       : b.len > MAX_TEMPLATE_BYTES ? "larger than 1 MiB"
                                                    : "contains a NUL byte");
        fclose(f);
        free(file);
        sb_free(&b);
        errno = EINVAL;
        return -1;
    }
    fclose(f);
    free(file);
    *out = b.p;
    return 0;
}

/* The template source of root: its chat_template string, or the "default" entry of a list. */
static int config_template(json_t *root, const char *path, const char **src, char **owned,
                           char *err, size_t err_len)
{
    json_t *ct = json_object_get(root, "chat_template"), *v;
    char names[128] = "";
    size_t i;

    *src = NULL;
    *owned = NULL;
    if (json_is_string(ct)) {
        *src = json_string_value(ct);
        return 0;
    }
    if (!ct || json_is_null(ct)) {
        if (read_sibling_template(path, owned, err, err_len) == 0) {
            *src = *owned;
            return 0;
        }
        if (errno == ENOENT)
            lora_errf_path(err, err_len, path,
                           "no chat_template (and no chat_template.jinja beside it); " HINT);
        return -1;
    }
    if (!json_is_array(ct)) {
        lora_errf_path(err, err_len, path,
                       "'chat_template' must be a string or a list of {name, template}");
        return -1;
    }
    json_array_foreach (ct, i, v) {
        json_t *name = json_object_get(v, "name"), *tmpl = json_object_get(v, "template");

        if (!json_is_string(name) || !json_is_string(tmpl)) {
            lora_errf_path(err, err_len, path,
                           "'chat_template' entry %zu is not a {name, template} pair of strings",
                           i);
            return -1;
        }
        if (strcmp(json_string_value(name), "default") == 0) {
            *src = json_string_value(tmpl);
            return 0;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof(names) - used, "%s'%s'", used ? ", " : "",
                 json_string_value(name));
    }
    lora_errf_path(err, err_len, path, "'chat_template' lists %s but none named 'default'; " HINT,
                   names[0] ? names : "no templates");
    return -1;
}

int lora_chat_template_from_config(const char *tokenizer_config_json_path,
                                   struct lora_chat_template *out, char *err, size_t err_len)
{
    const char *path = tokenizer_config_json_path, *src, *bos, *eos, *bad = NULL;
    struct lora_chat_template t;
    char *owned = NULL;
    char why[768];
    int rc = -1;
    json_t *root;

    root = load_config(path, err, err_len);
    if (!root)
        return -1;
    if (config_template(root, path, &src, &owned, err, err_len) < 0)
        goto out;
    if (config_token(root, "bos_token", &bos) < 0)
        bad = "bos_token";
    else if (config_token(root, "eos_token", &eos) < 0)
        bad = "eos_token";
    if (bad) {
        lora_errf_path(err, err_len, path,
                       "'%s' must be a string or an object with a string 'content'", bad);
        goto out;
    }
    if (lora_chat_template_detect(src, &t, why, sizeof(why)) < 0 ||
        lora_chat_template_set_tokens(&t, bos, eos, why, sizeof(why)) < 0) {
        lora_errf_path(err, err_len, path, "%s", why);
        goto out;
    }
    if ((t.emits_bos && !bos) || (t.emits_eos && !eos)) {
        lora_errf_path(err, err_len, path,
                       "the %s chat template emits %s, which the file does "
                       "not define",
                       t.name, t.emits_bos && !bos ? "bos_token" : "eos_token");
        goto out;
    }
    *out = t;
    rc = 0;
out:
    free(owned);
    json_decref(root);
    return rc;
}

const char *lora_chat_family_name(enum lora_chat_family family)
{
    switch (family) {
    case LORA_CHAT_CHATML:
        return "chatml";
    case LORA_CHAT_LLAMA3:
        return "llama3";
    case LORA_CHAT_LLAMA2:
        return "llama2";
    case LORA_CHAT_MISTRAL:
        return "mistral";
    }
    return NULL;
}

/* ---- rendering ----------------------------------------------------------------------------
 *
 * Each renderer writes what its family's template writes for system, user and assistant
 * messages, with Python's string semantics. Messages are validated before anything is
 * written, so an error never leaves a partial prompt.
 */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

struct span {
    const char *p;
    size_t len;
};

struct render {
    const struct lora_chat_template *t;
    const struct lora_chat_message *msgs;
    size_t n;
    enum role *roles; /* (n) */
    struct sbuf out;
    char *err;
    size_t err_len;
};

/* Python's str.isspace(): what strip() and | trim remove. */
static bool is_py_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* str.strip() of valid UTF-8. */
static struct span py_strip(struct span s)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s.p;
    size_t first = s.len, last = 0, i = 0;

    while (i < s.len) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(s.len - i), &c);

        if (k <= 0)
            break; /* validated before; keeps the loop finite regardless */
        if (!is_py_space(c)) {
            if (first == s.len)
                first = i;
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (first == s.len)
        return (struct span){s.p, 0};
    return (struct span){s.p + first, last - first};
}

/* str.lstrip('\n') and str.rstrip('\n'). */
static struct span lstrip_nl(struct span s)
{
    while (s.len && s.p[0] == '\n') {
        s.p++;
        s.len--;
    }
    return s;
}

static struct span rstrip_nl(struct span s)
{
    while (s.len && s.p[s.len - 1] == '\n')
        s.len--;
    return s;
}

static struct span span_of(const char *s)
{
    return (struct span){s, strlen(s)};
}

/* The first (or last) occurrence of needle in s, or NULL. */
static const char *span_find(struct span s, const char *needle, bool last)
{
    size_t n = strlen(needle);
    const char *hit = NULL;

    for (size_t i = 0; i + n <= s.len; i++) {
        if (memcmp(s.p + i, needle, n) == 0) {
            hit = s.p + i;
            if (!last)
                break;
        }
    }
    return hit;
}

static void put(struct render *r, const char *s)
{
    sb_str(&r->out, s);
}

static void put_span(struct render *r, struct span s)
{
    sb_add(&r->out, s.p, s.len);
}

static int render_fail(struct render *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int render_fail(struct render *r, const char *fmt, ...)
{
    va_list ap;

    if (r->err && r->err_len) {
        va_start(ap, fmt);
        vsnprintf(r->err, r->err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static bool is_valid_utf8(const char *s)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    size_t n = strlen(s);

    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &c);

        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

/* Checks roles and contents, the rules every family shares. */
static int validate(struct render *r)
{
    static const char *const names[] = {"system", "user", "assistant"};
    const char *name = r->t->name;

    if (r->n == 0)
        return render_fail(r, "no messages: a conversation needs at least one message");
    for (size_t i = 0; i < r->n; i++) {
        const char *role = r->msgs[i].role;
        int k = -1;

        if (!role)
            return render_fail(r, "message %zu: no role", i);
        for (int j = 0; j < 3; j++)
            if (strcmp(role, names[j]) == 0)
                k = j;
        if (k < 0 && strcmp(role, "tool") == 0)
            return render_fail(r,
                               "message %zu: role 'tool' is not supported by the %s chat "
                               "template renderer (tool calls are not rendered)",
                               i, name);
        if (k < 0 && strcmp(role, "developer") == 0)
            return render_fail(r,
                               "message %zu: role 'developer' is not supported by the %s "
                               "chat template; send it as 'system'",
                               i, name);
        if (k < 0)
            return render_fail(r,
                               "message %zu: unknown role '%.32s' (expected system, user "
                               "or assistant)",
                               i, role);
        if (!r->msgs[i].content)
            return render_fail(r, "message %zu: no content", i);
        if (!is_valid_utf8(r->msgs[i].content))
            return render_fail(r, "message %zu: content is not valid UTF-8", i);
        r->roles[i] = (enum role)k;
    }
    return 0;
}

static int need_token(struct render *r, bool emits, const char *token, const char *what)
{
    if (emits && !token[0])
        return render_fail(r, "the %s chat template emits %s, but none is set", r->t->name, what);
    return 0;
}

/* ChatML ----------------------------------------------------------------------------------- */

static bool is_tool_response(const char *s)
{
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    size_t n = strlen(s);

    return strncmp(s, open, strlen(open)) == 0 && n >= strlen(close) &&
           strcmp(s + n - strlen(close), close) == 0;
}

/* Qwen3: an assistant turn after the last user query carries its reasoning in a <think> block
 * (empty on the final turn); the reasoning is split off the content at </think>. */
static void put_qwen3_assistant(struct render *r, size_t i, size_t last_query)
{
    struct span content = span_of(r->msgs[i].content), reasoning = {"", 0};
    const char *close = span_find(content, "</think>", false);

    if (close) {
        const char *last_close = span_find(content, "</think>", true) + strlen("</think>");
        struct span before = rstrip_nl((struct span){content.p, (size_t)(close - content.p)});
        const char *open = span_find(before, "<think>", true);

        if (open) {
            size_t skip = (size_t)(open - before.p) + strlen("<think>");
            before = (struct span){before.p + skip, before.len - skip};
        }
        reasoning = lstrip_nl(before);
        content =
            lstrip_nl((struct span){last_close, content.len - (size_t)(last_close - content.p)});
    }
    put(r, "<|im_start|>assistant\n");
    if (i > last_query && (i == r->n - 1 || reasoning.len)) {
        put(r, "<think>\n");
        put_span(r, lstrip_nl(rstrip_nl(reasoning)));
        put(r, "\n</think>\n\n");
        content = lstrip_nl(content);
    }
    put_span(r, content);
    put(r, "<|im_end|>\n");
}

static int render_chatml(struct render *r, bool add_generation_prompt)
{
    const struct lora_chat_template *t = r->t;
    size_t last_query = r->n - 1;

    for (size_t i = r->n; i-- > 0;) {
        if (r->roles[i] == ROLE_USER && !is_tool_response(r->msgs[i].content)) {
            last_query = i;
            break;
        }
    }
    if (t->chatml.has_default_system && r->roles[0] != ROLE_SYSTEM) {
        put(r, "<|im_start|>system\n");
        put(r, t->chatml.default_system);
        put(r, "<|im_end|>\n");
    }
    for (size_t i = 0; i < r->n; i++) {
        if (t->chatml.qwen3_think && r->roles[i] == ROLE_ASSISTANT) {
            put_qwen3_assistant(r, i, last_query);
            continue;
        }
        put(r, "<|im_start|>");
        put(r, r->msgs[i].role);
        put(r, "\n");
        put(r, r->msgs[i].content);
        put(r, "<|im_end|>\n");
    }
    if (add_generation_prompt)
        put(r, "<|im_start|>assistant\n");
    return 0;
}

/* Llama 3 ---------------------------------------------------------------------------------- */

/* strftime for the directives is_date_format accepts, in English whatever the locale, as
 * Python's C-locale strftime writes them. */
static void put_date(struct render *r, const char *fmt, const struct tm *tm)
{
    static const char *const months[] = {"January",   "February", "March",    "April",
                                         "May",       "June",     "July",     "August",
                                         "September", "October",  "November", "December"};
    char num[16];

    for (; *fmt; fmt++) {
        if (*fmt != '%' || !fmt[1]) {
            sb_char(&r->out, *fmt);
            continue;
        }
        switch (*++fmt) {
        case 'd':
        case 'm':
        case 'H':
        case 'M': {
            int v = *fmt == 'd'   ? tm->tm_mday
                    : *fmt == 'm' ? tm->tm_mon + 1
                    : *fmt == 'H' ? tm->tm_hour
                                  : tm->tm_min;
            snprintf(num, sizeof(num), "%02d", v);
            put(r, num);
            break;
        }
        case 'Y':
            snprintf(num, sizeof(num), "%d", tm->tm_year + 1900);
            put(r, num);
            break;
        case 'b':
            sb_add(&r->out, months[tm->tm_mon % 12], 3);
            break;
        case 'B':
            put(r, months[tm->tm_mon % 12]);
            break;
        default:
            sb_char(&r->out, *fmt);
        }
    }
}

static int render_llama3(struct render *r, bool add_generation_prompt)
{
    const struct lora_chat_template *t = r->t;
    size_t first = 0;

    if (need_token(r, t->emits_bos, t->bos_token, "bos_token") < 0)
        return -1;
    if (t->emits_bos)
        put(r, t->bos_token);
    if (t->llama3.system_block) {
        struct span system = {"", 0};

        if (r->roles[0] == ROLE_SYSTEM) {
            system = py_strip(span_of(r->msgs[0].content));
            first = 1;
        }
        put(r, "<|start_header_id|>system<|end_header_id|>\n\n");
        put(r, t->llama3.date_prefix);
        if (t->llama3.date_format[0]) {
            time_t now = time(NULL);
            struct tm tm;

            if (!localtime_r(&now, &tm))
                return render_fail(r, "unable to read the local time for 'Today Date'");
            put_date(r, t->llama3.date_format, &tm);
        } else {
            put(r, t->llama3.date_default);
        }
        put(r, "\n\n");
        put_span(r, system);
        put(r, "<|eot_id|>");
    }
    for (size_t i = first; i < r->n; i++) {
        struct span content = span_of(r->msgs[i].content);

        put(r, "<|start_header_id|>");
        put(r, r->msgs[i].role);
        put(r, "<|end_header_id|>\n\n");
        put_span(r, t->llama3.trim_content ? py_strip(content) : content);
        put(r, "<|eot_id|>");
    }
    if (add_generation_prompt || t->llama3.gen_prompt_always)
        put(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

/* [INST] ------------------------------------------------------------------------------------ */

static int validate_inst(struct render *r, size_t first)
{
    const struct lora_chat_template *t = r->t;

    if (first == r->n)
        return render_fail(r,
                           "message 0: a system message alone renders no turn in the %s chat "
                           "template; add a user message",
                           t->name);
    for (size_t i = first; i < r->n; i++) {
        size_t k = i - first;
        bool user = r->roles[i] == ROLE_USER;

        if (t->inst.alternate && user != (k % 2 == 0))
            return render_fail(r, "message %zu: role '%s' breaks the alternation: %s", i,
                               r->msgs[i].role, t->inst.alternate_error);
        if (r->roles[i] == ROLE_SYSTEM)
            return render_fail(r, "message %zu: the %s chat template takes %s", i, t->name,
                               t->inst.system_slot == LORA_CHAT_SYSTEM_NONE
                                   ? "no system message"
                                   : "a system message only first");
    }
    return 0;
}

static void put_user_inst(struct render *r, size_t i, size_t k, const char *system)
{
    const struct lora_chat_template *t = r->t;
    enum lora_chat_system_slot slot = t->inst.system_slot;
    struct sbuf turn = {0};
    struct span content;

    if (system && slot == LORA_CHAT_SYSTEM_SYS_BLOCK && k == 0) {
        sb_str(&turn, "<<SYS>>\n");
        sb_str(&turn, system);
        sb_str(&turn, "\n<</SYS>>\n\n");
    } else if (system && ((slot == LORA_CHAT_SYSTEM_FIRST_USER && k == 0) ||
                          (slot == LORA_CHAT_SYSTEM_LAST_USER && i == r->n - 1))) {
        sb_str(&turn, system);
        sb_str(&turn, "\n\n");
    }
    sb_str(&turn, r->msgs[i].content);
    r->out.oom |= turn.oom;
    content = turn.p ? (struct span){turn.p, turn.len} : (struct span){"", 0};
    if (t->inst.user_strip)
        content = py_strip(content);
    if (t->inst.bos_per_user)
        put(r, t->bos_token);
    put(r, t->inst.open);
    put_span(r, content);
    put(r, t->inst.close);
    sb_free(&turn);
}

static int render_inst(struct render *r)
{
    const struct lora_chat_template *t = r->t;
    bool split = t->inst.system_slot != LORA_CHAT_SYSTEM_NONE && r->roles[0] == ROLE_SYSTEM;
    size_t first = split ? 1 : 0;
    const char *system = split ? r->msgs[0].content : NULL;

    if (validate_inst(r, first) < 0 || need_token(r, t->emits_bos, t->bos_token, "bos_token") < 0 ||
        need_token(r, t->emits_eos, t->eos_token, "eos_token") < 0)
        return -1;
    if (t->emits_bos && !t->inst.bos_per_user)
        put(r, t->bos_token);
    for (size_t i = first; i < r->n; i++) {
        struct span content = span_of(r->msgs[i].content);

        if (r->roles[i] == ROLE_USER) {
            put_user_inst(r, i, i - first, system);
            continue;
        }
        put(r, t->inst.asst_lead);
        put_span(r, t->inst.asst_strip ? py_strip(content) : content);
        put(r, t->inst.asst_mid);
        put(r, t->eos_token);
        put(r, t->inst.asst_tail);
    }
    return 0;
}

int lora_chat_render(const struct lora_chat_template *t, const struct lora_chat_message *msgs,
                     size_t n, bool add_generation_prompt, char **out, size_t *out_len, char *err,
                     size_t err_len)
{
    struct render r = {.t = t, .msgs = msgs, .n = n, .err = err, .err_len = err_len};
    int rc = -1;

    *out = NULL;
    *out_len = 0;
    if (!msgs)
        r.n = 0;
    if (r.n && !(r.roles = malloc(r.n * sizeof(*r.roles))))
        return render_fail(&r, "out of memory rendering %zu messages", n);
    if (validate(&r) < 0)
        goto out;
    sb_str(&r.out, "");
    switch (t->family) {
    case LORA_CHAT_CHATML:
        rc = render_chatml(&r, add_generation_prompt);
        break;
    case LORA_CHAT_LLAMA3:
        rc = render_llama3(&r, add_generation_prompt);
        break;
    case LORA_CHAT_LLAMA2:
    case LORA_CHAT_MISTRAL:
        rc = render_inst(&r);
        break;
    default:
        rc = render_fail(&r, "chat template family %d is not known", (int)t->family);
    }
    if (rc == 0 && r.out.oom)
        rc = render_fail(&r, "out of memory rendering %zu messages", n);
    if (rc == 0) {
        *out = r.out.p;
        *out_len = r.out.len;
        r.out.p = NULL;
    }
out:
    sb_free(&r.out);
    free(r.roles);
    return rc;
}
