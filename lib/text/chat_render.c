/* chat_render: each family's renderer, from a detected or built-in template and a list of
 * messages to a prompt; see chat_template_impl.h.
 *
 * Each renderer writes what its family's template writes for system, user and assistant
 * messages, with Python's string semantics. Messages are validated before anything is
 * written, so an error never leaves a partial prompt.
 */
#include "chat_template_impl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

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
    struct lora_buf out;
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
    lora_buf_add_str(&r->out, s);
}

static void put_span(struct render *r, struct span s)
{
    lora_buf_add(&r->out, s.p, s.len);
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
            lora_buf_add_char(&r->out, *fmt);
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
            lora_buf_add(&r->out, months[tm->tm_mon % 12], 3);
            break;
        case 'B':
            put(r, months[tm->tm_mon % 12]);
            break;
        default:
            lora_buf_add_char(&r->out, *fmt);
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
    struct lora_buf turn = {0};
    struct span content;

    if (system && slot == LORA_CHAT_SYSTEM_SYS_BLOCK && k == 0) {
        lora_buf_add_str(&turn, "<<SYS>>\n");
        lora_buf_add_str(&turn, system);
        lora_buf_add_str(&turn, "\n<</SYS>>\n\n");
    } else if (system && ((slot == LORA_CHAT_SYSTEM_FIRST_USER && k == 0) ||
                          (slot == LORA_CHAT_SYSTEM_LAST_USER && i == r->n - 1))) {
        lora_buf_add_str(&turn, system);
        lora_buf_add_str(&turn, "\n\n");
    }
    lora_buf_add_str(&turn, r->msgs[i].content);
    r->out.failed |= turn.failed;
    content = turn.data ? (struct span){turn.data, turn.len} : (struct span){"", 0};
    if (t->inst.user_strip)
        content = py_strip(content);
    if (t->inst.bos_per_user)
        put(r, t->bos_token);
    put(r, t->inst.open);
    put_span(r, content);
    put(r, t->inst.close);
    lora_buf_release(&turn);
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

int chat_render_messages(const struct lora_chat_template *t, const struct lora_chat_message *msgs,
                         size_t n, bool add_generation_prompt, char **out, size_t *out_len,
                         char *err, size_t err_len)
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
    lora_buf_add_str(&r.out, "");
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
    if (rc == 0 && r.out.failed)
        rc = render_fail(&r, "out of memory rendering %zu messages", n);
    if (rc == 0) {
        *out = r.out.data;
        *out_len = r.out.len;
        r.out = (struct lora_buf){0};
    }
out:
    lora_buf_release(&r.out);
    free(r.roles);
    return rc;
}
