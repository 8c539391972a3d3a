/* chat_template: turns OpenAI chat messages into a prompt string the way a model's Jinja
 * chat_template would, without a Jinja engine.
 *
 * A template is recognised as one of three families and rendered natively:
 * - ChatML (generic, Qwen2, Qwen2.5, Qwen3): "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per
 *   message, "<|im_start|>assistant\n" as the generation prompt, an optional default system
 *   message, and Qwen3's <think> handling of assistant turns after the last user turn.
 * - Llama 3 (3.0, and 3.1+ with the "Cutting Knowledge Date" / "Today Date" system block):
 *   "<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>".
 * - [INST] (Llama 2 with <<SYS>>, Mistral v1/v3 styles): user turns in [INST] ... [/INST], the
 *   system prompt folded into the first or last user turn, strict user/assistant alternation.
 *
 * Detection (lora_chat_template_detect) canonicalises the Jinja source (whitespace control,
 * quoting, subscripts and string concatenation normalised), looks for each family's essential
 * expressions, and checks that no other output writes the family's markers or a message's
 * content. Every parameter a render depends on (default system prompt, spaces around [INST],
 * trimming, where bos_token goes, the template's own alternation message) is read from the
 * template text. A template that does not pass is an error naming what was found: rendering
 * something else silently would be worse. Text a template adds outside those markers in a
 * branch plain conversations reach is not seen: that is the limit of recognising by form.
 *
 * Rendering follows Python Jinja2 as transformers runs it (trim_blocks, lstrip_blocks):
 * str.strip() and |trim remove Python's Unicode whitespace, strip('\n') only newlines, ''
 * differs from false. Conversations the template rejects with raise_exception are rejected
 * here too; some it renders silently (an unknown role dropped, a misplaced system message
 * ignored) are rejected as well, each error naming the message index.
 *
 * Invariants a caller can rely on:
 * - struct lora_chat_template is plain data: no heap memory, copyable, nothing to release.
 *   Its const char * members point to static strings. After detection it is read-only, and
 *   lora_chat_template_render may be called on one template from any number of threads at once.
 * - Every function returns 0 or -1; on -1 err holds a message (see errbuf.h) and *out is
 *   NULL. Nothing here logs or exits.
 * - The returned prompt is the caller's (free()); it is NUL-terminated, *out_len bytes long.
 */
#ifndef LORA_CHAT_TEMPLATE_H
#define LORA_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

/* The families; the value is stable (grows only at the end). */
enum lora_chat_family {
    LORA_CHAT_CHATML,
    LORA_CHAT_LLAMA3,
    LORA_CHAT_LLAMA2,  /* [INST] with a <<SYS>> block */
    LORA_CHAT_MISTRAL, /* [INST] with the system prompt prepended to a user turn */
};

/* Where an [INST] template puts the system message. */
enum lora_chat_system_slot {
    LORA_CHAT_SYSTEM_NONE,       /* a system message breaks the alternation (Mistral v0.1) */
    LORA_CHAT_SYSTEM_SYS_BLOCK,  /* "<<SYS>>\nSYSTEM\n<</SYS>>\n\n" opens the first user turn */
    LORA_CHAT_SYSTEM_FIRST_USER, /* "SYSTEM\n\n" opens the first user turn (Mistral v1) */
    LORA_CHAT_SYSTEM_LAST_USER,  /* "SYSTEM\n\n" opens the last message if it is a user turn
                                  * (Mistral v3), else the system message is dropped */
};

#define LORA_CHAT_NAME_BYTES    32
#define LORA_CHAT_TOKEN_BYTES   64
#define LORA_CHAT_LINE_BYTES    256
#define LORA_CHAT_DEFAULT_BYTES 4096

struct lora_chat_template {
    enum lora_chat_family family;
    char name[LORA_CHAT_NAME_BYTES]; /* the variant, for logs: "qwen3", "mistral-v3", ... */
    /* Token texts the template emits; set from tokenizer_config.json or by name. */
    char bos_token[LORA_CHAT_TOKEN_BYTES];
    char eos_token[LORA_CHAT_TOKEN_BYTES];
    bool emits_bos; /* the prompt contains bos_token as text: do not add a BOS id again */
    bool emits_eos;
    struct {
        bool has_default_system; /* used when messages[0] is not a system message */
        char default_system[LORA_CHAT_DEFAULT_BYTES];
        bool qwen3_think; /* <think> blocks on assistant turns after the last user turn */
    } chatml;
    struct {
        bool trim_content;      /* content | trim */
        bool gen_prompt_always; /* assistant header even without add_generation_prompt */
        bool system_block;      /* 3.1+: a system turn with the dates always comes first */
        char date_prefix[LORA_CHAT_LINE_BYTES];   /* "Cutting Knowledge Date: ...\nToday Date: " */
        char date_default[LORA_CHAT_TOKEN_BYTES]; /* date_string when strftime_now is absent */
        char date_format[LORA_CHAT_TOKEN_BYTES];  /* strftime_now's format, "" for none */
    } llama3;
    struct {
        enum lora_chat_system_slot system_slot;
        bool bos_per_user;     /* bos_token before every [INST] (Llama 2), else once first */
        const char *open;      /* "[INST] ", " [INST] " or "[INST]" */
        const char *close;     /* " [/INST]" or "[/INST]" */
        bool user_strip;       /* the user turn (with its <<SYS>> block) is .strip()ed */
        const char *asst_lead; /* text before the assistant content: "" or " " */
        bool asst_strip;       /* assistant content is stripped (.strip() or | trim) */
        const char *asst_mid;  /* text between content and eos_token: "" or " " */
        const char *asst_tail; /* text after eos_token: "" or " " */
        bool alternate;        /* the template enforces user/assistant alternation */
        char alternate_error[LORA_CHAT_LINE_BYTES]; /* its raise_exception text */
        char role_error[LORA_CHAT_LINE_BYTES];      /* its unknown-role text, "" for none */
    } inst;
};

struct lora_chat_message {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8 */
};

/* Recognises the family and parameters of a Jinja chat template. Token texts are left empty:
 * set them with lora_chat_template_set_tokens when the template emits them. Returns 0, or -1
 * with "unable to render chat template: WHAT WAS FOUND; pass --chat-template ..." in err. */
int lora_chat_template_detect(const char *jinja_source, struct lora_chat_template *out, char *err,
                              size_t err_len);

/* A built-in template for --chat-template NAME: chatml, qwen2.5, qwen3, llama3, llama3.1,
 * llama2, mistral (= mistral-v3), mistral-v1. Token texts are the family's usual ones. */
int lora_chat_template_by_name(const char *name, struct lora_chat_template *out, char *err,
                               size_t err_len);

/* Reads chat_template (a string, or a list of {name, template} of which "default" is used;
 * without one, chat_template.jinja beside the file), bos_token and eos_token (strings or
 * {"content": ...} objects) from a tokenizer_config.json and detects the template. Errors
 * are "PATH: reason". */
int lora_chat_template_from_config(const char *tokenizer_config_json_path,
                                   struct lora_chat_template *out, char *err, size_t err_len);

/* Sets the token texts (NULL leaves one unset). Fails when one does not fit. */
int lora_chat_template_set_tokens(struct lora_chat_template *t, const char *bos, const char *eos,
                                  char *err, size_t err_len);

/* Renders msgs[0..n) into *out (malloc'd, the caller's). Validates the list first: empty,
 * unknown or unsupported roles (tool, developer), invalid UTF-8, the family's alternation
 * rules; each error names the message index. [INST] templates end a user turn with [/INST]
 * and ignore add_generation_prompt, as theirs do. Thread-safe; t is only read. */
int lora_chat_template_render(const struct lora_chat_template *t,
                              const struct lora_chat_message *msgs, size_t n,
                              bool add_generation_prompt, char **out, size_t *out_len, char *err,
                              size_t err_len);

/* "chatml", "llama3", "llama2", "mistral"; NULL for a value outside the enum. */
const char *lora_chat_template_family_name(enum lora_chat_family family);

/* The canonical form detection matches against, for diagnosing a template that is not
 * recognised: *out is malloc'd, the caller's. */
int lora_chat_template_canonical(const char *jinja_source, char **out, size_t *out_len, char *err,
                                 size_t err_len);

#endif
