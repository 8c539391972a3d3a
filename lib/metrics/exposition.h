/* exposition: a writer of the Prometheus text exposition format, version 0.0.4.
 *
 * Owns one growable output buffer (struct lora_exposition) and, while a family is open, a scratch area
 * for its series. A family is written between lora_exposition_family_begin() and
 * lora_exposition_family_end(): its "# HELP" and "# TYPE" lines, then its series, sorted by their label
 * text whatever order the caller added them in (natural order: runs of digits compare as
 * numbers, so engine="2" comes before engine="10"). A histogram series is its _bucket lines in
 * bound order with cumulative counts and le="+Inf" last, then _sum and _count; it sorts as one
 * unit. A family with no series still gets its HELP and TYPE lines.
 *
 * Invariants a caller can rely on:
 * - What lora_exposition_text() returns parses as text format 0.0.4: metric and label names are checked
 *   against [a-zA-Z_:][a-zA-Z0-9_:]* and [a-zA-Z_][a-zA-Z0-9_]*; label values are escaped
 *   (backslash, double quote, newline) and made valid UTF-8 (each invalid byte becomes U+FFFD);
 *   HELP text is escaped (backslash, newline); no sample carries a timestamp.
 * - Numbers are written as Python's prometheus_client writes them (floatToGoString: repr()'s
 *   shortest text that reads back as the same double, "1.0" for an integral value, "1e-05",
 *   then a positive value of 7 or more integer digits as "1e+06" or "1.234567e+06"; "+Inf",
 *   "-Inf", "NaN"), so bucket bounds read le="0.5", le="1.0", le="+Inf" exactly as vLLM's do.
 * - Errors stick: the first failure (out of memory, or a programming error such as a bad name, a
 *   sample outside a family or a family left open) is kept, later calls do nothing, and
 *   lora_exposition_text() returns NULL with the message. Nothing here asserts or exits.
 * - The family name is the name of its samples: a counter is begun as "x_total" (as the 0.0.4
 *   format writes counters), a histogram as "x" and writes x_bucket, x_sum and x_count.
 *
 * struct lora_exposition_histogram holds one histogram series: bounds borrowed (increasing, +Inf
 * implicit), per-bucket counts owned; observing never allocates.
 */
#ifndef LORA_EXPOSITION_H
#define LORA_EXPOSITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LORA_EXPOSITION_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define LORA_EXPOSITION_MAX_LABELS   8

enum lora_exposition_type {
    LORA_EXPOSITION_COUNTER,
    LORA_EXPOSITION_GAUGE,
    LORA_EXPOSITION_HISTOGRAM,
};

struct lora_exposition_label {
    const char *name;  /* a label name, [a-zA-Z_][a-zA-Z0-9_]*, not "le" */
    const char *value; /* any bytes, NUL-terminated; escaped by the writer */
};

struct lora_exposition_histogram {
    int n_bounds;
    const double *bounds; /* borrowed: n_bounds increasing upper bounds, +Inf not included */
    uint64_t *buckets;    /* owned: n_bounds + 1 counts, one per bucket, the last for +Inf */
    double sum;
    uint64_t count;
};

/* Zeroed histogram on bounds (borrowed; must outlive h; finite and increasing). 0, or -1 with
 * errno ENOMEM or EINVAL. */
int lora_exposition_histogram_init(struct lora_exposition_histogram *h, const double *bounds, int n_bounds);
/* Frees the counts; h is zeroed. Safe on a zeroed struct. */
void lora_exposition_histogram_release(struct lora_exposition_histogram *h);
/* Sets every count and the sum to 0, keeping the bounds. */
void lora_exposition_histogram_reset(struct lora_exposition_histogram *h);
/* Counts value weight times (the sum grows by value * weight). A value equal to a bound falls in
 * that bound's bucket (le means less than or equal). NaN is ignored. */
void lora_exposition_histogram_observe(struct lora_exposition_histogram *h, double value, uint64_t weight);

/* Fields are private; the struct is public so that it can live on the stack or in a struct. */
struct lora_exposition_series {
    size_t key_off, key_len;   /* label text in the scratch area, the sort key */
    size_t text_off, text_len; /* the series' lines in the scratch area */
};

struct lora_exposition {
    char *out;
    size_t len, cap;
    char *scratch; /* the open family's series */
    size_t s_len, s_cap;
    struct lora_exposition_series *series;
    int n_series, series_cap;
    char family[256];
    enum lora_exposition_type type;
    bool open;
    bool failed;
    char err[256];
};

void lora_exposition_init(struct lora_exposition *w);
/* Frees every buffer; w is left as after lora_exposition_init. */
void lora_exposition_release(struct lora_exposition *w);
/* Empties the output and clears an error, keeping the memory for the next scrape. */
void lora_exposition_reset(struct lora_exposition *w);

/* Opens family name of type with help (one line; escaped). */
void lora_exposition_family_begin(struct lora_exposition *w, const char *name, enum lora_exposition_type type,
                            const char *help);
/* One sample of the open counter or gauge family. */
void lora_exposition_sample(struct lora_exposition *w, const struct lora_exposition_label *labels, int n_labels,
                      double value);
/* One series of the open histogram family. */
void lora_exposition_histogram(struct lora_exposition *w, const struct lora_exposition_label *labels, int n_labels,
                         const struct lora_exposition_histogram *h);
/* Sorts the open family's series and appends them to the output. */
void lora_exposition_family_end(struct lora_exposition *w);

/* The text written so far (borrowed, NUL-terminated, valid until the next call on w), or NULL
 * after an error, with the message in err. */
const char *lora_exposition_text(const struct lora_exposition *w, size_t *len, char *err, size_t err_len);

/* Writes v as prometheus_client does into buf (at least 32 bytes); returns the length. */
int lora_exposition_format_double(char *buf, size_t size, double v);

#endif
