/* chat_template_impl: what the files of the chat template module (lib/text/chat_*.c) share; not
 * a public API. The module's contract is in chat_template.h.
 *
 * Layout, in the order data flows:
 *   chat_canon.c     the canonical form of a Jinja template (lexing, whitespace control,
 *                    quoting, subscripts and string concatenation normalised)
 *   chat_detect.c    which known family a canonical template is, and its parameters
 *   chat_render.c    each family's renderer: messages to a prompt, with Python's string rules
 *   chat_template.c  the public entry points: detection, built-in templates by name,
 *                    tokenizer_config.json, rendering, the canonical form for diagnostics
 *
 * Names: the public functions (chat_template.h) are lora_chat_template_* and live in
 * chat_template.c; every other non-static function carries its file's name (chat_canon_,
 * chat_detect_, chat_render_).
 */
#ifndef LORA_CHAT_TEMPLATE_IMPL_H
#define LORA_CHAT_TEMPLATE_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "text/chat_template.h"

/* What an error about a template that is not recognised tells the operator to do. */
#define CHAT_HINT "pass --chat-template chatml|llama3|llama2|mistral"

/* The default system messages of the Qwen ChatML variants, by which detection names them and
 * the built-in qwen2.5 template writes its own. */
#define CHAT_QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define CHAT_QWEN2_SYSTEM  "You are a helpful assistant."

/* ---- chat_canon.c ------------------------------------------------------------------------- */

/* Appends the canonical form of src to out; partial: src is a snippet that may end inside a
 * tag. Returns 0, or -1 with *what and *at set (what is NULL when out of memory, out->failed
 * included). */
int chat_canon_append(const char *src, bool partial, struct lora_buf *out, const char **what,
                      size_t *at);

/* ---- chat_detect.c ------------------------------------------------------------------------ */

/* Recognises the family and parameters of jinja_source into t (initialised by the caller:
 * zeroed, the [INST] texts ""). Returns 0, or -1 with "unable to render chat template: ...;
 * CHAT_HINT" in err; t is then partly written. */
int chat_detect_template(const char *jinja_source, struct lora_chat_template *t, char *err,
                         size_t err_len);

/* ---- chat_render.c ------------------------------------------------------------------------ */

/* lora_chat_template_render: see chat_template.h. */
int chat_render_messages(const struct lora_chat_template *t, const struct lora_chat_message *msgs,
                         size_t n, bool add_generation_prompt, char **out, size_t *out_len,
                         char *err, size_t err_len);

#endif
