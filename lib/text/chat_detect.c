/* chat_detect: which known family a Jinja chat template is, and the parameters its rendering
 * needs, read from the template's canonical form (chat_canon.c); see chat_template_impl.h.
 *
 * Snippets are Jinja; "message" stands for the loop variable over the messages. A detector
 * finds each snippet in the canonical template and reads parameters from the literals next
 * to it. Where the template differs, the error says which part was not found.
 */
#include "chat_template_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/errbuf.h"

struct det {
    struct lora_buf canon; /* of the template */
    struct lora_buf snip;  /* of the last snippet */
    struct lora_buf text;  /* the last literal read */
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
    lora_errf(d->err, d->err_len, "unable to render chat template: %s; " CHAT_HINT, what);
    return -1;
}

/* The canonical snippet, or a string no template contains when it cannot be built. */
static const char *snippet(struct det *d, const char *jinja)
{
    const char *what;
    size_t at;

    d->snip.len = 0;
    lora_buf_add_str(&d->snip, "");
    if (d->snip.failed || chat_canon_append(jinja, true, &d->snip, &what, &at) < 0) {
        d->oom = true;
        return "\x01";
    }
    return d->snip.data;
}

/* Where snippet jinja occurs in the canonical template at or after from (NULL: the start). */
static const char *find_from(struct det *d, const char *from, const char *jinja)
{
    return strstr(from ? from : d->canon.data, snippet(d, jinja));
}

static const char *find(struct det *d, const char *jinja)
{
    return find_from(d, NULL, jinja);
}

/* The position after the first occurrence of snippet jinja at or after from, or NULL. */
static const char *find_end(struct det *d, const char *from, const char *jinja)
{
    const char *p = find_from(d, from, jinja);

    return p ? p + strlen(d->snip.data) : NULL;
}

/* The last occurrence of snippet jinja that starts before limit, or NULL. */
static const char *find_last_before(struct det *d, const char *limit, const char *jinja)
{
    const char *s = snippet(d, jinja), *hit = NULL, *p = d->canon.data;

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

    return (size_t)(p - d->canon.data) >= n && memcmp(p - n, s, n) == 0;
}

/* Reads the canonical string "..." at p into d->text; returns the position after it. */
static const char *read_str(struct det *d, const char *p)
{
    d->text.len = 0;
    lora_buf_add_str(&d->text, "");
    if (!p || *p != '"')
        return NULL;
    for (p++; *p && *p != '"'; p++) {
        if (*p == '\\') {
            p++;
            lora_buf_add_char(&d->text, *p == 'n' ? '\n' : *p);
        } else {
            lora_buf_add_char(&d->text, *p);
        }
    }
    if (!*p || d->text.failed) {
        d->oom |= d->text.failed;
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
    memcpy(dst, d->text.data, d->text.len + 1);
    return true;
}

static bool has_raw(const struct det *d, const char *s)
{
    return strstr(d->canon.data, s) != NULL;
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
    const char *p = d->canon.data;

    while ((p = strstr(p, "raise_exception(")) != NULL) {
        const char *q = read_str(d, p + strlen("raise_exception("));
        bool ok = q && (strstr(d->text.data, "tool") || strstr(d->text.data, "Tool"));

        for (size_t i = 0; q && !ok && i < n; i++)
            ok = allowed[i] && strcmp(d->text.data, allowed[i]) == 0;
        if (!ok)
            return det_fail(d, "the template raises an error this renderer does not model (%.80s)",
                            q ? d->text.data : "a computed message");
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
    const char *p = d->canon.data;

    while (*p) {
        const char *end = item_end(p);
        bool is_lit = strncmp(p, "{{\"", 3) == 0 && read_lit(d, p) == end;

        if (!end)
            return det_fail(d, "%s template whose canonical form does not split", inv->family);
        if (is_lit && mentions_any(d->text.data, inv->markers, inv->n_markers)) {
            bool known = false;

            for (size_t i = 0; i < inv->n_literals && !known; i++)
                known = inv->literals[i] && strcmp(d->text.data, inv->literals[i]) == 0;
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
    const char *p = d->canon.data;

    while ((p = strstr(p, head)) != NULL) {
        const char *after = read_lit(d, p);
        size_t n = d->text.len, tn = strlen(tail);
        size_t hn = strlen("<|im_start|>system\n");

        if (!after || n < hn + tn || strcmp(d->text.data + n - tn, tail) != 0) {
            p += strlen(head);
            continue;
        }
        d->text.data[n - tn] = '\0';
        const char *text = d->text.data + hn;
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
    if (strstr(strstr(d->canon.data, "add_generation_prompt") + 1, "add_generation_prompt"))
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
    else if (strcmp(t->chatml.default_system, CHAT_QWEN25_SYSTEM) == 0)
        snprintf(t->name, sizeof(t->name), "qwen2.5");
    else if (strcmp(t->chatml.default_system, CHAT_QWEN2_SYSTEM) == 0)
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
    if (!p || strncmp(d->text.data, prefix, strlen(prefix)) != 0 || d->text.len < strlen(suffix) ||
        strcmp(d->text.data + d->text.len - strlen(suffix), suffix) != 0 ||
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
    const char *p = strstr(d->canon.data, "{{");

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
    else if (ends_with_at(d, d->canon.data + d->canon.len, snippet(d, L3_GEN_ALWAYS)))
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
    *out = p ? pick(d->text.data, choices, n) : NULL;
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

/* A way a turn writes its content: the message's (message.content), or, in a template with a
 * <<SYS>> block, the variable that holds it with the block (content); stripped or not. */
struct content_form {
    const char *jinja;
    bool own_var, strip;
};

/* The position after the first of forms at p that the template's system slot allows, or NULL;
 * *strip tells whether it strips. */
static const char *match_content(struct det *d, const char *p, const struct lora_chat_template *t,
                                 const struct content_form *forms, size_t n, bool *strip)
{
    bool sys_block = t->inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK;
    const char *q = NULL;

    for (size_t i = 0; p && !q && i < n; i++) {
        if (forms[i].own_var != sys_block)
            continue;
        q = match_at(d, p, forms[i].jinja);
        *strip = forms[i].strip;
    }
    return q;
}

/* [bos_token] OPEN content CLOSE. The content is the <<SYS>> block's own variable or the
 * message's, possibly stripped. */
static const char *detect_inst_turn(struct det *d, struct lora_chat_template *t, const char *p,
                                    const char **open, const char **close)
{
    static const struct content_form forms[] = {
        {"{{ message.content }}", false, false},
        {"{{ content }}", true, false},
        {"{{ content.strip() }}", true, true},
        {"{{ message.content.strip() }}", false, true},
        {"{{ message.content | trim }}", false, true},
    };
    const char *q;

    if (match_at(d, p, "{{ bos_token }}")) {
        t->inst.bos_per_user = true;
        p = match_at(d, p, "{{ bos_token }}");
    }
    p = read_choice(d, p, inst_opens, N_OF(inst_opens), open);
    q = match_content(d, p, t, forms, N_OF(forms), &t->inst.user_strip);
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
    static const struct content_form forms[] = {
        {"{{ message.content }}", false, false},
        {"{{ content }}", true, false},
        {"{{ message.content | trim }}", false, true},
        {"{{ message.content.strip() }}", false, true},
        {"{{ content.strip() }}", true, true},
    };
    const char *q;

    p = read_space(d, p, &t->inst.asst_lead);
    q = match_content(d, p, t, forms, N_OF(forms), &t->inst.asst_strip);
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
    const char *bos = strstr(d->canon.data, "{{bos_token}}");

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

int chat_detect_template(const char *jinja_source, struct lora_chat_template *t, char *err,
                         size_t err_len)
{
    struct det d = {.err = err, .err_len = err_len};
    const char *what = NULL;
    size_t at = 0;
    int rc = -1;

    if (!jinja_source) {
        lora_errf(err, err_len, "unable to render chat template: no template; " CHAT_HINT);
        return -1;
    }
    lora_buf_add_str(&d.canon, "");
    if (d.canon.failed || chat_canon_append(jinja_source, false, &d.canon, &what, &at) < 0) {
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
        rc = detect_chatml(&d, t);
    else if (llama3)
        rc = detect_llama3(&d, t);
    else if (inst)
        rc = detect_inst(&d, t);
    else
        det_fail(&d, "not a ChatML, Llama 3 or [INST] template");
out:
    if (d.oom) {
        lora_errf(err, err_len, "unable to render chat template: out of memory");
        rc = -1;
    }
    lora_buf_release(&d.canon);
    lora_buf_release(&d.snip);
    lora_buf_release(&d.text);
    return rc;
}
