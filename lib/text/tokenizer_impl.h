/* tokenizer_impl: what the files of the tokenizer module (lib/text/tokenizer*.c) share; not a
 * public API. The module's contract is in tokenizer.h.
 *
 * Layout, in the order data flows:
 *   tokenizer_util.c       id arrays, hashing, the vocabulary and merge tables, UTF-8
 *   tokenizer_json.c       reading tokenizer.json fields with errors that name the JSON path
 *   tokenizer_pattern.c    the String / Regex patterns of Split and Replace (PCRE2)
 *   tokenizer_normalize.c  normalizers
 *   tokenizer_pretok.c     pre-tokenizers
 *   tokenizer_bpe.c        the BPE model: vocabulary, merges, the merge loop
 *   tokenizer_decode.c     decoders as a streaming chain; decode and the streaming decoder
 *   tokenizer.c            load, added tokens, post-processors, encode, lookups
 *
 * Everything reachable from struct lora_tokenizer is built by lora_tokenizer_load and only read
 * afterwards. The scratch types (tk_ids, tk_pieces, tk_pre_scratch, tk_bpe_scratch) and the
 * byte strings (struct lora_buf, base/buf.h) belong to one call on one thread.
 */
#ifndef LORA_TOKENIZER_IMPL_H
#define LORA_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "base/buf.h"
#include "text/tokenizer.h"

#define TK_MAX_ID   ((1 << 24) - 1) /* ids above this are "out of range" */
#define TK_HOLE     UINT32_MAX      /* tk_vocab.off of an id with no token */
#define TK_CP_FAST  0x10000         /* code points with a direct char -> id table */
#define TK_MAX_PATH 256             /* bytes of a JSON path in an error message */
#define TK_MAX_TEXT (1 << 30)       /* bytes of text one encode call takes */

/* ---- tokenizer_util.c ---------------------------------------------------------------------- */

/* A growable array of ids. */
struct tk_ids {
    int32_t *v;
    size_t n, cap;
};

int tk_ids_add(struct tk_ids *a, int32_t id);
void tk_ids_free(struct tk_ids *a);

uint64_t tk_hash(const void *p, size_t n);

/* A slot of the vocabulary's hash table: the id (-1 empty) and the top half of its string's
 * hash, so that most mismatches are told apart without reading the string. */
struct tk_vslot {
    int32_t id;
    uint32_t tag;
};

/* The vocabulary: id -> string for every id (model and added tokens), and string -> id for the
 * model's tokens only (BPE looks up only those, as Hugging Face does). */
struct tk_vocab {
    char *pool; /* every token, NUL-terminated */
    size_t pool_len, pool_cap;
    uint32_t *off; /* (n_ids) offset into pool, TK_HOLE for an id with no token */
    uint32_t *len; /* (n_ids) bytes */
    size_t n_ids;
    struct tk_vslot *slot; /* (mask + 1) open addressing over model ids */
    size_t mask;
    size_t n_model;
};

/* Sizes the tables for ids below n_ids and n_model model tokens. Returns 0 or -1. */
int tk_vocab_init(struct tk_vocab *v, size_t n_ids, size_t n_model);
void tk_vocab_free(struct tk_vocab *v);
/* Gives id the string s; with in_model, also indexes it for tk_vocab_find. The caller checks
 * first that id has no string yet. Returns 0 or -1 (out of memory). */
int tk_vocab_set(struct tk_vocab *v, int32_t id, const char *s, size_t n, bool in_model);
/* The model id of s, or -1. */
int32_t tk_vocab_find(const struct tk_vocab *v, const char *s, size_t n);

static inline bool tk_vocab_has(const struct tk_vocab *v, int32_t id)
{
    return id >= 0 && (size_t)id < v->n_ids && v->off[id] != TK_HOLE;
}

/* Merge ranks: (left id, right id) -> (rank, merged id). */
struct tk_merge {
    uint64_t key; /* UINT64_MAX when the slot is empty */
    int32_t rank, new_id;
};

struct tk_merges {
    struct tk_merge *slot;
    size_t mask, n;
};

int tk_merges_init(struct tk_merges *m, size_t n);
void tk_merges_free(struct tk_merges *m);
/* Sets the pair's rank and result; a later entry for the same pair replaces an earlier one
 * (Hugging Face keeps the last too). */
void tk_merges_put(struct tk_merges *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
const struct tk_merge *tk_merges_find(const struct tk_merges *m, int32_t a, int32_t b);
/* Starts loading the slot of (a, b) into the cache, for a find soon after. */
void tk_merges_prefetch(const struct tk_merges *m, int32_t a, int32_t b);

/* UTF-8. tk_utf8_check returns the length of the longest valid prefix of s (n when all of it
 * is valid: no overlong forms, surrogates or code points above U+10FFFF). */
size_t tk_utf8_check(const char *s, size_t n);
/* Decodes the code point at s, which must be valid UTF-8; returns its length in bytes. */
int tk_utf8_get(const char *s, uint32_t *cp);
/* Writes cp as UTF-8 to out; returns its length. */
int tk_utf8_put(uint32_t cp, char out[4]);

/* Rust's String::from_utf8_lossy over a byte stream: each maximal invalid subpart becomes
 * U+FFFD. feed appends the text that is decided; a valid but incomplete sequence at the end
 * waits in pending for the next feed, or for flush, which writes it as U+FFFD. */
struct tk_lossy {
    unsigned char pending[4];
    int n_pending;
};

int tk_lossy_feed(struct tk_lossy *l, const void *p, size_t n, struct lora_buf *out);
int tk_lossy_flush(struct tk_lossy *l, struct lora_buf *out);

/* Rust's char::is_whitespace (the White_Space property). */
bool tk_is_whitespace(uint32_t cp);
/* Rust's char::is_numeric (general categories Nd, Nl, No). */
bool tk_is_numeric(uint32_t cp);
/* A \w character of Rust's regex crate (what single_word added tokens test next to them). */
bool tk_is_word_char(uint32_t cp);

/* ---- tokenizer_json.c ---------------------------------------------------------------------- */

/* Where the loader is in the document, for messages "FILE: JSON.PATH: reason". */
struct tk_ctx {
    const char *file;
    char path[TK_MAX_PATH];
    size_t path_len;
    char *err;
    size_t err_len;
};

/* Appends ".key" (or "key" at the top) / "[i]" to the path; returns the length to pop back to. */
size_t tk_path_key(struct tk_ctx *c, const char *key);
size_t tk_path_index(struct tk_ctx *c, size_t i);
void tk_path_pop(struct tk_ctx *c, size_t saved);

/* Writes "FILE: JSON.PATH: message" (or "FILE: message" at the top) into err; returns -1. */
int tk_fail(struct tk_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like tk_fail for the member key of the current object. */
int tk_fail_key(struct tk_ctx *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fails unless v is an object whose every key is in known (NULL-terminated). */
int tk_check_object(struct tk_ctx *c, const json_t *v, const char *const *known);
/* A {"type": "Sequence", key: [...]} object: each element of the array, with the path set to
 * it, goes to each(c, element, arg); the first failure stops. */
int tk_parse_sequence(struct tk_ctx *c, const json_t *v, const char *key,
                      int (*each)(struct tk_ctx *c, const json_t *item, void *arg), void *arg);
/* The "type" member of v, which must be an object, or NULL after failing. */
const char *tk_get_type(struct tk_ctx *c, const json_t *v);
/* A component that may be a Sequence of components (normalizers, pre-tokenizers, decoders)
 * read flattened: leaf(c, component, its type, arg) for every component that is not a Sequence,
 * in order, with the path set to it; key names a Sequence's list ("normalizers"). */
typedef int (*tk_leaf_fn)(struct tk_ctx *c, const json_t *v, const char *type, void *arg);
int tk_parse_flat(struct tk_ctx *c, const json_t *v, const char *key, tk_leaf_fn leaf, void *arg);
/* The array v of *n elements of size bytes with one more at its end, zeroed, counted in *n; NULL
 * after failing (out of memory), v as it was. */
void *tk_array_append(struct tk_ctx *c, void *v, size_t *n, size_t size);
/* Optional members: absent (or null where said) leaves *out at def. */
int tk_get_bool(struct tk_ctx *c, const json_t *obj, const char *key, bool def, bool *out);
int tk_get_int(struct tk_ctx *c, const json_t *obj, const char *key, long long lo, long long hi,
               long long def, long long *out);
/* A string member; absent or null gives *out = NULL unless required. */
int tk_get_str(struct tk_ctx *c, const json_t *obj, const char *key, bool required,
               const char **out, size_t *len);
/* A string member that is exactly one character; its code point. */
int tk_get_char(struct tk_ctx *c, const json_t *obj, const char *key, uint32_t def, uint32_t *cp);
/* Copies a JSON string into a new NUL-terminated buffer; NULL after failing. */
char *tk_strdup(struct tk_ctx *c, const char *s, size_t n);

/* ---- tokenizer_pattern.c ------------------------------------------------------------------- */

/* The {"String": s} or {"Regex": r} of Split and Replace. */
struct tk_pattern {
    char *lit; /* the literal (String), or NULL */
    size_t lit_len;
    pcre2_code *re; /* the compiled Regex, or NULL */
};

int tk_pattern_parse(struct tk_ctx *c, const json_t *v, struct tk_pattern *p);
/* Compiles a regex as Hugging Face's Oniguruma reads it (UTF, UCP, ^ and $ at lines). */
int tk_regex_compile(struct tk_ctx *c, const char *re, size_t len, pcre2_code **out);
void tk_pattern_free(struct tk_pattern *p);

/* The first match at or after from in s (valid UTF-8); an empty pattern never matches.
 * Returns 1 with [*ms, *me), 0 when there is none, -1 when PCRE2 fails (message in err). */
int tk_pattern_next(const struct tk_pattern *p, const char *s, size_t len, size_t from,
                    pcre2_match_data *md, size_t *ms, size_t *me, char *err, size_t err_len);

/* Match data big enough for every pattern (only the whole match is read). */
pcre2_match_data *tk_match_data_new(void);

/* ---- tokenizer_normalize.c ----------------------------------------------------------------- */

enum tk_norm_kind {
    TK_NORM_SEQUENCE,
    TK_NORM_NFC,
    TK_NORM_NFD,
    TK_NORM_NFKC,
    TK_NORM_NFKD,
    TK_NORM_REPLACE,
    TK_NORM_PREPEND,
    TK_NORM_STRIP,
    TK_NORM_LOWERCASE,
};

struct tk_norm {
    enum tk_norm_kind kind;
    struct tk_norm *sub; /* (n_sub) Sequence */
    size_t n_sub;
    struct tk_pattern pat; /* Replace */
    char *text;            /* Replace's content, Prepend's prefix */
    size_t text_len;
    bool left, right; /* Strip */
};

/* Parses v (null: no normalizer, *out = NULL). */
int tk_norm_parse(struct tk_ctx *c, const json_t *v, struct tk_norm **out);
void tk_norm_free(struct tk_norm *n);
/* Replaces out's contents with the normalized form of s (valid UTF-8); tmp is scratch. */
int tk_norm_apply(const struct tk_norm *n, const char *s, size_t len, struct lora_buf *out,
                  struct lora_buf *tmp, pcre2_match_data *md, char *err, size_t err_len);

/* ---- tokenizer_pretok.c -------------------------------------------------------------------- */

enum tk_pre_kind {
    TK_PRE_SEQUENCE,
    TK_PRE_SPLIT,
    TK_PRE_BYTE_LEVEL,
    TK_PRE_METASPACE,
    TK_PRE_DIGITS,
};

enum tk_split_behavior {
    TK_SPLIT_REMOVED,
    TK_SPLIT_ISOLATED,
    TK_SPLIT_MERGED_WITH_PREVIOUS,
    TK_SPLIT_MERGED_WITH_NEXT,
    TK_SPLIT_CONTIGUOUS,
};

enum tk_prepend_scheme {
    TK_PREPEND_ALWAYS,
    TK_PREPEND_FIRST,
    TK_PREPEND_NEVER,
};

struct tk_pre {
    enum tk_pre_kind kind;
    struct tk_pre *sub; /* (n_sub) Sequence */
    size_t n_sub;
    struct tk_pattern pat; /* Split; ByteLevel's GPT-2 regex when use_regex */
    enum tk_split_behavior behavior;
    bool invert;
    bool add_prefix_space;          /* ByteLevel */
    uint32_t replacement;           /* Metaspace */
    enum tk_prepend_scheme prepend; /* Metaspace */
    bool split;                     /* Metaspace */
    bool individual_digits;         /* Digits */
};

/* One pre-token: text[off, off + len) of its list. at_origin: it starts where the input text
 * starts (Metaspace's prepend_scheme "first" looks at that). */
struct tk_piece {
    size_t off, len;
    bool at_origin;
};

struct tk_pieces {
    struct lora_buf text;
    struct tk_piece *v;
    size_t n, cap;
};

int tk_pieces_add(struct tk_pieces *l, const char *s, size_t n, bool at_origin);
void tk_pieces_free(struct tk_pieces *l);

/* Per-call buffers of the pre-tokenizers. */
struct tk_pre_scratch {
    struct tk_pieces tmp; /* the other half of each step's in-place swap */
    struct tk_pieces sub; /* ByteLevel's regex pieces */
    struct lora_buf str;  /* one piece rewritten (Metaspace, ByteLevel's prefix space) */
};

void tk_pre_scratch_free(struct tk_pre_scratch *s);
int tk_pre_parse(struct tk_ctx *c, const json_t *v, struct tk_pre **out);
void tk_pre_free(struct tk_pre *p);
/* Pre-tokenizes the pieces of *io in place. */
int tk_pre_apply(const struct tk_pre *p, struct tk_pieces *io, struct tk_pre_scratch *s,
                 pcre2_match_data *md, char *err, size_t err_len);

/* GPT-2's bytes_to_unicode: the character that stands for byte b in byte-level vocabularies,
 * and its inverse (the byte of cp, or -1). */
uint32_t tk_byte_char(unsigned b);
int tk_char_byte(uint32_t cp);

/* ---- tokenizer_bpe.c ----------------------------------------------------------------------- */

struct tk_bpe {
    struct tk_merges merges;
    int32_t unk_id; /* -1: unknown characters are dropped, as Hugging Face does */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix; /* continuing_subword_prefix, NULL when none or empty */
    size_t prefix_len;
    char *suffix; /* end_of_word_suffix, likewise */
    size_t suffix_len;
    int32_t byte_id[256]; /* id of "<0xNN>" or -1 (byte_fallback) */
    int32_t *cp_id;       /* (TK_CP_FAST) id of the one-character token cp, or -1 */
};

struct tk_sym;
struct tk_cand;

/* Per-call buffers of the merge loop. */
struct tk_bpe_scratch {
    struct tk_sym *sym;
    size_t sym_cap;
    struct tk_cand *heap; /* candidate merges: a min-heap on (rank, position) */
    size_t heap_cap;
    struct lora_buf word; /* a character with its prefix / suffix */
};

void tk_bpe_scratch_free(struct tk_bpe_scratch *s);

/* Reads the "model" object: the vocabulary into t->vocab (sized for ids up to max_added_id
 * too, which the added tokens take next), then the merges. */
int tk_bpe_parse(struct tk_ctx *c, const json_t *model, int32_t max_added_id,
                 struct lora_tokenizer *t);
void tk_bpe_free(struct tk_bpe *b);
/* Appends the ids of one pre-token w (valid UTF-8, not empty) to out. */
int tk_bpe_encode(const struct lora_tokenizer *t, const char *w, size_t len, struct tk_ids *out,
                  struct tk_bpe_scratch *s);

/* ---- tokenizer_decode.c -------------------------------------------------------------------- */

enum tk_dec_kind {
    TK_DEC_BYTE_LEVEL,
    TK_DEC_METASPACE,
    TK_DEC_REPLACE,
    TK_DEC_BYTE_FALLBACK,
    TK_DEC_FUSE,
    TK_DEC_STRIP,
};

/* One decoder of the chain (Sequences are flattened: their effect is the same). */
struct tk_dec {
    enum tk_dec_kind kind;
    struct tk_pattern pat; /* Replace */
    char *content;         /* Replace */
    size_t content_len;
    uint32_t ch;        /* Strip's content, Metaspace's replacement */
    size_t start, stop; /* Strip */
    bool prepend;       /* Metaspace: prepend_scheme is not "never" */
};

/* Parses v into t->dec / t->n_dec (null: no decoder; tokens are then joined with spaces). */
int tk_dec_parse(struct tk_ctx *c, const json_t *v, struct lora_tokenizer *t);
void tk_dec_free(struct lora_tokenizer *t);

/* ---- tokenizer.c --------------------------------------------------------------------------- */

/* An added token; its content is the vocabulary string of id. */
struct tk_added {
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
};

/* A byte trie of added tokens' contents, for leftmost-longest matching. */
struct tk_trie_node {
    int32_t child, sibling; /* node indexes, -1 none */
    int32_t tok;            /* index into lora_tokenizer.added, -1 when no token ends here */
    unsigned char byte;
};

struct tk_trie {
    struct tk_trie_node *node;
    size_t n, cap;
    int32_t root[256]; /* the node of each first byte, -1 */
};

enum tk_post_kind {
    TK_POST_SEQUENCE,
    TK_POST_BYTE_LEVEL,
    TK_POST_TEMPLATE,
};

#define TK_TEMPLATE_SEQ (-1) /* in tk_post.single: where the encoded text goes */

struct tk_post {
    enum tk_post_kind kind;
    struct tk_post *sub; /* (n_sub) Sequence */
    size_t n_sub;
    int32_t *single; /* (n_single) TemplateProcessing: ids and TK_TEMPLATE_SEQ */
    size_t n_single;
};

struct lora_tokenizer {
    struct tk_vocab vocab;
    uint8_t *special; /* (vocab.n_ids) 1 for added tokens marked special */
    struct tk_added *added;
    size_t n_added;
    struct tk_trie trie_raw;  /* added tokens with normalized = false, on the raw text */
    struct tk_trie trie_norm; /* normalized = true, their normalized form on normalized text */
    struct tk_norm *norm;
    struct tk_pre *pre;
    struct tk_bpe bpe;
    struct tk_post *post;
    struct tk_dec *dec; /* (n_dec) */
    size_t n_dec;
    bool has_decoder;
};

#endif
