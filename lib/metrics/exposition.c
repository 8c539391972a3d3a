/* exposition: the Prometheus text format 0.0.4 writer; see exposition.h. */
#include "metrics/exposition.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- histograms ---------------------------------------------------------------------------- */

int lora_exposition_histogram_init(struct lora_exposition_histogram *h, const double *bounds, int n_bounds)
{
    memset(h, 0, sizeof(*h));
    if (n_bounds < 0) {
        errno = EINVAL;
        return -1;
    }
    /* Finite: a bound of +Inf would write a second le="+Inf" line, NaN a bucket never used. */
    for (int i = 0; i < n_bounds; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
            errno = EINVAL;
            return -1;
        }
    }
    h->buckets = calloc((size_t)n_bounds + 1, sizeof(*h->buckets));
    if (!h->buckets)
        return -1;
    h->n_bounds = n_bounds;
    h->bounds = bounds;
    return 0;
}

void lora_exposition_histogram_release(struct lora_exposition_histogram *h)
{
    free(h->buckets);
    memset(h, 0, sizeof(*h));
}

void lora_exposition_histogram_reset(struct lora_exposition_histogram *h)
{
    if (h->buckets)
        memset(h->buckets, 0, sizeof(*h->buckets) * ((size_t)h->n_bounds + 1));
    h->sum = 0;
    h->count = 0;
}

void lora_exposition_histogram_observe(struct lora_exposition_histogram *h, double value, uint64_t weight)
{
    if (!h->buckets || isnan(value) || weight == 0)
        return;
    /* Binary search for the first bound >= value; past the last one is +Inf. */
    int lo = 0, hi = h->n_bounds;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (value <= h->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    h->buckets[lo] += weight;
    h->sum += value * (double)weight;
    h->count += weight;
}

/* ---- buffers ------------------------------------------------------------------------------- */

static void fail(struct lora_exposition *w, const char *fmt, ...)
{
    va_list ap;

    if (w->failed)
        return;
    w->failed = true;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof(w->err), fmt, ap);
    va_end(ap);
}

static bool grow(struct lora_exposition *w, char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    char *p = realloc(*buf, n);
    if (!p) {
        fail(w, "out of memory (%zu bytes)", n);
        return false;
    }
    *buf = p;
    *cap = n;
    return true;
}

/* Appends to the scratch area (the open family) or to the output. */
static void put(struct lora_exposition *w, bool scratch, const char *s, size_t n)
{
    char **buf = scratch ? &w->scratch : &w->out;
    size_t *len = scratch ? &w->s_len : &w->len, *cap = scratch ? &w->s_cap : &w->cap;

    if (w->failed || !grow(w, buf, cap, *len + n + 1))
        return;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

static void puts_(struct lora_exposition *w, bool scratch, const char *s)
{
    put(w, scratch, s, strlen(s));
}

/* Appends n bytes of the scratch area from off (a series' label text, escaped once). */
static void put_scratch(struct lora_exposition *w, size_t off, size_t n)
{
    if (w->failed || !grow(w, &w->scratch, &w->s_cap, w->s_len + n + 1))
        return;
    memcpy(w->scratch + w->s_len, w->scratch + off, n);
    w->s_len += n;
    w->scratch[w->s_len] = 0;
}

/* The series' labels with le added: {a="x",le="..."}. */
static void put_key_le(struct lora_exposition *w, const struct lora_exposition_series *s, const char *le)
{
    if (s->key_len) {
        put_scratch(w, s->key_off, s->key_len - 1); /* without its closing brace */
        puts_(w, true, ",le=\"");
    } else {
        puts_(w, true, "{le=\"");
    }
    puts_(w, true, le);
    puts_(w, true, "\"}");
}

void lora_exposition_init(struct lora_exposition *w)
{
    memset(w, 0, sizeof(*w));
}

void lora_exposition_release(struct lora_exposition *w)
{
    free(w->out);
    free(w->scratch);
    free(w->series);
    lora_exposition_init(w);
}

void lora_exposition_reset(struct lora_exposition *w)
{
    w->len = 0;
    if (w->out)
        w->out[0] = 0;
    w->s_len = 0;
    w->n_series = 0;
    w->open = false;
    w->failed = false;
    w->err[0] = 0;
}

/* ---- names, values, escaping --------------------------------------------------------------- */

static bool is_name(const char *s, bool colon)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (colon && c == ':') || (p > s && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

/* The shortest significant digits of v (finite, > 0) that read back as v, as Python's repr()
 * finds them: into dig (at most 17 and a NUL, no trailing zero); returns the decimal exponent of
 * the first digit. */
static int shortest_digits(double v, char dig[18])
{
    char tmp[40];
    int n = 0, exp10 = 0;

    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
        n = 0;
        for (const char *p = tmp; *p != 'e'; p++)
            if (*p != '.')
                dig[n++] = *p;
        dig[n] = 0;
        exp10 = atoi(strchr(tmp, 'e') + 1);
        if (strtod(tmp, NULL) == v)
            break;
        /* At a power of two the gap below v is half the gap above: the nearest decimal of prec
         * digits may fall outside it while the next one up still reads back as v. */
        int i = n - 1;
        while (i >= 0 && dig[i] == '9')
            dig[i--] = '0';
        if (i >= 0) {
            dig[i]++;
        } else {
            dig[0] = '1';
            exp10++;
        }
        snprintf(tmp, sizeof(tmp), "%c.%se%d", dig[0], dig + 1, exp10);
        if (strtod(tmp, NULL) == v)
            break;
    }
    while (n > 1 && dig[n - 1] == '0')
        dig[--n] = 0;
    return exp10;
}

/* Python's repr() of a finite double, then prometheus_client's floatToGoString: a positive value
 * of 7 or more integer digits is written with an exponent as Go does, in floatToGoString's own
 * spelling (1e+06, 1.234567e+06, and 1e+015 for 10**15). */
int lora_exposition_format_double(char *buf, size_t size, double v)
{
    char dig[18], out[64];

    if (isnan(v))
        return snprintf(buf, size, "NaN");
    if (isinf(v))
        return snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
    if (v == 0)
        return snprintf(buf, size, signbit(v) ? "-0.0" : "0.0");
    if (fabs(v) < 1e6 && v == (double)(long)v) /* counts and integral gauges: most samples */
        return snprintf(buf, size, "%ld.0", (long)v);
    int exp10 = shortest_digits(fabs(v), dig);
    int n = (int)strlen(dig);
    const char *sign = v < 0 ? "-" : "", *dot = n > 1 ? "." : "";
    if (exp10 < -4 || exp10 >= 16) {
        snprintf(out, sizeof(out), "%s%c%s%se%c%02d", sign, dig[0], dot, dig + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (v > 0 && exp10 >= 6) {
        snprintf(out, sizeof(out), "%c%s%se+0%d", dig[0], dot, dig + 1, exp10);
    } else if (exp10 < 0) {
        snprintf(out, sizeof(out), "%s0.%.*s%s", sign, -exp10 - 1, "0000", dig);
    } else if (n > exp10 + 1) {
        snprintf(out, sizeof(out), "%s%.*s.%s", sign, exp10 + 1, dig, dig + exp10 + 1);
    } else {
        snprintf(out, sizeof(out), "%s%s%.*s.0", sign, dig, exp10 + 1 - n, "000000000000000");
    }
    return snprintf(buf, size, "%s", out);
}

static void put_double(struct lora_exposition *w, double v)
{
    char tmp[64];
    int n = lora_exposition_format_double(tmp, sizeof(tmp), v);
    put(w, true, tmp, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one. */
static int utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned cp, min;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A label value between double quotes: \ " and newline escaped, invalid UTF-8 replaced. */
static void put_label_value(struct lora_exposition *w, const char *v)
{
    const unsigned char *s = (const unsigned char *)v;
    size_t n = strlen(v), run = 0;

    for (size_t i = 0; i < n;) {
        int len = utf8_len(s + i, n - i);
        const char *esc = NULL;
        if (len == 1 && (s[i] == '\\' || s[i] == '"' || s[i] == '\n'))
            esc = s[i] == '\\' ? "\\\\" : s[i] == '"' ? "\\\"" : "\\n";
        else if (len == 0)
            esc = "\xef\xbf\xbd";
        if (!esc) {
            i += (size_t)len;
            run += (size_t)len;
            continue;
        }
        put(w, true, (const char *)s + i - run, run);
        puts_(w, true, esc);
        run = 0;
        i++;
    }
    put(w, true, (const char *)s + n - run, run);
}

/* {a="x",b="y"[,le="..."]} or nothing when there are no labels. */
static void put_labels(struct lora_exposition *w, const struct lora_exposition_label *labels, int n,
                       const char *le)
{
    if (n == 0 && !le)
        return;
    puts_(w, true, "{");
    for (int i = 0; i < n; i++) {
        if (i)
            puts_(w, true, ",");
        puts_(w, true, labels[i].name);
        puts_(w, true, "=\"");
        put_label_value(w, labels[i].value ? labels[i].value : "");
        puts_(w, true, "\"");
    }
    if (le) {
        puts_(w, true, n ? ",le=\"" : "le=\"");
        puts_(w, true, le);
        puts_(w, true, "\"");
    }
    puts_(w, true, "}");
}

static bool labels_ok(struct lora_exposition *w, const struct lora_exposition_label *labels, int n)
{
    if (n < 0 || n > LORA_EXPOSITION_MAX_LABELS) {
        fail(w, "%s: %d labels", w->family, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (!is_name(labels[i].name, false) || strcmp(labels[i].name, "le") == 0 ||
            strncmp(labels[i].name, "__", 2) == 0) {
            fail(w, "%s: bad label name '%s'", w->family, labels[i].name ? labels[i].name : "");
            return false;
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(labels[i].name, labels[j].name) == 0) {
                fail(w, "%s: label '%s' twice", w->family, labels[i].name);
                return false;
            }
        }
    }
    return true;
}

/* ---- families and series ------------------------------------------------------------------- */

void lora_exposition_family_begin(struct lora_exposition *w, const char *name, enum lora_exposition_type type,
                            const char *help)
{
    static const char *types[] = {"counter", "gauge", "histogram"};

    if (w->failed)
        return;
    if (w->open) {
        fail(w, "family '%s' begun inside '%s'", name, w->family);
        return;
    }
    if (!is_name(name, true) || strlen(name) >= sizeof(w->family) - 16 || type < 0 ||
        type > LORA_EXPOSITION_HISTOGRAM) {
        fail(w, "bad family name '%s'", name ? name : "");
        return;
    }
    snprintf(w->family, sizeof(w->family), "%s", name);
    w->type = type;
    w->open = true;
    w->s_len = 0;
    w->n_series = 0;
    puts_(w, false, "# HELP ");
    puts_(w, false, name);
    puts_(w, false, " ");
    for (const char *p = help ? help : ""; *p; p++) {
        if (*p == '\\')
            puts_(w, false, "\\\\");
        else if (*p == '\n')
            puts_(w, false, "\\n");
        else
            put(w, false, p, 1);
    }
    puts_(w, false, "\n# TYPE ");
    puts_(w, false, name);
    puts_(w, false, " ");
    puts_(w, false, types[type]);
    puts_(w, false, "\n");
}

/* Starts a series: records its key (the label text) and where its lines begin. */
static struct lora_exposition_series *series_begin(struct lora_exposition *w,
                                             const struct lora_exposition_label *labels, int n)
{
    if (w->n_series == w->series_cap) {
        int cap = w->series_cap ? 2 * w->series_cap : 64;
        struct lora_exposition_series *p = realloc(w->series, sizeof(*p) * (size_t)cap);
        if (!p) {
            fail(w, "out of memory");
            return NULL;
        }
        w->series = p;
        w->series_cap = cap;
    }
    struct lora_exposition_series *s = &w->series[w->n_series];
    s->key_off = w->s_len;
    put_labels(w, labels, n, NULL);
    s->key_len = w->s_len - s->key_off;
    s->text_off = w->s_len;
    return s;
}

static void series_end(struct lora_exposition *w, struct lora_exposition_series *s)
{
    if (w->failed)
        return;
    s->text_len = w->s_len - s->text_off;
    w->n_series++;
}

static bool sample_ok(struct lora_exposition *w, const struct lora_exposition_label *labels, int n,
                      bool histogram)
{
    if (w->failed)
        return false;
    if (!w->open) {
        fail(w, "a sample outside a family");
        return false;
    }
    if ((w->type == LORA_EXPOSITION_HISTOGRAM) != histogram) {
        fail(w, "%s: a %s sample in a %s family", w->family, histogram ? "histogram" : "plain",
             histogram ? "plain" : "histogram");
        return false;
    }
    return labels_ok(w, labels, n);
}

void lora_exposition_sample(struct lora_exposition *w, const struct lora_exposition_label *labels, int n_labels,
                      double value)
{
    if (!sample_ok(w, labels, n_labels, false))
        return;
    struct lora_exposition_series *s = series_begin(w, labels, n_labels);
    if (!s)
        return;
    puts_(w, true, w->family);
    put_scratch(w, s->key_off, s->key_len);
    puts_(w, true, " ");
    put_double(w, value);
    puts_(w, true, "\n");
    series_end(w, s);
}

void lora_exposition_histogram(struct lora_exposition *w, const struct lora_exposition_label *labels, int n_labels,
                         const struct lora_exposition_histogram *h)
{
    if (!sample_ok(w, labels, n_labels, true))
        return;
    if (!h->buckets) {
        fail(w, "%s: an empty histogram", w->family);
        return;
    }
    struct lora_exposition_series *s = series_begin(w, labels, n_labels);
    if (!s)
        return;
    uint64_t cum = 0;
    char le[64];
    for (int b = 0; b <= h->n_bounds; b++) {
        cum += h->buckets[b];
        if (b < h->n_bounds)
            lora_exposition_format_double(le, sizeof(le), h->bounds[b]);
        else
            snprintf(le, sizeof(le), "+Inf");
        puts_(w, true, w->family);
        puts_(w, true, "_bucket");
        put_key_le(w, s, le);
        puts_(w, true, " ");
        put_double(w, (double)cum);
        puts_(w, true, "\n");
    }
    const char *suffix[2] = {"_sum", "_count"};
    double val[2] = {h->sum, (double)h->count};
    for (int i = 0; i < 2; i++) {
        puts_(w, true, w->family);
        puts_(w, true, suffix[i]);
        put_scratch(w, s->key_off, s->key_len);
        puts_(w, true, " ");
        put_double(w, val[i]);
        puts_(w, true, "\n");
    }
    series_end(w, s);
}

/* Natural order: byte order, except that runs of digits compare by their numeric value. */
static int natural_cmp(const char *a, size_t an, const char *b, size_t bn)
{
    size_t i = 0, j = 0;

    /* Keys of one family share long prefixes: skip the equal bytes, back to the start of a
     * run of digits that the difference may fall in. */
    while (i < an && i < bn && a[i] == b[i])
        i++;
    while (i > 0 && a[i - 1] >= '0' && a[i - 1] <= '9')
        i--;
    j = i;

    while (i < an && j < bn) {
        bool da = a[i] >= '0' && a[i] <= '9', db = b[j] >= '0' && b[j] <= '9';
        if (da && db) {
            size_t si = i, sj = j;
            while (si < an && a[si] == '0')
                si++;
            while (sj < bn && b[sj] == '0')
                sj++;
            size_t ei = si, ej = sj;
            while (ei < an && a[ei] >= '0' && a[ei] <= '9')
                ei++;
            while (ej < bn && b[ej] >= '0' && b[ej] <= '9')
                ej++;
            if (ei - si != ej - sj)
                return ei - si < ej - sj ? -1 : 1;
            int c = memcmp(a + si, b + sj, ei - si);
            if (c)
                return c;
            /* Equal values: fewer leading zeros first, so the order stays total. */
            if (si - i != sj - j)
                return si - i < sj - j ? -1 : 1;
            i = ei;
            j = ej;
            continue;
        }
        if (a[i] != b[j])
            return (unsigned char)a[i] < (unsigned char)b[j] ? -1 : 1;
        i++;
        j++;
    }
    return (i < an) - (j < bn);
}

static int series_cmp(const void *x, const void *y, void *ctx)
{
    const struct lora_exposition_series *a = x, *b = y;
    const char *s = ctx;
    return natural_cmp(s + a->key_off, a->key_len, s + b->key_off, b->key_len);
}

void lora_exposition_family_end(struct lora_exposition *w)
{
    if (w->failed)
        return;
    if (!w->open) {
        fail(w, "a family ended that was not begun");
        return;
    }
    /* Callers mostly add series in order already: one pass proves it (and that no two match). */
    int sorted = 1;
    while (sorted < w->n_series && series_cmp(&w->series[sorted - 1], &w->series[sorted],
                                              w->scratch) < 0)
        sorted++;
    if (sorted < w->n_series)
        qsort_r(w->series, (size_t)w->n_series, sizeof(*w->series), series_cmp, w->scratch);
    for (int i = 0; i < w->n_series; i++) {
        const struct lora_exposition_series *s = &w->series[i];
        if (i && series_cmp(&w->series[i - 1], s, w->scratch) == 0) {
            fail(w, "%s: two series with the labels %.*s", w->family, (int)s->key_len,
                 w->scratch + s->key_off);
            return;
        }
        put(w, false, w->scratch + s->text_off, s->text_len);
    }
    w->open = false;
    w->n_series = 0;
    w->s_len = 0;
}

const char *lora_exposition_text(const struct lora_exposition *w, size_t *len, char *err, size_t err_len)
{
    const char *why = w->failed ? w->err : w->open ? "a family was left open" : NULL;
    if (why) {
        if (err)
            snprintf(err, err_len, "%s", why);
        return NULL;
    }
    if (len)
        *len = w->len;
    return w->out ? w->out : "";
}
