/* tokenize: runs lib/text/tokenizer over JSON lines, for the comparison with Hugging Face's
 * tokenizers (tests/ref/tokenizer_compat.js) and for debugging.
 *
 *   tokenize TOKENIZER_JSON [--input FILE] [--stream-check SEED]
 *   tokenize TOKENIZER_JSON --text STRING
 *
 * Lines mode reads {"text": "..."} lines (stdin by default) and writes one line per input line:
 *   {"ids": encode(text), "ids_special": encode(text, add_special_tokens),
 *    "decoded": decode(ids), "decoded_skip": decode(ids, skip_special_tokens),
 *    "decoded_special": decode(ids_special)}
 * or {"error": "..."} when the tokenizer refuses the line. With --stream-check, the streaming
 * decoder also decodes ids_special, with and without skipping special tokens, one id at a time
 * and in random chunks drawn from SEED; each line gets "stream_ok": whether every way gave the
 * same text as decode and every piece was valid UTF-8 by itself.
 *
 * --text encodes one string and prints {"ids": [...], "tokens": [...], "decoded": "..."}.
 *
 * Exit status: 0 ok; 1 a line failed (an error, or a stream check); 100 usage; 111 the
 * tokenizer or the input could not be read.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/tokenizer.h"

#define PROG "tokenize"

static void usage(FILE *out)
{
    fputs("usage: " PROG " TOKENIZER_JSON [--input FILE] [--stream-check SEED]\n"
          "       " PROG " TOKENIZER_JSON --text STRING\n",
          out);
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();

    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* decode() as a JSON string, or NULL with err set. */
static json_t *decoded_json(const struct lora_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                            char *err, size_t err_len)
{
    char *text;
    size_t len;
    json_t *s;

    if (lora_tokenizer_decode(t, ids, n, skip, &text, &len, err, err_len) < 0)
        return NULL;
    s = json_stringn(text, len);
    free(text);
    return s;
}

/* xorshift64*: the chunk sizes of the stream check, reproducible from the seed. */
static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

/* Whether decoding ids through a stream cut into chunks (max_chunk 1: one id at a time)
 * gives want, with every piece valid UTF-8. */
static bool stream_matches(const struct lora_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                           const char *want, size_t want_len, uint64_t *rng, size_t max_chunk)
{
    struct lora_detok *d = lora_detok_new(t, skip);
    char *piece, err[256];
    size_t got = 0, len;
    bool ok = d != NULL;

    for (size_t i = 0; ok && i <= n;) {
        size_t chunk = max_chunk == 1 ? 1 : (size_t)(next_rand(rng) % (max_chunk + 1));
        int rc;

        if (i == n)
            rc = lora_detok_finish(d, &piece, &len, err, sizeof(err));
        else {
            chunk = chunk > n - i ? n - i : chunk;
            rc = lora_detok_push(d, ids + i, chunk, &piece, &len, err, sizeof(err));
        }
        if (rc < 0) {
            fprintf(stderr, PROG ": stream: %s\n", err);
            ok = false;
            break;
        }
        /* A piece must be valid UTF-8 alone: jansson checks it. */
        json_t *check = json_stringn(piece, len);

        ok = check && got + len <= want_len && memcmp(want + got, piece, len) == 0;
        json_decref(check);
        got += len;
        free(piece);
        if (i == n)
            break;
        i += chunk;
    }
    ok = ok && got == want_len;
    lora_detok_destroy(&d);
    return ok;
}

static bool stream_check(const struct lora_tokenizer *t, const int32_t *ids, size_t n,
                         uint64_t *rng)
{
    for (int skip = 0; skip < 2; skip++) {
        char *want, err[256];
        size_t want_len;
        bool ok = true;

        if (lora_tokenizer_decode(t, ids, n, skip, &want, &want_len, err, sizeof(err)) < 0)
            return false;
        ok = stream_matches(t, ids, n, skip, want, want_len, rng, 1);
        for (int r = 0; ok && r < 4; r++)
            ok = stream_matches(t, ids, n, skip, want, want_len, rng, r < 2 ? 3 : 8);
        free(want);
        if (!ok)
            return false;
    }
    return true;
}

/* The output line for one text, or NULL with err set. */
static json_t *line_json(const struct lora_tokenizer *t, const char *text, size_t len,
                         uint64_t *rng, bool *stream_ok, char *err, size_t err_len)
{
    int32_t *ids = NULL, *ids_sp = NULL;
    size_t n = 0, n_sp = 0;
    json_t *out = NULL, *dec = NULL, *dec_skip = NULL, *dec_sp = NULL;

    if (lora_tokenizer_encode(t, text, len, false, &ids, &n, err, err_len) < 0 ||
        lora_tokenizer_encode(t, text, len, true, &ids_sp, &n_sp, err, err_len) < 0)
        goto out;
    dec = decoded_json(t, ids, n, false, err, err_len);
    dec_skip = dec ? decoded_json(t, ids, n, true, err, err_len) : NULL;
    dec_sp = dec_skip ? decoded_json(t, ids_sp, n_sp, false, err, err_len) : NULL;
    if (!dec_sp)
        goto out;
    out = json_pack("{s:o, s:o, s:O, s:O, s:O}", "ids", ids_json(ids, n), "ids_special",
                    ids_json(ids_sp, n_sp), "decoded", dec, "decoded_skip", dec_skip,
                    "decoded_special", dec_sp);
    if (out && rng) {
        bool ok = stream_check(t, ids_sp, n_sp, rng);

        *stream_ok = *stream_ok && ok;
        json_object_set_new(out, "stream_ok", json_boolean(ok));
    }
out:
    json_decref(dec);
    json_decref(dec_skip);
    json_decref(dec_sp);
    free(ids);
    free(ids_sp);
    return out;
}

static int print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);

    if (!s)
        return -1;
    puts(s);
    free(s);
    return 0;
}

static int run_lines(const struct lora_tokenizer *t, FILE *in, const char *in_name, bool check,
                     uint64_t seed)
{
    char *line = NULL, err[512];
    size_t cap = 0, n_lines = 0, n_failed = 0;
    ssize_t len;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 1;
    bool stream_ok = true;

    while ((len = getline(&line, &cap, in)) > 0) {
        json_error_t jerr;
        json_t *doc = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, &jerr);
        json_t *text = json_object_get(doc, "text"), *out;

        n_lines++;
        if (!json_is_string(text)) {
            fprintf(stderr, PROG ": fatal: %s line %zu: expected {\"text\": \"...\"}\n", in_name,
                    n_lines);
            json_decref(doc);
            free(line);
            return 111;
        }
        out = line_json(t, json_string_value(text), json_string_length(text), check ? &rng : NULL,
                        &stream_ok, err, sizeof(err));
        if (!out) {
            n_failed++;
            out = json_pack("{s:s}", "error", err);
        }
        if (!out || print_json(out) < 0) {
            fprintf(stderr, PROG ": fatal: out of memory\n");
            json_decref(doc);
            free(line);
            return 111;
        }
        json_decref(out);
        json_decref(doc);
    }
    free(line);
    if (ferror(in)) {
        fprintf(stderr, PROG ": fatal: unable to read '%s': %s\n", in_name, strerror(errno));
        return 111;
    }
    if (check)
        fprintf(stderr, PROG ": stream check: %s on %zu lines\n", stream_ok ? "ok" : "FAILED",
                n_lines);
    return n_failed || !stream_ok ? 1 : 0;
}

static int run_text(const struct lora_tokenizer *t, const char *text)
{
    int32_t *ids;
    size_t n;
    char err[512];
    json_t *out, *tokens, *dec;

    if (lora_tokenizer_encode(t, text, strlen(text), false, &ids, &n, err, sizeof(err)) < 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    tokens = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(tokens, json_string(lora_tokenizer_token_str(t, ids[i])));
    dec = decoded_json(t, ids, n, false, err, sizeof(err));
    out = json_pack("{s:o, s:o, s:o*}", "ids", ids_json(ids, n), "tokens", tokens, "decoded", dec);
    free(ids);
    if (!out || print_json(out) < 0) {
        fprintf(stderr, PROG ": fatal: out of memory\n");
        return 111;
    }
    json_decref(out);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *input = NULL, *text = NULL;
    bool check = false;
    unsigned long long seed = 0;
    struct lora_tokenizer *t;
    char err[512];
    FILE *in = stdin;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if ((strcmp(a, "--input") == 0 || strcmp(a, "--text") == 0 ||
             strcmp(a, "--stream-check") == 0) &&
            i + 1 == argc) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            return 100;
        }
        if (strcmp(a, "--input") == 0) {
            input = argv[++i];
        } else if (strcmp(a, "--text") == 0) {
            text = argv[++i];
        } else if (strcmp(a, "--stream-check") == 0) {
            char *end;

            check = true;
            seed = strtoull(argv[++i], &end, 10);
            if (*end) {
                fprintf(stderr, PROG ": --stream-check '%s' must be a number\n", argv[i]);
                return 100;
            }
        } else if (a[0] == '-' || path) {
            fprintf(stderr, PROG ": unexpected argument '%s'\n", a);
            usage(stderr);
            return 100;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 100;
    }
    t = lora_tokenizer_load(path, err, sizeof(err));
    if (!t) {
        fprintf(stderr, PROG ": fatal: unable to load tokenizer: %s\n", err);
        return 111;
    }
    if (text) {
        rc = run_text(t, text);
    } else {
        if (input && !(in = fopen(input, "rb"))) {
            fprintf(stderr, PROG ": fatal: unable to open '%s': %s\n", input, strerror(errno));
            lora_tokenizer_destroy(&t);
            return 111;
        }
        rc = run_lines(t, in, input ? input : "stdin", check, seed);
        if (in != stdin)
            fclose(in);
    }
    lora_tokenizer_destroy(&t);
    return rc;
}
