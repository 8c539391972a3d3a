/* tokenizer: the Hugging Face tokenizer (tokenizer.json) of a Llama-family model: text to token
 * ids and back, with the same results as Hugging Face's `tokenizers` library.
 *
 * What it reads. A tokenizer.json whose model is BPE (merges as "a b" strings or [a, b] pairs;
 * ignore_merges, byte_fallback, unk_token, fuse_unk, continuing_subword_prefix,
 * end_of_word_suffix), with any combination of
 *   normalizers:     Sequence, NFC, NFD, NFKC, NFKD, Replace, Prepend, Strip, Lowercase;
 *   pre-tokenizers:  Sequence, Split (PCRE2, UTF + UCP), ByteLevel, Metaspace, Digits;
 *   post-processors: Sequence, TemplateProcessing (its "single" template), ByteLevel;
 *   decoders:        Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip;
 * and added_tokens with their special / normalized / lstrip / rstrip / single_word flags.
 * This covers Llama 2 (SentencePiece-style BPE), Llama 3 and Qwen (byte-level BPE). Anything
 * else (another model type, an unknown component, an option with a value that changes results
 * and is not implemented, truncation or padding) is rejected at load with
 * "PATH: JSON.PATH: reason", e.g. "tokenizer.json: pre_tokenizer.pretokenizers[1].type:
 * unsupported 'Punctuation'": a file either loads and tokenizes as Hugging Face does, or does
 * not load.
 *
 * Encoding follows Hugging Face's order: added tokens are cut out of the raw text first (they
 * are always recognised, special or not, leftmost-longest), the rest is normalized, then
 * pre-tokenized, then each piece is merged by BPE; add_special_tokens runs the post-processor
 * (Llama 2's BOS). Decoding feeds the tokens through the decoder chain; skip_special_tokens
 * drops the added tokens marked special first.
 *
 * Deliberate differences from Hugging Face: text that is not valid UTF-8 and ids that are not
 * in the vocabulary are errors (Hugging Face cannot take the first and silently drops the
 * second).
 *
 * Ownership and invariants:
 * - A tokenizer is immutable after lora_tokenizer_load returns; it owns every string it hands
 *   out (lora_tokenizer_token_str), valid until lora_tokenizer_destroy.
 * - Ids are in [0, lora_tokenizer_vocab_size()); the vocabulary may have holes (ids with no
 *   token), which every function treats as unknown ids.
 * - Returned ids arrays and strings (encode, decode, the streaming decoder's pieces) are the
 *   caller's, to free(). Strings are NUL-terminated and also carry their length.
 * - Thread-safety: every function that takes a const tokenizer may be called from any number of
 *   threads at once with no lock: each call keeps its scratch (including PCRE2 match data) to
 *   itself. A struct lora_detok belongs to one thread at a time.
 * - Errors: functions return 0 / -1 (or NULL) with a message in (err, err_len) when err is not
 *   NULL; out of memory is reported the same way. Nothing logs or exits.
 */
#ifndef LORA_TOKENIZER_H
#define LORA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lora_tokenizer;

/* Reads and validates tokenizer_json_path. Returns the tokenizer, or NULL with
 * "PATH: reason" in err (errno ENOENT when the file does not exist, EINVAL when it is
 * malformed or unsupported, ENOMEM). */
struct lora_tokenizer *lora_tokenizer_load(const char *tokenizer_json_path, char *err,
                                           size_t err_len);

/* Frees *t and sets *t to NULL; NULL and *t == NULL are no-ops. */
void lora_tokenizer_destroy(struct lora_tokenizer **t);

/* Encodes text (len bytes, at most 1 GiB, UTF-8, may contain NUL) into a new array *ids of
 * *n_ids ids (the caller frees it; never NULL on success, even for no ids). add_special_tokens
 * applies the post-processor. Returns 0, or -1 with err set ("text is not valid UTF-8 at byte
 * N", too long, out of memory) and *ids = NULL, *n_ids = 0. */
int lora_tokenizer_encode(const struct lora_tokenizer *t, const char *text, size_t len,
                          bool add_special_tokens, int32_t **ids, size_t *n_ids, char *err,
                          size_t err_len);

/* Decodes n ids into a new string *out of *out_len bytes (the caller frees it), always valid
 * UTF-8 (invalid byte sequences become U+FFFD as Hugging Face does). Returns 0, or -1 with err
 * set ("id N is not in the vocabulary") and *out = NULL. */
int lora_tokenizer_decode(const struct lora_tokenizer *t, const int32_t *ids, size_t n,
                          bool skip_special_tokens, char **out, size_t *out_len, char *err,
                          size_t err_len);

/* The id of the vocabulary string token (an added token first, then the model's), or -1. */
int32_t lora_tokenizer_token_id(const struct lora_tokenizer *t, const char *token);

/* The vocabulary string of id (borrowed), or NULL when id is out of range or a hole. */
const char *lora_tokenizer_token_str(const struct lora_tokenizer *t, int32_t id);

/* Whether id is an added token marked special (what skip_special_tokens drops). */
bool lora_tokenizer_is_special(const struct lora_tokenizer *t, int32_t id);

/* One past the largest id: the number of rows an embedding table needs. */
size_t lora_tokenizer_vocab_size(const struct lora_tokenizer *t);

/* ---- streaming decoder ---------------------------------------------------------------------
 *
 * For a server that receives ids a few at a time. Invariants:
 * - The concatenation of every piece that push and finish return equals lora_tokenizer_decode
 *   of all the ids pushed, however the ids were cut into pushes.
 * - A piece is only text that no later id can change: never a partial UTF-8 sequence, never a
 *   byte-fallback run that a later <0xNN> could complete, never a leading space that a Strip
 *   decoder may still remove. Each piece is valid UTF-8 on its own (and may be empty).
 * - finish returns what is held back (incomplete bytes become U+FFFD, as decode does) and
 *   resets the decoder for a new sequence.
 */
struct lora_detok;

/* A decoder for t (borrowed: it must outlive the decoder), or NULL when out of memory. */
struct lora_detok *lora_detok_new(const struct lora_tokenizer *t, bool skip_special_tokens);

/* Frees *d and sets *d to NULL; NULL and *d == NULL are no-ops. */
void lora_detok_destroy(struct lora_detok **d);

/* Pushes n ids; *piece (the caller frees it) receives the text that became final, *len its
 * length. Returns 0, or -1 with err set and *piece = NULL: when an id is not in the
 * vocabulary, no id of this push is consumed and d goes on as before; after running out of
 * memory, d can only be destroyed. */
int lora_detok_push(struct lora_detok *d, const int32_t *ids, size_t n, char **piece, size_t *len,
                    char *err, size_t err_len);

/* Returns the text still held back and resets d. Same conventions as lora_detok_push. */
int lora_detok_finish(struct lora_detok *d, char **piece, size_t *len, char *err, size_t err_len);

#endif
