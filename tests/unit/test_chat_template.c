/* Unit tests for lib/text/chat_template: detection of every family from template texts (the
 * fixtures in tests/ref/chat_templates/ and inline templates in the idioms real ones use),
 * near-misses that must be refused, built-in names, tokenizer_config.json parsing, rendering
 * against prompts written by hand from each published format, every error message, the
 * canonical form, and rendering from many threads at once.
 * The Jinja reference comparison lives in tests/e2e/chat_template.bats.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/chat_template.h"
#include "check.h"
#include "fixture.h"

#define FIXTURES "tests/ref/chat_templates/"

/* Reads a whole file (malloc'd), or NULL after a diagnostic. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (!f) {
        printf("# unable to open %s (run from the repository root)\n", path);
        check_cur_failed = 1;
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

/* Detects fixture name (without .jinja) with the given tokens; returns detect's result. */
static int detect_fixture(const char *name, const char *bos, const char *eos,
                          struct lora_chat_template *t)
{
    char path[256], err[512];
    char *src;
    int rc;

    snprintf(path, sizeof(path), FIXTURES "%s.jinja", name);
    src = read_text(path);
    if (!src)
        return -2;
    rc = lora_chat_template_detect(src, t, err, sizeof(err));
    if (rc == 0)
        rc = lora_chat_template_set_tokens(t, bos, eos, err, sizeof(err));
    if (rc)
        printf("# %s: %s\n", name, err);
    free(src);
    return rc;
}

/* Detects src, which must fail with a message containing phrase. */
#define CHECK_REFUSED(src, phrase)                                                                 \
    do {                                                                                           \
        struct lora_chat_template t_;                                                              \
        char e_[512] = "";                                                                         \
        CHECK(lora_chat_template_detect((src), &t_, e_, sizeof(e_)) == -1);                        \
        CHECK_CONTAINS(e_, "unable to render chat template: ");                                    \
        CHECK_CONTAINS(e_, (phrase));                                                              \
        CHECK_CONTAINS(e_, "; pass --chat-template chatml|llama3|llama2|mistral");                 \
    } while (0)

#define MSGS(...)                                                                                  \
    (const struct lora_chat_message[]){__VA_ARGS__},                                               \
        sizeof((const struct lora_chat_message[]){__VA_ARGS__}) / sizeof(struct lora_chat_message)

static void expect_render_at(int line, const struct lora_chat_template *t, bool gen,
                             const char *want, const struct lora_chat_message *m, size_t n)
{
    char err[512] = "", *out = NULL;
    size_t len = 0;

    if (lora_chat_template_render(t, m, n, gen, &out, &len, err, sizeof(err)) < 0) {
        printf("# line %d: render failed: %s\n", line, err);
        check_cur_failed = 1;
        return;
    }
    if (len != strlen(out) || strcmp(out, want) != 0) {
        printf("# line %d: rendered\n#   [%s]\n# expected\n#   [%s]\n", line, out, want);
        check_cur_failed = 1;
    }
    free(out);
}

/* EXPECT_RENDER(template, add_generation_prompt, expected prompt, messages...) */
#define EXPECT_RENDER(t, gen, want, ...)                                                           \
    expect_render_at(__LINE__, (t), (gen), (want), MSGS(__VA_ARGS__))

static void expect_refusal_at(int line, const struct lora_chat_template *t, const char *phrase,
                              const struct lora_chat_message *m, size_t n)
{
    char err[512] = "", *out = (char *)"unset";
    size_t len = 1;

    if (lora_chat_template_render(t, m, n, true, &out, &len, err, sizeof(err)) == 0) {
        printf("# line %d: rendered [%s], expected an error with '%s'\n", line, out, phrase);
        free(out);
        check_cur_failed = 1;
        return;
    }
    if (out != NULL || len != 0 || !strstr(err, phrase)) {
        printf("# line %d: error '%s' does not contain '%s' (or out was not cleared)\n", line, err,
               phrase);
        check_cur_failed = 1;
    }
}

#define EXPECT_REFUSAL(t, phrase, ...) expect_refusal_at(__LINE__, (t), (phrase), MSGS(__VA_ARGS__))

#define SYS(s)                                                                                     \
    {                                                                                              \
        "system", (s)                                                                              \
    }
#define USER(s)                                                                                    \
    {                                                                                              \
        "user", (s)                                                                                \
    }
#define ASST(s)                                                                                    \
    {                                                                                              \
        "assistant", (s)                                                                           \
    }

static struct lora_chat_template by_name(const char *name)
{
    struct lora_chat_template t;
    char err[256];

    if (lora_chat_template_by_name(name, &t, err, sizeof(err)) < 0) {
        printf("# %s: %s\n", name, err);
        check_cur_failed = 1;
        memset(&t, 0, sizeof(t));
    }
    return t;
}

/* ---- canonical form ---------------------------------------------------------------------- */

static void expect_canonical_at(int line, const char *src, const char *want)
{
    char err[256], *out;
    size_t len;

    if (lora_chat_template_canonical(src, &out, &len, err, sizeof(err)) < 0) {
        printf("# line %d: %s\n", line, err);
        check_cur_failed = 1;
        return;
    }
    if (strcmp(out, want) != 0) {
        printf("# line %d: canonical\n#   %s\n# expected\n#   %s\n", line, out, want);
        check_cur_failed = 1;
    }
    free(out);
}

#define EXPECT_CANONICAL(src, want) expect_canonical_at(__LINE__, (src), (want))

static void test_canonical(void)
{
    /* quoting, subscripts, concatenation split into terms, literals merged */
    EXPECT_CANONICAL("{{ '<|a|>' + message['role'] + \"\\n\" }}{{ 'b' }}",
                     "{{\"<|a|>\"}}{{message.role}}{{\"\\nb\"}}");
    /* "a" + "b" merged inside statements; an addition with a number left whole */
    EXPECT_CANONICAL("{% set x = 'a' + 'b' %}{{ loop.index0 + 1 }}{{ a ~ b }}",
                     "{%set x=\"ab\"%}{{loop.index0+1}}{{a}}{{b}}");
    /* a filter binds tighter than +: the merge must not swallow it */
    EXPECT_CANONICAL("{{ 'a' + 'b' | trim }}", "{{\"a\"}}{{\"b\"|trim}}");
    /* the loop variable over messages becomes message; others keep their names */
    EXPECT_CANONICAL("{% for m in messages %}{{ m.content }}{% for x in m.parts %}{{ x }}{{ m.role "
                     "}}{% endfor %}{% endfor %}{{ m }}",
                     "{%for message in messages%}{{message.content}}{%for x in message.parts%}"
                     "{{x}}{{message.role}}{%endfor%}{%endfor%}{{m}}");
    /* trim_blocks and lstrip_blocks; a newline after }} stays; the last newline goes */
    EXPECT_CANONICAL("{% if x %}\n    {{ y }}\n  {% endif %}\n", "{%if x%}{{\"    \"}}{{y}}"
                                                                 "{{\"\\n\"}}{%endif%}");
    /* - control strips all whitespace; +%} keeps the newline; comments vanish */
    EXPECT_CANONICAL("a  {#- c -#}  b {%- if x +%}\nc", "{{\"ab\"}}{%if x%}{{\"\\nc\"}}");
    /* string escapes decode, and quotes and backslashes re-escape */
    EXPECT_CANONICAL("{{ 'it\\'s \\x41\\u00e9 \\\\ \"q\" \\d' }}",
                     "{{\"it's A\xc3\xa9 \\\\ \\\"q\\\" \\\\d\"}}");
    /* transformers' generation markers render their body */
    EXPECT_CANONICAL("{% generation %}{{ 'x' }}{% endgeneration %}{{ 'y' }}", "{{\"xy\"}}");

    static const char *const broken[] = {
        "{{ 'open",       "{% if x", "{# never closed", "{{ '\\x4' }}", "{{ '\\UFFFFFFFF' }}",
        "{{ '\\ud800' }}"};
    for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
        char err[256], *out = (char *)"x";
        size_t len = 1;

        CHECK(lora_chat_template_canonical(broken[i], &out, &len, err, sizeof(err)) == -1);
        CHECK(out == NULL && len == 0);
        CHECK_CONTAINS(err, "the template does not parse: ");
        CHECK_REFUSED(broken[i], "the template does not parse (");
    }
}

/* ---- detection --------------------------------------------------------------------------- */

static void test_detect_fixtures(void)
{
    static const struct {
        const char *file, *name;
        enum lora_chat_family family;
    } cases[] = {
        {"chatml", "chatml", LORA_CHAT_CHATML},
        {"qwen2.5", "qwen2.5", LORA_CHAT_CHATML},
        {"qwen2", "qwen2", LORA_CHAT_CHATML},
        {"llama3-instruct", "llama3", LORA_CHAT_LLAMA3},
        {"llama3.1", "llama3.1", LORA_CHAT_LLAMA3},
        {"llama3.2", "llama3.2", LORA_CHAT_LLAMA3},
        {"llama2", "llama2", LORA_CHAT_LLAMA2},
        {"mistral-v0.1", "mistral-v0.1", LORA_CHAT_MISTRAL},
        {"mistral-v1", "mistral-v1", LORA_CHAT_MISTRAL},
        {"mistral-v3", "mistral-v3", LORA_CHAT_MISTRAL},
        {"mistral-v3-tekken", "mistral-v3-tekken", LORA_CHAT_MISTRAL},
    };
    struct lora_chat_template t;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK(detect_fixture(cases[i].file, "<s>", "</s>", &t) == 0);
        CHECK(t.family == cases[i].family);
        CHECK(strcmp(t.name, cases[i].name) == 0);
    }

    CHECK(detect_fixture("qwen2.5", NULL, NULL, &t) == 0);
    CHECK(t.chatml.has_default_system && !t.chatml.qwen3_think && !t.emits_bos);
    CHECK(strcmp(t.chatml.default_system,
                 "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") == 0);
    CHECK(detect_fixture("qwen2", NULL, NULL, &t) == 0);
    CHECK(strcmp(t.chatml.default_system, "You are a helpful assistant.") == 0);
    CHECK(detect_fixture("chatml", NULL, NULL, &t) == 0);
    CHECK(!t.chatml.has_default_system && t.bos_token[0] == '\0');

    CHECK(detect_fixture("llama3-instruct", NULL, NULL, &t) == 0);
    CHECK(t.emits_bos && t.llama3.trim_content && !t.llama3.gen_prompt_always);
    CHECK(!t.llama3.system_block);
    CHECK(detect_fixture("llama3.1", NULL, NULL, &t) == 0);
    CHECK(t.llama3.system_block && t.emits_bos);
    CHECK(strcmp(t.llama3.date_prefix, "Cutting Knowledge Date: December 2023\nToday Date: ") == 0);
    CHECK(strcmp(t.llama3.date_default, "26 Jul 2024") == 0 && !t.llama3.date_format[0]);
    CHECK(detect_fixture("llama3.2", NULL, NULL, &t) == 0);
    CHECK(strcmp(t.llama3.date_format, "%d %b %Y") == 0);

    CHECK(detect_fixture("llama2", NULL, NULL, &t) == 0);
    CHECK(t.inst.system_slot == LORA_CHAT_SYSTEM_SYS_BLOCK && t.inst.bos_per_user);
    CHECK(strcmp(t.inst.open, "[INST] ") == 0 && strcmp(t.inst.close, " [/INST]") == 0);
    CHECK(t.inst.user_strip && t.inst.asst_strip);
    CHECK(strcmp(t.inst.asst_lead, " ") == 0 && strcmp(t.inst.asst_mid, " ") == 0);
    CHECK(strcmp(t.inst.alternate_error,
                 "Conversation roles must alternate user/assistant/user/assistant/...") == 0);
    CHECK(t.inst.role_error[0] == '\0' && t.emits_bos && t.emits_eos);

    CHECK(detect_fixture("mistral-v0.1", NULL, NULL, &t) == 0);
    CHECK(t.inst.system_slot == LORA_CHAT_SYSTEM_NONE && !t.inst.bos_per_user && t.emits_bos);
    CHECK(strcmp(t.inst.asst_lead, "") == 0 && strcmp(t.inst.asst_tail, " ") == 0);
    CHECK(strcmp(t.inst.role_error, "Only user and assistant roles are supported!") == 0);
    CHECK(detect_fixture("mistral-v1", NULL, NULL, &t) == 0);
    CHECK(t.inst.system_slot == LORA_CHAT_SYSTEM_FIRST_USER);
    CHECK(strcmp(t.inst.open, " [INST] ") == 0 && !t.inst.asst_strip);
    CHECK_CONTAINS(t.inst.alternate_error, "After the optional system message, conversation");
    CHECK(detect_fixture("mistral-v3", NULL, NULL, &t) == 0);
    CHECK(t.inst.system_slot == LORA_CHAT_SYSTEM_LAST_USER && t.inst.asst_strip);
    CHECK(strcmp(t.inst.open, "[INST] ") == 0 && strcmp(t.inst.close, "[/INST]") == 0);
    CHECK(detect_fixture("mistral-v3-tekken", NULL, NULL, &t) == 0);
    CHECK(strcmp(t.inst.open, "[INST]") == 0 && strcmp(t.inst.asst_lead, "") == 0);
}

/* Templates in the idioms of published ones (written here, one line each as most are). */
#define LLAMA3_SET_BODY                                                                            \
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "        \
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "     \
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"       \
    "{% endif %}{{ content }}{% endfor %}"
static const char LLAMA3_SET_FORM[] =
    LLAMA3_SET_BODY "{% if add_generation_prompt %}"
                    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* ChatML whose default system message sits in the no-tools branch, as Qwen2.5's does. */
static const char CHATML_TOOLS_BRANCH[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- for tool in tools %}{{- tool | "
    "tojson }}{%- endfor %}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        "
    "{{- '<|im_start|>"
    "system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '"
    "<|im_start|>system\\nYou are a pirate.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == "
    "\"system\" and not loop.first) or (message.role == \"assistant\") %}\n        {{- '"
    "<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    "
    "{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>"
    "assistant\\n' }}\n{%- endif %}\n";

static void test_detect_inline(void)
{
    struct lora_chat_template t;
    char err[512];

    CHECK(lora_chat_template_detect(LLAMA3_SET_FORM, &t, err, sizeof(err)) == 0);
    CHECK(t.family == LORA_CHAT_LLAMA3 && t.emits_bos && t.llama3.trim_content);
    CHECK(!t.llama3.gen_prompt_always);
    CHECK(lora_chat_template_detect(CHATML_TOOLS_BRANCH, &t, err, sizeof(err)) == 0);
    CHECK(t.family == LORA_CHAT_CHATML && t.chatml.has_default_system);
    CHECK(strcmp(t.chatml.default_system, "You are a pirate.") == 0);
    CHECK(strcmp(t.name, "chatml-default-system") == 0);

    /* Llama 3 without trim, generation prompt unconditional after the loop */
    CHECK(lora_chat_template_detect(
              "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
              "message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}"
              "{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
              &t, err, sizeof(err)) == 0);
    CHECK(!t.llama3.trim_content && t.llama3.gen_prompt_always && t.emits_bos);
}

static void test_detect_near_misses(void)
{
    static const char chatml_gen[] =
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
#define CHATML_TURN_ONLY                                                                           \
    "{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    static const char chatml_loop[] =
        "{% for message in messages %}" CHATML_TURN_ONLY "{% endfor %}";
    char src[2048];

    CHECK_REFUSED("", "not a ChatML, Llama 3 or [INST] template");
    CHECK_REFUSED("{% for m in messages %}<|user|>\n{{ m.content }}</s>{% endfor %}",
                  "not a ChatML, Llama 3 or [INST] template");
    CHECK_REFUSED("{% for message in messages %}{{ '<start_of_turn>' + message.role + '\n' + "
                  "message.content | trim + '<end_of_turn>\n' }}{% endfor %}",
                  "not a ChatML, Llama 3 or [INST] template");
    CHECK_REFUSED("{% for message in messages %}{{ '<|im_start|>' + message.role + ': ' + "
                  "message.content + '<|im_end|>\n' }}{% endfor %}",
                  "ChatML markers, but no turn");
    snprintf(src, sizeof(src), "%s%s", chatml_loop,
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}");
    CHECK_REFUSED(src, "whose generation prompt is not");
    snprintf(src, sizeof(src), "%s", chatml_loop);
    CHECK_REFUSED(src, "whose generation prompt is not");
    snprintf(src, sizeof(src), "%s%s%s", chatml_loop, chatml_gen,
             "{% if add_generation_prompt %}{{ 'again' }}{% endif %}");
    CHECK_REFUSED(src, "tests add_generation_prompt twice");
    snprintf(src, sizeof(src), "%s%s%s",
             "{% if messages|length > 9 %}{{ raise_exception('Too long') }}{% endif %}",
             chatml_loop, chatml_gen);
    CHECK_REFUSED(src, "the template raises an error this renderer does not model (Too long)");
    snprintf(src, sizeof(src), "%s%s%s", "{{ '<|im_start|>system\nAlways here.<|im_end|>\n' }}",
             chatml_loop, chatml_gen);
    CHECK_REFUSED(src, "a fixed system message ('Always here.') under a condition");
    snprintf(src, sizeof(src), "%s%s%s",
             "{% for message in messages %}{% set c = message.content.split('</think>')[-1] %}"
             "{% endfor %}",
             chatml_loop, chatml_gen);
    CHECK_REFUSED(src, "with <think> handling that is not Qwen3's (part 1 differs)");
    snprintf(src, sizeof(src), "%s%s", chatml_loop,
             "{{ '<|start_header_id|>' }}{% if add_generation_prompt %}x{% endif %}");
    CHECK_REFUSED(src, "the template mixes ChatML, Llama 3 and [INST] markers");

    /* the fingerprints are there, but something else writes markers or content */
    snprintf(src, sizeof(src), "%s%s%s",
             "{% for message in messages %}{% if message.role == 'system' %}{{ '<|im_start|>"
             "system name=sys\n' + message.content + '<|im_end|>\n' }}{% else %}",
             CHATML_TURN_ONLY "{% endif %}{% endfor %}", chatml_gen);
    CHECK_REFUSED(src, "a ChatML template that also writes {{\"<|im_start|>system name=sys\\n\"}}");
    snprintf(src, sizeof(src), "%s%s%s",
             "{% for message in messages %}{% if message.role == 'assistant' %}{{ '<|im_start|>"
             "assistant\n' + message.content | trim + '<|im_end|>\n' }}{% else %}",
             CHATML_TURN_ONLY "{% endif %}{% endfor %}", chatml_gen);
    CHECK_REFUSED(src, "a ChatML template that also writes {{message.content|trim}}");
    snprintf(src, sizeof(src), "%s%s", LLAMA3_SET_FORM,
             "{{ '<|start_header_id|>tool<|end_header_id|>\n\n' }}");
    CHECK_REFUSED(src, "a Llama 3 template that also writes");
    CHECK_REFUSED("{{ bos_token }}{% for message in messages %}{% if message.role == 'user' %}"
                  "{{ '[INST] ' + message.content + ' [/INST]' }}{% elif message.role == "
                  "'assistant' %}{{ message.content + eos_token }}{% endif %}{% endfor %}"
                  "{{ '[INST]\n' }}",
                  "an [INST] template that also writes {{\"[INST]\\n\"}}");

    CHECK_REFUSED("{% for message in messages %}{{ '<|start_header_id|>' + message.role + "
                  "'<|end_header_id|>\n\n' + message.content | trim }}{% endfor %}",
                  "Llama 3 markers, but no turn");
    CHECK_REFUSED("{% for message in messages %}{{ '<|start_header_id|>' + message.role + "
                  "'<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}"
                  "{% endfor %}",
                  "a Llama 3 template without the generation prompt");
    CHECK_REFUSED(LLAMA3_SET_BODY "{% if add_generation_prompt %}{{ '<|start_header_id|>"
                                  "assistant<|end_header_id|>\n\n' + 'x' }}{% endif %}",
                  "a Llama 3 template without the generation prompt");

    /* Llama 3.1 blocks that miss a piece: tools not defaulted, no literal date */
    char *l31 = read_text(FIXTURES "llama3.1.jinja");
    if (l31) {
        char *p = strstr(l31, "set tools = none");
        memcpy(p, "set tools = []  ", 16);
        CHECK_REFUSED(l31, "tools are not set to none");
        free(l31);
    }
    l31 = read_text(FIXTURES "llama3.1.jinja");
    if (l31) {
        char *p = strstr(l31, "\"26 Jul 2024\"");
        memcpy(p, "date_of_today", 13);
        CHECK_REFUSED(l31, "without a literal default date_string");
        free(l31);
    }
    l31 = read_text(FIXTURES "llama3.2.jinja");
    if (l31) {
        memcpy(strstr(l31, "%d %b %Y"), "%d %b %y", 8);
        CHECK_REFUSED(l31, "a Llama 3.1 date from strftime_now in a format other than");
        free(l31);
    }
    l31 = read_text(FIXTURES "llama3.1.jinja");
    if (l31) {
        memcpy(strstr(l31, "Today Date: "), "Today is  : ", 12);
        CHECK_REFUSED(l31, "a Llama 3.1-style system block not of the form");
        free(l31);
    }

    /* [INST] near-misses */
    static const char inst[] =
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('alternate!') }}{% endif %}{% if "
        "message['role'] == 'user' %}{{ OPEN + message['content'] + ' [/INST]' }}{% elif "
        "message['role'] == 'assistant' %}{{ ASST + eos_token }}{% endif %}{% endfor %}TAIL";
    static const struct {
        const char *open, *asst, *tail, *phrase;
    } bad[] = {
        {"'[INST]\\n'", "message['content']", "", "an [INST] user turn not of the form"},
        {"'[INST] '", "'  ' + message['content']", "", "an [INST] assistant turn not of the form"},
        {"'[INST] '", "message['content'] | upper", "", "an [INST] assistant turn not of the"},
        {"'[INST] '", "message['content']", "{% if add_generation_prompt %}x{% endif %}",
         "an [INST] template that uses add_generation_prompt"},
        {"'[INST] '", "message['content']", "{{ raise_exception('no way') }}",
         "raises an error this renderer does not model (no way)"},
        {"'[INST] '", "message['content']", "{{ bos_token }}",
         "an [INST] template with bos_token where it is not recognised"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *p;

        snprintf(src, sizeof(src), "%s", inst);
        p = strstr(src, "TAIL");
        snprintf(p, sizeof(src) - (size_t)(p - src), "%s", bad[i].tail);
        char tmp[2048];
        snprintf(tmp, sizeof(tmp), "%s", src);
        p = strstr(tmp, "OPEN");
        snprintf(src, sizeof(src), "%.*s%s%s", (int)(p - tmp), tmp, bad[i].open, p + 4);
        snprintf(tmp, sizeof(tmp), "%s", src);
        p = strstr(tmp, "ASST");
        snprintf(src, sizeof(src), "%.*s%s%s", (int)(p - tmp), tmp, bad[i].asst, p + 4);
        CHECK_REFUSED(src, bad[i].phrase);
    }
    CHECK_REFUSED("{% for message in messages %}{% if message.role == 'user' %}{{ '[INST] ' + "
                  "message.content + ' [/INST]' }}{% endif %}{% endfor %}<<SYS>>",
                  "a <<SYS>> template whose system block is not");
    CHECK_REFUSED("{% set system_message = messages[0].content %}{{ '[INST] ' }}",
                  "takes the system message in a way not recognised");
    CHECK_REFUSED("{{ '[INST] ' + messages[0].content + ' [/INST]' }}",
                  "without a user branch in a loop over the messages");

    struct lora_chat_template t;
    char err[256] = "";
    CHECK(lora_chat_template_detect(NULL, &t, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no template");
}

/* ---- built-in names and tokens ------------------------------------------------------------- */

static void test_by_name(void)
{
    static const struct {
        const char *name, *variant, *bos, *eos;
        enum lora_chat_family family;
    } cases[] = {
        {"chatml", "chatml", "", "<|im_end|>", LORA_CHAT_CHATML},
        {"qwen2.5", "qwen2.5", "", "<|im_end|>", LORA_CHAT_CHATML},
        {"qwen3", "qwen3", "", "<|im_end|>", LORA_CHAT_CHATML},
        {"llama3", "llama3", "<|begin_of_text|>", "<|eot_id|>", LORA_CHAT_LLAMA3},
        {"llama3.1", "llama3.1", "<|begin_of_text|>", "<|eot_id|>", LORA_CHAT_LLAMA3},
        {"llama2", "llama2", "<s>", "</s>", LORA_CHAT_LLAMA2},
        {"mistral", "mistral-v3", "<s>", "</s>", LORA_CHAT_MISTRAL},
        {"mistral-v3", "mistral-v3", "<s>", "</s>", LORA_CHAT_MISTRAL},
        {"mistral-v1", "mistral-v1", "<s>", "</s>", LORA_CHAT_MISTRAL},
    };
    struct lora_chat_template t;
    char err[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        t = by_name(cases[i].name);
        CHECK(t.family == cases[i].family);
        CHECK(strcmp(t.name, cases[i].variant) == 0);
        CHECK(strcmp(t.bos_token, cases[i].bos) == 0 && strcmp(t.eos_token, cases[i].eos) == 0);
    }
    CHECK(by_name("qwen3").chatml.qwen3_think);
    CHECK(by_name("qwen2.5").chatml.has_default_system);
    CHECK(lora_chat_template_by_name("vicuna", &t, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unknown chat template 'vicuna' (known: chatml, qwen2.5, qwen3, llama3, "
                        "llama3.1, llama2, mistral, mistral-v1, mistral-v3)");
    CHECK(lora_chat_template_by_name(NULL, &t, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "unknown chat template '(null)'");

    char long_token[LORA_CHAT_TOKEN_BYTES + 1];
    memset(long_token, 'x', sizeof(long_token) - 1);
    long_token[sizeof(long_token) - 1] = '\0';
    t = by_name("chatml");
    CHECK(lora_chat_template_set_tokens(&t, long_token, NULL, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "longer than 63 bytes");
    CHECK(lora_chat_template_set_tokens(&t, "<B>", NULL, err, sizeof(err)) == 0);
    CHECK(strcmp(t.bos_token, "<B>") == 0 && strcmp(t.eos_token, "<|im_end|>") == 0);

    CHECK(strcmp(lora_chat_template_family_name(LORA_CHAT_CHATML), "chatml") == 0);
    CHECK(strcmp(lora_chat_template_family_name(LORA_CHAT_LLAMA3), "llama3") == 0);
    CHECK(strcmp(lora_chat_template_family_name(LORA_CHAT_LLAMA2), "llama2") == 0);
    CHECK(strcmp(lora_chat_template_family_name(LORA_CHAT_MISTRAL), "mistral") == 0);
    CHECK(lora_chat_template_family_name((enum lora_chat_family)9) == NULL);
}

/* ---- tokenizer_config.json ----------------------------------------------------------------- */

static int load_config(const char *json, struct lora_chat_template *t, char *err, size_t n)
{
    const char *path = fx_tmp_path("tokenizer_config.json");

    err[0] = '\0';
    if (fx_write_text(path, json) < 0)
        return -2;
    return lora_chat_template_from_config(path, t, err, n);
}

/* The ChatML fixture as a JSON string value. */
static char *chatml_json(void)
{
    char *src = read_text(FIXTURES "chatml.jinja");
    json_t *s = src ? json_string(src) : NULL;
    char *out = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;

    json_decref(s);
    free(src);
    return out;
}

static void test_config(void)
{
    struct lora_chat_template t;
    char err[512], json[8192];
    char *cm = chatml_json();

    if (!cm) {
        check_cur_failed = 1;
        return;
    }
    snprintf(json, sizeof(json),
             "{\"chat_template\": %s, \"bos_token\": null, \"eos_token\": "
             "\"<|im_end|>\", \"model_max_length\": "
             "1000000000000000019884624838656}",
             cm);
    CHECK(load_config(json, &t, err, sizeof(err)) == 0);
    CHECK(t.family == LORA_CHAT_CHATML && strcmp(t.eos_token, "<|im_end|>") == 0);
    CHECK(t.bos_token[0] == '\0');

    snprintf(json, sizeof(json),
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": "
             "\"x\"}, {\"name\": \"default\", \"template\": %s}], "
             "\"eos_token\": {\"__type\": \"AddedToken\", \"content\": "
             "\"<|E|>\", \"lstrip\": false}}",
             cm);
    CHECK(load_config(json, &t, err, sizeof(err)) == 0);
    CHECK(strcmp(t.eos_token, "<|E|>") == 0 && strcmp(t.name, "chatml") == 0);
    free(cm);

    static const struct {
        const char *json, *phrase;
    } cases[] = {
        {"{\"bos_token\": \"<s>\"}",
         "no chat_template (and no chat_template.jinja beside it); pass --chat-template"},
        {"{\"chat_template\": null}", "no chat_template"},
        {"{\"chat_template\": 7}", "'chat_template' must be a string or a list of {name, "
                                   "template}"},
        {"{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}, {\"name\": \"tool_use\", "
         "\"template\": \"y\"}]}",
         "'chat_template' lists 'rag', 'tool_use' but none named 'default'"},
        {"{\"chat_template\": []}", "'chat_template' lists no templates but none named"},
        {"{\"chat_template\": [{\"name\": \"default\"}]}",
         "'chat_template' entry 0 is not a {name, template} pair of strings"},
        {"{\"chat_template\": \"{{ x }}\"}", "unable to render chat template: not a ChatML"},
        {"{\"chat_template\": \"x\", \"bos_token\": 1}",
         "'bos_token' must be a string or an object with a string 'content'"},
        {"{\"chat_template\": \"x\", \"eos_token\": {\"content\": 2}}",
         "'eos_token' must be a string or an object"},
        {"{\"chat_template\": \"x\",", "invalid JSON at line 1"},
        {"{\"chat_template\": \"x\", \"chat_template\": \"y\"}", "invalid JSON"},
        {"[\"chat_template\"]", "top level must be a JSON object"},
        {"{\"chat_template\": \"{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>"
         "' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}{% "
         "endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>"
         "\\n\\n' }}{% endif %}\"}",
         "the llama3 chat template emits bos_token, which the file does not define"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK(load_config(cases[i].json, &t, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, "tokenizer_config.json: ");
        CHECK_CONTAINS(err, cases[i].phrase);
    }

    /* chat_template.jinja beside a config without one, as newer transformers saves them */
    char *l2 = read_text(FIXTURES "llama2.jinja");
    if (l2) {
        CHECK(fx_write_text(fx_tmp_path("chat_template.jinja"), l2) == 0);
        CHECK(load_config("{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\"}", &t,
                          err, sizeof(err)) == 0);
        CHECK(t.family == LORA_CHAT_LLAMA2 && strcmp(t.bos_token, "<s>") == 0);
        CHECK(load_config("{\"eos_token\": \"</s>\"}", &t, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, "emits bos_token, which the file does not define");
        CHECK(fx_write_text(fx_tmp_path("chat_template.jinja"), "nothing to see") == 0);
        CHECK(load_config("{}", &t, err, sizeof(err)) == -1);
        CHECK_CONTAINS(err, "tokenizer_config.json: unable to render chat template: not a");
        remove(fx_tmp_path("chat_template.jinja"));
        free(l2);
    }

    CHECK(lora_chat_template_from_config("/nonexistent/tokenizer_config.json", &t, err,
                                         sizeof(err)) == -1);
    CHECK_CONTAINS(err, "/nonexistent/tokenizer_config.json: unable to open: No such file");
}

/* ---- rendering, expected prompts written from each published format ------------------------- */

static void test_render_chatml(void)
{
    struct lora_chat_template t = by_name("chatml");

    EXPECT_RENDER(&t, true,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi\n<|im_end|>\n"
                  "<|im_start|>assistant\n Hello <|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                  "<|im_start|>assistant\n",
                  SYS("S"), USER("Hi\n"), ASST(" Hello "), USER(""));
    /* any order: ChatML has no alternation rules */
    EXPECT_RENDER(&t, false,
                  "<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
                  "<|im_start|>system\nc<|im_end|>\n",
                  ASST("a"), USER("b"), SYS("c"));

    t = by_name("qwen2.5");
    EXPECT_RENDER(&t, true,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                  "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                  USER("Hi"));
    EXPECT_RENDER(&t, false, "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
                  SYS(""), USER("Hi"));

    t = by_name("qwen3");
    /* the final assistant turn after the last query gets an empty <think> block and loses
     * leading newlines only (lstrip('\n')); earlier ones are written as they are */
    EXPECT_RENDER(&t, false,
                  "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n\n a1<|im_end|>\n"
                  "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                  " a2 <|im_end|>\n",
                  USER("q1"), ASST("\n a1"), USER("q2"), ASST("\n\n a2 "));
    /* reasoning split off at </think>: only the part after the last <think> is kept */
    EXPECT_RENDER(&t, true,
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\n"
                  "answer<|im_end|>\n<|im_start|>assistant\n",
                  USER("q"), ASST("<think>r1<think>\n\nr2\n\n</think>\n\nanswer"));
    /* earlier turns drop their reasoning; a non-final turn after the query keeps it when it
     * has some */
    EXPECT_RENDER(&t, false,
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nkept<|im_end|>\n"
                  "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
                  "a<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n",
                  USER("q"), ASST("<think>x</think>kept"), USER("q2"), ASST("<think>r</think>a"),
                  ASST("b"));
    /* a user turn that is only a tool response is not the last query: the turns after the
     * real one count, but only the final one (or one with reasoning) gets a block */
    EXPECT_RENDER(&t, false,
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
                  "a<|im_end|>\n<|im_start|>user\n<tool_response>r</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n",
                  USER("q"), ASST("a"), USER("<tool_response>r</tool_response>"), ASST("b"));
    /* with no user query at all, the last message is the query */
    EXPECT_RENDER(&t, false,
                  "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n", SYS("s"),
                  ASST("a"));
}

/* The Llama 3.2 prompt for a lone empty system message, dated now by libc's strftime. */
static void today_prompt(char *buf, size_t n)
{
    time_t now = time(NULL);
    struct tm tm;
    char day[32];

    localtime_r(&now, &tm);
    strftime(day, sizeof(day), "%d %b %Y", &tm);
    snprintf(buf, n,
             "<B><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
             "December 2023\nToday Date: %s\n\n<|eot_id|>",
             day);
}

static void test_render_llama3(void)
{
    struct lora_chat_template t = by_name("llama3");

    /* content | trim is Python's strip(): U+0085 and U+3000 go, U+FEFF (not a space) stays */
    EXPECT_RENDER(&t, true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n\xef\xbb\xbfq<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n",
                  SYS(" \n S\t\r\n"), USER("\xc2\x85\xe3\x80\x80\xef\xbb\xbfq\x1c"));
    EXPECT_RENDER(&t, false,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>",
                  USER("   "), USER("b"));

    t = by_name("llama3.1");
    EXPECT_RENDER(&t, true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                  "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n",
                  SYS("  Be brief.\n"), USER("Hi"));
    /* without a system message the dated block is still there, empty; a later system message
     * is an ordinary turn */
    EXPECT_RENDER(&t, false,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                  "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>",
                  USER("Hi"), SYS("S"));

    /* 3.2: today in the C locale, the way Python's strftime("%d %b %Y") writes it */
    struct lora_chat_template t32;
    CHECK(detect_fixture("llama3.2", "<B>", NULL, &t32) == 0);
    char *out = NULL, err[256], before[160], after[160];
    size_t len;

    today_prompt(before, sizeof(before));
    CHECK(lora_chat_template_render(&t32, MSGS(SYS("")), false, &out, &len, err, sizeof(err)) == 0);
    today_prompt(after, sizeof(after)); /* the day may turn meanwhile */
    CHECK(out && (strcmp(out, before) == 0 || strcmp(out, after) == 0));
    free(out);
}

static void test_render_inst(void)
{
    struct lora_chat_template t = by_name("llama2");

    EXPECT_RENDER(&t, true,
                  "<s>[INST] <<SYS>>\n You are terse. \n<</SYS>>\n\n  Hi [/INST] Hello </s>"
                  "<s>[INST] Bye [/INST]",
                  SYS(" You are terse. "), USER("  Hi \n"), ASST("\n Hello \n"), USER(" Bye "));
    /* an empty system message still opens a <<SYS>> block ('' != false in Python); the whole
     * first turn is stripped, so an empty user message loses the block's trailing newlines */
    EXPECT_RENDER(&t, false, "<s>[INST] <<SYS>>\n\n<</SYS>> [/INST]", SYS(""), USER(""));
    EXPECT_RENDER(&t, false, "<s>[INST] q [/INST]  </s>", USER("q"), ASST(""));

    t = by_name("mistral-v1");
    EXPECT_RENDER(&t, false, "<s> [INST] S\n\nq1 [/INST] a1 </s> [INST] q2 [/INST]", SYS("S"),
                  USER("q1"), ASST("a1 "), USER("q2"));

    t = by_name("mistral");
    EXPECT_RENDER(&t, true, "<s>[INST] q1[/INST] a1</s>[INST] S\n\nq2[/INST]", SYS("S"), USER("q1"),
                  ASST("  a1\n"), USER("q2"));
    /* v3 puts the system message before the last message only if that is a user message */
    EXPECT_RENDER(&t, true, "<s>[INST] q1[/INST] a1</s>", SYS("S"), USER("q1"), ASST("a1"));

    struct lora_chat_template v01;
    CHECK(detect_fixture("mistral-v0.1", "<s>", "</s>", &v01) == 0);
    EXPECT_RENDER(&v01, false, "<s>[INST] q [/INST]a</s> [INST] r [/INST]", USER("q"), ASST("a"),
                  USER("r"));
    struct lora_chat_template tk;
    CHECK(detect_fixture("mistral-v3-tekken", "<s>", "</s>", &tk) == 0);
    EXPECT_RENDER(&tk, false, "<s>[INST]S\n\nq[/INST]", SYS("S"), USER("q"));
}

static void test_render_errors(void)
{
    struct lora_chat_template t = by_name("chatml");
    char err[256] = "", *out = (char *)"x";
    size_t len = 1;

    CHECK(lora_chat_template_render(&t, NULL, 3, true, &out, &len, err, sizeof(err)) == -1);
    CHECK(out == NULL && len == 0);
    CHECK_CONTAINS(err, "no messages: a conversation needs at least one message");
    EXPECT_REFUSAL(&t, "message 1: no role", USER("a"), {NULL, "b"});
    EXPECT_REFUSAL(&t, "message 0: no content", {"user", NULL});
    EXPECT_REFUSAL(&t, "message 1: unknown role 'bot' (expected system, user or assistant)",
                   USER("a"), {"bot", "b"});
    EXPECT_REFUSAL(&t, "message 0: unknown role 'System'", {"System", "b"});
    EXPECT_REFUSAL(&t,
                   "message 1: role 'tool' is not supported by the chatml chat template "
                   "renderer (tool calls are not rendered)",
                   USER("a"), {"tool", "{}"});
    EXPECT_REFUSAL(&t,
                   "message 0: role 'developer' is not supported by the chatml chat "
                   "template; send it as 'system'",
                   {"developer", "d"});
    EXPECT_REFUSAL(&t, "message 0: content is not valid UTF-8", USER("\xff\xfe"));
    EXPECT_REFUSAL(&t, "message 0: content is not valid UTF-8", USER("\xed\xa0\x80"));

    t = by_name("llama2");
    EXPECT_REFUSAL(&t,
                   "message 2: role 'user' breaks the alternation: Conversation roles must "
                   "alternate user/assistant/user/assistant/...",
                   SYS("s"), USER("a"), USER("b"));
    EXPECT_REFUSAL(&t, "message 0: role 'assistant' breaks the alternation", ASST("a"));
    EXPECT_REFUSAL(&t, "message 1: the llama2 chat template takes a system message only first",
                   USER("a"), SYS("s"));
    EXPECT_REFUSAL(&t,
                   "message 0: a system message alone renders no turn in the llama2 chat "
                   "template; add a user message",
                   SYS("s"));
    struct lora_chat_template v01;
    CHECK(detect_fixture("mistral-v0.1", "<s>", "</s>", &v01) == 0);
    EXPECT_REFUSAL(&v01, "message 0: role 'system' breaks the alternation", SYS("s"), USER("u"));
    v01.inst.alternate = false;
    EXPECT_REFUSAL(&v01, "message 0: the mistral-v0.1 chat template takes no system message",
                   SYS("s"), USER("u"));

    /* a detected template needs its tokens before it can render them */
    struct lora_chat_template raw;
    CHECK(detect_fixture("llama2", NULL, NULL, &raw) == 0);
    EXPECT_REFUSAL(&raw, "the llama2 chat template emits bos_token, but none is set", USER("q"));
    CHECK(detect_fixture("llama2", "<s>", NULL, &raw) == 0);
    EXPECT_REFUSAL(&raw, "the llama2 chat template emits eos_token, but none is set", USER("q"));
    CHECK(detect_fixture("llama3-instruct", NULL, NULL, &raw) == 0);
    EXPECT_REFUSAL(&raw, "the llama3 chat template emits bos_token", USER("q"));

    t.family = (enum lora_chat_family)42;
    EXPECT_REFUSAL(&t, "chat template family 42 is not known", USER("q"));

    /* a small or absent error buffer stays a string, or is left alone */
    char small[8];
    t = by_name("chatml");
    CHECK(lora_chat_template_render(&t, MSGS({"bot", "x"}), true, &out, &len, small,
                                    sizeof(small)) == -1);
    CHECK(strlen(small) == sizeof(small) - 1);
    CHECK(lora_chat_template_render(&t, MSGS({"bot", "x"}), true, &out, &len, NULL, 0) == -1);
    CHECK(lora_chat_template_by_name("nope", &t, NULL, 0) == -1);
    CHECK(lora_chat_template_detect("x", &t, small, sizeof(small)) == -1);
    CHECK(strlen(small) == sizeof(small) - 1);
}

/* ---- threads ------------------------------------------------------------------------------- */

struct job {
    const struct lora_chat_template *t;
    const char *want;
    int n_bad;
};

static void *render_many(void *arg)
{
    struct job *j = arg;

    for (int i = 0; i < 2000; i++) {
        char err[128], *out;
        size_t len;

        if (lora_chat_template_render(
                j->t, MSGS(SYS(" s "), USER("q"), ASST("<think>r</think>a"), USER("q2 ")), true,
                &out, &len, err, sizeof(err)) < 0) {
            j->n_bad++;
            continue;
        }
        j->n_bad += strcmp(out, j->want) != 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void)
{
    static const char *const names[] = {"qwen3", "llama3.1", "llama2", "mistral"};
    pthread_t th[8];
    struct job jobs[8];

    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        struct lora_chat_template t = by_name(names[k]);
        char err[128], *want;
        size_t len;

        CHECK(lora_chat_template_render(
                  &t, MSGS(SYS(" s "), USER("q"), ASST("<think>r</think>a"), USER("q2 ")), true,
                  &want, &len, err, sizeof(err)) == 0);
        for (int i = 0; i < 8; i++) {
            jobs[i] = (struct job){.t = &t, .want = want};
            CHECK(pthread_create(&th[i], NULL, render_many, &jobs[i]) == 0);
        }
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            CHECK(jobs[i].n_bad == 0);
        }
        free(want);
    }
}

int main(void)
{
    if (fx_init("/tmp/test_chat_template.XXXXXX", &check_cur_failed) < 0)
        return 1;

    RUN(test_canonical);
    RUN(test_detect_fixtures);
    RUN(test_detect_inline);
    RUN(test_detect_near_misses);
    RUN(test_by_name);
    RUN(test_config);
    RUN(test_render_chatml);
    RUN(test_render_llama3);
    RUN(test_render_inst);
    RUN(test_render_errors);
    RUN(test_threads);

    fx_cleanup();
    return check_done();
}
