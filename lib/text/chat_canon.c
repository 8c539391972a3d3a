/* chat_canon: the canonical form of a Jinja chat template, which detection matches against (see
 * chat_template_impl.h).
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

#include "chat_template_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

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
    struct lora_buf *out;
    struct lora_buf lit;  /* pending literal output */
    struct lora_buf strs; /* decoded string literals of the current tag */
    struct tok *toks;
    size_t n_toks, cap_toks;
    struct loop_var loops[MAX_LOOPS];
    int depth;    /* loop nesting; only the first MAX_LOOPS are recorded */
    bool partial; /* a snippet may end inside a tag: it is written without its close */
    bool oom;
    const char *error; /* a syntax error, at byte error_at */
    size_t error_at;
};

/* Appends b's own bytes [off, off + n): reserving first keeps the source valid. */
static int add_self(struct lora_buf *b, size_t off, size_t n)
{
    if (lora_buf_reserve(b, n) < 0)
        return -1;
    return lora_buf_add(b, b->data + off, n);
}

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
    return t->in_strs ? c->strs.data + t->off : c->src + t->off;
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

    lora_buf_add(&c->strs, (const char *)buf, (size_t)utf8proc_encode_char(v, buf));
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
        lora_buf_add_char(&c->strs, simple_out[hit - simple_in]);
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
    lora_buf_add_char(&c->strs, '\\');
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
            lora_buf_add_char(&c->strs, c->src[(*p)++]);
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
        if (add_self(&c->strs, a->off, a->len) < 0 || add_self(&c->strs, b->off, b->len) < 0)
            return; /* out of memory: strs.failed fails the whole */
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

static void put_escaped(struct lora_buf *b, const char *s, size_t n)
{
    lora_buf_add_char(b, '"');
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' || s[i] == '"')
            lora_buf_add_char(b, '\\');
        if (s[i] == '\n')
            lora_buf_add_str(b, "\\n");
        else
            lora_buf_add_char(b, s[i]);
    }
    lora_buf_add_char(b, '"');
}

static void flush_lit(struct canon *c)
{
    if (c->lit.len == 0)
        return;
    lora_buf_add_str(c->out, "{{");
    put_escaped(c->out, c->lit.data, c->lit.len);
    lora_buf_add_str(c->out, "}}");
    c->lit.len = 0;
}

static void put_tokens(struct canon *c, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        const struct tok *t = &c->toks[i];
        bool wordish = t->kind == TK_WORD || t->kind == TK_NUM;

        if (i > from && wordish &&
            (c->toks[i - 1].kind == TK_WORD || c->toks[i - 1].kind == TK_NUM))
            lora_buf_add_char(c->out, ' ');
        if (t->kind == TK_STR) {
            put_escaped(c->out, tok_text(c, t), t->len);
            continue;
        }
        const char *alias = NULL;
        if (t->kind == TK_WORD && (i == 0 || !tok_is(c, &c->toks[i - 1], TK_OP, ".")))
            alias = word_alias(c, t);
        if (alias)
            lora_buf_add_str(c->out, alias);
        else
            lora_buf_add(c->out, tok_text(c, t), t->len);
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
            lora_buf_add(&c->lit, tok_text(c, &c->toks[0]), c->toks[0].len);
            return;
        }
        flush_lit(c);
        lora_buf_add_str(c->out, "{{");
        put_tokens(c, 0, c->n_toks);
        lora_buf_add_str(c->out, "}}");
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
            lora_buf_add(&c->lit, tok_text(c, &c->toks[from]), c->toks[from].len);
        } else {
            flush_lit(c);
            lora_buf_add_str(c->out, "{{");
            put_tokens(c, from, i);
            lora_buf_add_str(c->out, "}}");
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
    lora_buf_add_str(c->out, "{%");
    put_tokens(c, 0, c->n_toks);
    lora_buf_add_str(c->out, "%}");
}

/* The unclosed tag a partial snippet ends with, as its canonical opening. */
static void put_partial(struct canon *c, enum tag_kind kind)
{
    merge_concat(c);
    normalise_subscripts(c);
    flush_lit(c);
    lora_buf_add_str(c->out, kind == TAG_EXPR ? "{{" : "{%");
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
        lora_buf_add(&c->lit, c->src + s, e - s);
}

/* The position of the next tag opening at or after pos, or len. */
static size_t next_tag(const struct canon *c, size_t pos)
{
    for (size_t i = pos; i + 1 < c->len; i++)
        if (c->src[i] == '{' && strchr("{%#", c->src[i + 1]))
            return i;
    return c->len;
}

int chat_canon_append(const char *src, bool partial, struct lora_buf *out, const char **what,
                      size_t *at)
{
    struct canon c = {.src = src, .len = strlen(src), .out = out, .partial = partial};
    enum tag_kind prev = TAG_NONE;
    bool prev_strip = false, prev_keep = false;
    size_t pos = 0;
    int rc = -1;

    if (c.len && src[c.len - 1] == '\n')
        c.len--;
    lora_buf_add_str(&c.lit,
                     ""); /* allocated from the start: tokens point into strs even when empty */
    lora_buf_add_str(&c.strs, "");
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
    if (c.oom || c.lit.failed || c.strs.failed || out->failed) {
        c.error = NULL;
        rc = -1;
    }
    if (rc < 0) {
        *what = c.error;
        *at = c.error_at;
    }
    lora_buf_release(&c.lit);
    lora_buf_release(&c.strs);
    free(c.toks);
    return rc;
}
