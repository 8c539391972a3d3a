/* Unit tests for lib/metrics/exposition: the exact text of every family type (HELP and TYPE lines, empty
 * families, cumulative buckets, le="+Inf" last, _sum and _count), natural series order, label
 * value and HELP escaping, invalid UTF-8, number formatting against Python's prometheus_client
 * (floatToGoString over repr(); the table was produced with CPython 3 from that function's
 * source), the sticky errors, and a fuzz test whose output must parse as text format 0.0.4 with
 * a small validating parser written here.
 */
#include "check.h"
#include "metrics/exposition.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static uint64_t rng_state = 0x2545f4914f6cdd1du;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double bits_to_double(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

/* The text, or NULL with the error printed as a diagnostic. */
static const char *text_of(const struct lora_exposition *w)
{
    char err[256] = "";
    const char *t = lora_exposition_text(w, NULL, err, sizeof(err));
    if (!t)
        printf("# writer error: %s\n", err);
    return t;
}

#define CHECK_TEXT(w, want)                                                                        \
    do {                                                                                           \
        const char *got_ = text_of(w);                                                             \
        if (!got_ || strcmp(got_, (want)) != 0) {                                                  \
            printf("# %s:%d: got:\n%s# want:\n%s", __FILE__, __LINE__, got_ ? got_ : "(null)\n",   \
                   (want));                                                                        \
            check_cur_failed = 1;                                                                  \
        }                                                                                          \
    } while (0)

/* ---- exact output ---------------------------------------------------------------------------- */

static void test_empty_families(void)
{
    struct lora_exposition w;
    size_t len = 99;

    lora_exposition_init(&w);
    CHECK(lora_exposition_text(&w, &len, NULL, 0) != NULL);
    CHECK(len == 0);
    lora_exposition_family_begin(&w, "a_total", LORA_EXPOSITION_COUNTER, "Things counted.");
    lora_exposition_family_end(&w);
    lora_exposition_family_begin(&w, "ns:g", LORA_EXPOSITION_GAUGE, "");
    lora_exposition_family_end(&w);
    lora_exposition_family_begin(&w, "h", LORA_EXPOSITION_HISTOGRAM, NULL);
    lora_exposition_family_end(&w);
    const char *want = "# HELP a_total Things counted.\n"
                       "# TYPE a_total counter\n"
                       "# HELP ns:g \n"
                       "# TYPE ns:g gauge\n"
                       "# HELP h \n"
                       "# TYPE h histogram\n";
    CHECK_TEXT(&w, want);
    CHECK(lora_exposition_text(&w, &len, NULL, 0) != NULL && len == strlen(want));
    lora_exposition_release(&w);
}

static void test_counter_gauge_exact(void)
{
    struct lora_exposition w;
    const struct lora_exposition_label two[] = {{"model_name", "m"}, {"engine", "0"}};
    const struct lora_exposition_label one[] = {{"finished_reason", "stop"}};

    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "vllm:request_success_total", LORA_EXPOSITION_COUNTER, "Finished.");
    lora_exposition_sample(&w, one, 1, 3);
    lora_exposition_family_end(&w);
    lora_exposition_family_begin(&w, "vllm:kv_cache_usage_perc", LORA_EXPOSITION_GAUGE, "Usage.");
    lora_exposition_sample(&w, two, 2, 0.25);
    lora_exposition_family_end(&w);
    lora_exposition_family_begin(&w, "up", LORA_EXPOSITION_GAUGE, "No labels.");
    lora_exposition_sample(&w, NULL, 0, -1);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP vllm:request_success_total Finished.\n"
                   "# TYPE vllm:request_success_total counter\n"
                   "vllm:request_success_total{finished_reason=\"stop\"} 3.0\n"
                   "# HELP vllm:kv_cache_usage_perc Usage.\n"
                   "# TYPE vllm:kv_cache_usage_perc gauge\n"
                   "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n"
                   "# HELP up No labels.\n"
                   "# TYPE up gauge\n"
                   "up -1.0\n");
    lora_exposition_release(&w);
}

static void test_histogram_exact(void)
{
    static const double bounds[] = {0.5, 1, 2.5};
    struct lora_exposition_histogram h, e;
    struct lora_exposition w;
    const struct lora_exposition_label lab[] = {{"a", "x"}};

    CHECK(lora_exposition_histogram_init(&h, bounds, COUNT(bounds)) == 0);
    CHECK(h.n_bounds == 3 && h.count == 0 && h.sum == 0);
    lora_exposition_histogram_observe(&h, 0.25, 1); /* bucket 0.5 */
    lora_exposition_histogram_observe(&h, 0.5, 1);  /* equal to a bound: that bound's bucket */
    lora_exposition_histogram_observe(&h, 1.0, 1);  /* bucket 1.0 */
    lora_exposition_histogram_observe(&h, 2.0, 2);  /* bucket 2.5, weight 2 */
    lora_exposition_histogram_observe(&h, 3.0, 1);  /* +Inf */
    lora_exposition_histogram_observe(&h, NAN, 5);  /* ignored */
    lora_exposition_histogram_observe(&h, 7.0, 0);  /* weight 0: nothing */
    CHECK(h.buckets[0] == 2 && h.buckets[1] == 1 && h.buckets[2] == 2 && h.buckets[3] == 1);
    CHECK(h.count == 6);
    CHECK(h.sum == 8.75);
    CHECK(lora_exposition_histogram_init(&e, bounds, COUNT(bounds)) == 0);

    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "lat_seconds", LORA_EXPOSITION_HISTOGRAM, "Latency.");
    lora_exposition_histogram(&w, lab, 1, &h);
    lora_exposition_family_end(&w);
    lora_exposition_family_begin(&w, "bare", LORA_EXPOSITION_HISTOGRAM, "No labels, nothing seen.");
    lora_exposition_histogram(&w, NULL, 0, &e);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP lat_seconds Latency.\n"
                   "# TYPE lat_seconds histogram\n"
                   "lat_seconds_bucket{a=\"x\",le=\"0.5\"} 2.0\n"
                   "lat_seconds_bucket{a=\"x\",le=\"1.0\"} 3.0\n"
                   "lat_seconds_bucket{a=\"x\",le=\"2.5\"} 5.0\n"
                   "lat_seconds_bucket{a=\"x\",le=\"+Inf\"} 6.0\n"
                   "lat_seconds_sum{a=\"x\"} 8.75\n"
                   "lat_seconds_count{a=\"x\"} 6.0\n"
                   "# HELP bare No labels, nothing seen.\n"
                   "# TYPE bare histogram\n"
                   "bare_bucket{le=\"0.5\"} 0.0\n"
                   "bare_bucket{le=\"1.0\"} 0.0\n"
                   "bare_bucket{le=\"2.5\"} 0.0\n"
                   "bare_bucket{le=\"+Inf\"} 0.0\n"
                   "bare_sum 0.0\n"
                   "bare_count 0.0\n");

    /* Reset keeps the bounds; infinities go to the first and the last bucket. */
    lora_exposition_histogram_reset(&h);
    CHECK(h.n_bounds == 3 && h.bounds == bounds && h.count == 0 && h.sum == 0);
    CHECK(h.buckets[0] == 0 && h.buckets[3] == 0);
    lora_exposition_histogram_observe(&h, -INFINITY, 1);
    lora_exposition_histogram_observe(&h, INFINITY, 1);
    lora_exposition_histogram_observe(&h, 2.5, 3);
    lora_exposition_histogram_observe(&h, nextafter(2.5, 3), 1);
    CHECK(h.buckets[0] == 1 && h.buckets[1] == 0 && h.buckets[2] == 3 && h.buckets[3] == 2);
    CHECK(h.count == 6);
    lora_exposition_histogram_release(&h);
    CHECK(h.buckets == NULL && h.n_bounds == 0);
    lora_exposition_histogram_release(&h); /* again: a zeroed struct */
    lora_exposition_histogram_release(&e);
    lora_exposition_release(&w);
}

static void test_histogram_init(void)
{
    struct lora_exposition_histogram h;
    const double equal[] = {1, 1}, down[] = {2, 1}, with_nan[] = {1, NAN}, one_nan[] = {NAN};
    const double with_inf[] = {1, INFINITY}, neg_inf[] = {-INFINITY, 0};

    errno = 0;
    CHECK(lora_exposition_histogram_init(&h, equal, 2) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, down, 2) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, with_nan, 2) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, one_nan, 1) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, with_inf, 2) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, neg_inf, 2) == -1 && errno == EINVAL);
    CHECK(lora_exposition_histogram_init(&h, down, -1) == -1 && errno == EINVAL);
    CHECK(h.buckets == NULL);
    /* No bounds: only the +Inf bucket. */
    CHECK(lora_exposition_histogram_init(&h, NULL, 0) == 0);
    lora_exposition_histogram_observe(&h, 1e300, 2);
    CHECK(h.buckets[0] == 2 && h.count == 2);
    struct lora_exposition w;
    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "z", LORA_EXPOSITION_HISTOGRAM, "h");
    lora_exposition_histogram(&w, NULL, 0, &h);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP z h\n# TYPE z histogram\nz_bucket{le=\"+Inf\"} 2.0\n"
                   "z_sum 2e+300\nz_count 2.0\n");
    lora_exposition_release(&w);
    lora_exposition_histogram_release(&h);
}

/* ---- order ---------------------------------------------------------------------------------- */

static void test_natural_order(void)
{
    static const char *const engines[] = {"10", "2", "1", "02", "a", "9", "100", "0", "", "1b"};
    struct lora_exposition w;

    /* Whatever the insertion order: try it forwards and backwards. */
    for (int pass = 0; pass < 2; pass++) {
        lora_exposition_init(&w);
        lora_exposition_family_begin(&w, "g", LORA_EXPOSITION_GAUGE, "h");
        for (int k = 0; k < COUNT(engines); k++) {
            int i = pass ? COUNT(engines) - 1 - k : k;
            const struct lora_exposition_label l[] = {{"engine", engines[i]}};
            lora_exposition_sample(&w, l, 1, i);
        }
        lora_exposition_family_end(&w);
        /* Digits sort by value ('0' < '02' on equal value: fewer leading zeros first), and a
         * digit run before a letter as bytes do ('1' < '1b' < '2'; '"' < '0' for the empty). */
        CHECK_TEXT(&w, "# HELP g h\n# TYPE g gauge\n"
                       "g{engine=\"\"} 8.0\n"
                       "g{engine=\"0\"} 7.0\n"
                       "g{engine=\"1\"} 2.0\n"
                       "g{engine=\"1b\"} 9.0\n"
                       "g{engine=\"2\"} 1.0\n"
                       "g{engine=\"02\"} 3.0\n"
                       "g{engine=\"9\"} 5.0\n"
                       "g{engine=\"10\"} 0.0\n"
                       "g{engine=\"100\"} 6.0\n"
                       "g{engine=\"a\"} 4.0\n");
        lora_exposition_release(&w);
    }

    /* Two labels, and histograms sort as one unit. */
    static const double b[] = {1};
    struct lora_exposition_histogram h1, h2;
    CHECK(lora_exposition_histogram_init(&h1, b, 1) == 0 && lora_exposition_histogram_init(&h2, b, 1) == 0);
    lora_exposition_histogram_observe(&h1, 0.5, 1);
    lora_exposition_histogram_observe(&h2, 5, 1);
    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "x", LORA_EXPOSITION_HISTOGRAM, "h");
    const struct lora_exposition_label l10[] = {{"engine", "10"}, {"t", "a"}};
    const struct lora_exposition_label l2[] = {{"engine", "2"}, {"t", "b"}};
    lora_exposition_histogram(&w, l10, 2, &h1);
    lora_exposition_histogram(&w, l2, 2, &h2);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP x h\n# TYPE x histogram\n"
                   "x_bucket{engine=\"2\",t=\"b\",le=\"1.0\"} 0.0\n"
                   "x_bucket{engine=\"2\",t=\"b\",le=\"+Inf\"} 1.0\n"
                   "x_sum{engine=\"2\",t=\"b\"} 5.0\n"
                   "x_count{engine=\"2\",t=\"b\"} 1.0\n"
                   "x_bucket{engine=\"10\",t=\"a\",le=\"1.0\"} 1.0\n"
                   "x_bucket{engine=\"10\",t=\"a\",le=\"+Inf\"} 1.0\n"
                   "x_sum{engine=\"10\",t=\"a\"} 0.5\n"
                   "x_count{engine=\"10\",t=\"a\"} 1.0\n");
    lora_exposition_release(&w);
    lora_exposition_histogram_release(&h1);
    lora_exposition_histogram_release(&h2);
}

/* ---- escaping ------------------------------------------------------------------------------- */

static void test_label_escaping(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain", "plain"},
        {"a\\b", "a\\\\b"},
        {"say \"hi\"", "say \\\"hi\\\""},
        {"two\nlines\n", "two\\nlines\\n"},
        {"\\\"\n", "\\\\\\\"\\n"},
        {"tab\tand\rcr", "tab\tand\rcr"}, /* only the three are escaped */
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\xff", "\xef\xbf\xbd"},
        {"a\x80z", "a\xef\xbf\xbdz"},
        {"\xc3", "\xef\xbf\xbd"},                                 /* cut short */
        {"\xc3(", "\xef\xbf\xbd("},                               /* bad continuation */
        {"\xc0\x80", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong NUL */
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong '/' */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
        {"\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd"}, /* 3-byte form cut short */
        {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"}, /* U+10FFFF itself */
        {"\xef\xbf\xbd", "\xef\xbf\xbd"},         /* U+FFFD stays */
        {"\xfe\"\xff\\", "\xef\xbf\xbd\\\"\xef\xbf\xbd\\\\"},
        {"", ""},
    };
    char want[512];

    for (int i = 0; i < COUNT(cases); i++) {
        struct lora_exposition w;
        const struct lora_exposition_label l[] = {{"v", cases[i].in}};
        lora_exposition_init(&w);
        lora_exposition_family_begin(&w, "e", LORA_EXPOSITION_GAUGE, "h");
        lora_exposition_sample(&w, l, 1, 1);
        lora_exposition_family_end(&w);
        snprintf(want, sizeof(want), "# HELP e h\n# TYPE e gauge\ne{v=\"%s\"} 1.0\n", cases[i].out);
        const char *got = text_of(&w);
        if (!got || strcmp(got, want) != 0) {
            printf("# case %d: got %s", i, got ? got : "(null)\n");
            check_cur_failed = 1;
        }
        lora_exposition_release(&w);
    }

    /* A NULL value is written as empty. */
    struct lora_exposition w;
    const struct lora_exposition_label nul[] = {{"v", NULL}};
    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "e", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(&w, nul, 1, 1);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP e h\n# TYPE e gauge\ne{v=\"\"} 1.0\n");
    lora_exposition_release(&w);
}

static void test_help_escaping(void)
{
    struct lora_exposition w;

    lora_exposition_init(&w);
    /* HELP escapes backslash and newline only; a double quote stays as it is. */
    lora_exposition_family_begin(&w, "h", LORA_EXPOSITION_GAUGE, "a\\b\nc \"q\" \\n");
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP h a\\\\b\\nc \"q\" \\\\n\n# TYPE h gauge\n");
    lora_exposition_release(&w);
}

/* ---- numbers -------------------------------------------------------------------------------- */

/* prometheus_client.utils.floatToGoString(value), value given by its bits. */
static const struct {
    uint64_t bits;
    const char *text;
} go_strings[] = {
    {0x0000000000000000ull, "0.0"},
    {0x8000000000000000ull, "-0.0"},
    {0x3ff0000000000000ull, "1.0"},
    {0xbff0000000000000ull, "-1.0"},
    {0x3fe0000000000000ull, "0.5"},
    {0x4000000000000000ull, "2.0"},
    {0x3fb999999999999aull, "0.1"},
    {0x3fd3333333333334ull, "0.30000000000000004"},
    {0x3fd3333333333333ull, "0.3"},
    {0x3fd5555555555555ull, "0.3333333333333333"},
    {0xbfe5555555555555ull, "-0.6666666666666666"},
    {0x4011666666666666ull, "4.35"},
    {0x3ee4f8b588e368f1ull, "1e-05"},
    {0x3eef75104d551d69ull, "1.5e-05"},
    {0xbee4f8b588e368f1ull, "-1e-05"},
    {0x3f18e757928e0c9eull, "9.5e-05"},
    {0x3f1a36e2eb1c432dull, "0.0001"},
    {0x3f202e4b6ce5dc68ull, "0.00012345"},
    {0x3f50624dd2f1a9fcull, "0.001"},
    {0x3f9999999999999aull, "0.025"},
    {0x4059000000000000ull, "100.0"},
    {0x40a4000000000000ull, "2560.0"},
    {0x40be000000000000ull, "7680.0"},
    {0x40d0000000000000ull, "16384.0"},
    {0x40fe240000000000ull, "123456.0"},
    {0x412e847e00000000ull, "999999.0"},
    {0x412e847f00000000ull, "999999.5"},
    /* From 7 integer digits on, floatToGoString switches to Go's exponent form, spelled its
     * own way: "e+0" then the exponent, so 10**15 is 1e+015. */
    {0x412e848000000000ull, "1e+06"},
    {0x4132d68700000000ull, "1.234567e+06"},
    {0x412e848100000000ull, "1.0000005e+06"},
    {0x41678c29dccccccdull, "1.23456789e+07"},
    {0x41da556e4007df3bull, "1.767225600123e+09"},
    {0x4206fee0e1a80000ull, "1.2345678901e+010"},
    {0x430c6bf526340000ull, "1e+015"},
    {0x430c6bf52633ffffull, "9.999999999999999e+014"},
    {0x4340000000000000ull, "9.007199254740992e+015"},
    {0xc132d68700000000ull, "-1234567.0"}, /* negative: repr's form */
    {0x4341c37937e08000ull, "1e+16"},
    {0x434aa535d3d0c000ull, "1.5e+16"},
    {0xc341c37937e08000ull, "-1e+16"},
    {0x4480f0cf064dd592ull, "1e+22"},
    {0x54b249ad2594c37dull, "1e+100"},
    {0x7fefffffffffffffull, "1.7976931348623157e+308"},
    {0x0000000000000001ull, "5e-324"},
    {0x0010000000000000ull, "2.2250738585072014e-308"},
    /* Powers of two where the nearest 16-digit decimal falls outside the narrow gap below v
     * but repr still finds 16 digits above it. */
    {0x3e70000000000000ull, "5.960464477539063e-08"},
    {0x3d30000000000000ull, "5.684341886080802e-14"},
    {0x0060000000000000ull, "7.120236347223045e-307"},
    {0x8420000000000000ull, "-8.209073602596753e-289"},
    {0x4580000000000000ull, "6.189700196426902e+26"},
    {0x7cf0000000000000ull, "6.386688990511104e+293"},
    {0x7ff0000000000000ull, "+Inf"},
    {0xfff0000000000000ull, "-Inf"},
    {0x7ff8000000000000ull, "NaN"},
    {0xfff8000000000001ull, "NaN"},
};

static void test_format_table(void)
{
    char buf[32];

    for (int i = 0; i < COUNT(go_strings); i++) {
        double v = bits_to_double(go_strings[i].bits);
        int n = lora_exposition_format_double(buf, sizeof(buf), v);
        if (strcmp(buf, go_strings[i].text) != 0 || n != (int)strlen(buf)) {
            printf("# 0x%016" PRIx64 ": got '%s' (%d), want '%s'\n", go_strings[i].bits, buf, n,
                   go_strings[i].text);
            check_cur_failed = 1;
        }
    }
    /* Large integral values as a counter writes them. */
    CHECK(lora_exposition_format_double(buf, sizeof(buf), 4096) == 6 && strcmp(buf, "4096.0") == 0);
    lora_exposition_format_double(buf, sizeof(buf), 18446744073709551616.0);
    CHECK(strcmp(buf, "1.8446744073709552e+19") == 0);
    lora_exposition_format_double(buf, sizeof(buf), 123456789012.0);
    CHECK(strcmp(buf, "1.23456789012e+011") == 0);
}

/* Splits a formatted finite number into its significant digits (no leading zeros) and the
 * decimal exponent of the first; false when the text is not one of the forms allowed. */
static bool split_number(const char *s, char *dig, int *exp10, bool *exp_form)
{
    int n = 0, point = -1, lead = 0;
    const char *p = s;

    if (*p == '-')
        p++;
    *exp_form = false;
    for (; *p && *p != 'e'; p++) {
        if (*p == '.') {
            if (point >= 0)
                return false;
            point = n + lead;
            continue;
        }
        if (*p < '0' || *p > '9')
            return false;
        if (n == 0 && *p == '0') {
            lead++;
            continue;
        }
        dig[n++] = *p;
    }
    dig[n] = 0;
    if (n == 0)
        return false;
    int int_digits = point >= 0 ? point : n + lead;
    *exp10 = int_digits - lead - 1;
    if (*p == 'e') {
        *exp_form = true;
        if (point >= 0 && point != 1)
            return false;
        char *end;
        long e = strtol(p + 1, &end, 10);
        if (*end || (p[1] != '+' && p[1] != '-'))
            return false;
        *exp10 = (int)e;
    } else if (point < 0) {
        return false; /* a fixed form always has a point */
    }
    return true;
}

/* Whether a decimal of the digits dig (n of them, maybe bumped) at exp10 reads back as v. */
static bool reads_back(const char *dig, int exp10, double v)
{
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%c.%se%d", dig[0], dig + 1, exp10);
    return strtod(tmp, NULL) == v;
}

/* The digits of v rounded to n significant, plus and minus one unit in the last place. */
static bool some_shorter_reads_back(double v, int n)
{
    char tmp[64], dig[32];
    int k = 0;

    if (n < 1)
        return false;
    snprintf(tmp, sizeof(tmp), "%.*e", n - 1, v);
    for (const char *p = tmp; *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            dig[k++] = *p;
    dig[k] = 0;
    int exp10 = atoi(strchr(tmp, 'e') + 1);
    if (reads_back(dig, exp10, v))
        return true;
    for (int dir = -1; dir <= 1; dir += 2) {
        char d[32];
        int e = exp10, i = k - 1;
        memcpy(d, dig, (size_t)k + 1);
        if (dir > 0) {
            while (i >= 0 && d[i] == '9')
                d[i--] = '0';
            if (i < 0) {
                d[0] = '1';
                e++;
            } else {
                d[i]++;
            }
        } else {
            while (i >= 0 && d[i] == '0')
                d[i--] = '9';
            if (i < 0)
                continue;
            d[i]--;
            if (d[0] == '0') { /* below a power of ten: k nines, one decade down */
                memset(d, '9', (size_t)k);
                e--;
            }
        }
        if (reads_back(d, e, v))
            return true;
    }
    return false;
}

/* Round trip, form and shortness of one finite value; false with a diagnostic. */
static bool check_number(double v)
{
    char buf[32], dig[32];
    int exp10;
    bool exp_form;

    int n = lora_exposition_format_double(buf, sizeof(buf), v);
    if (n <= 0 || n >= (int)sizeof(buf) || (int)strlen(buf) != n)
        goto bad;
    char *end;
    double back = strtod(buf, &end);
    if (*end || double_to_bits(back) != double_to_bits(v))
        goto bad;
    if (v == 0)
        return strcmp(buf, signbit(v) ? "-0.0" : "0.0") == 0 ? true : (printf("# zero\n"), false);
    if (!split_number(buf, dig, &exp10, &exp_form))
        goto bad;
    int nd = (int)strlen(dig);
    /* repr: exponent form outside [1e-4, 1e16); floatToGoString: from 1e6 on when positive */
    bool want_exp = exp10 < -4 || exp10 >= 16 || (v > 0 && exp10 >= 6);
    if (exp_form != want_exp)
        goto bad;
    if (exp_form && v > 0 && exp10 >= 6 && exp10 < 16) {
        /* "e+0" then the exponent without padding */
        char want_tail[16];
        snprintf(want_tail, sizeof(want_tail), "e+0%d", exp10);
        if (strcmp(strchr(buf, 'e'), want_tail) != 0)
            goto bad;
    } else if (exp_form) {
        char want_tail[16];
        snprintf(want_tail, sizeof(want_tail), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        if (strcmp(strchr(buf, 'e'), want_tail) != 0)
            goto bad;
    }
    /* No trailing zero after the point, except the ".0" of an integral fixed form */
    size_t bl = strlen(buf);
    if (exp_form ? dig[nd - 1] == '0'
                 : buf[bl - 1] == '0' && !(buf[bl - 2] == '.' && !strchr(buf, '.')[2]))
        goto bad;
    int sig = nd;
    while (sig > 1 && dig[sig - 1] == '0')
        sig--;
    if (exp_form && sig != nd)
        goto bad;
    if (some_shorter_reads_back(fabs(v), sig - 1))
        goto bad;
    /* Among the shortest, the nearest: the correctly rounded one when it reads back. */
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%.*e", sig - 1, fabs(v));
    if (strtod(tmp, NULL) == fabs(v)) {
        char want[32];
        int k = 0;
        for (const char *p = tmp; *p != 'e'; p++)
            if (*p >= '0' && *p <= '9')
                want[k++] = *p;
        want[k] = 0;
        if (strncmp(want, dig, (size_t)sig) != 0)
            goto bad;
    }
    return true;
bad:
    printf("# %.17g (0x%016" PRIx64 ") written as '%s'\n", v, double_to_bits(v), buf);
    return false;
}

static void test_format_random(void)
{
    int n_bad = 0;

    for (int i = 0; i < 40000 && n_bad < 10; i++) {
        double v;
        switch (i % 4) {
        case 0: /* any finite bit pattern */
            do
                v = bits_to_double(rng());
            while (!isfinite(v));
            break;
        case 1: /* integers, the counters' values */
            v = (double)(rng() >> (rng() % 64));
            break;
        case 2: /* short decimals at every scale, the bounds' values */
            v = (double)(rng() % 100000) * pow(10, (int)(rng() % 40) - 20);
            break;
        default: /* powers of two, where the gap below is narrower */
            v = ldexp(1, (int)(rng() % 2098) - 1074);
            break;
        }
        if (rng() & 1)
            v = -v;
        n_bad += !check_number(v);
    }
    CHECK(n_bad == 0);
    CHECK(check_number(DBL_MIN) && check_number(DBL_MAX) && check_number(DBL_TRUE_MIN));
    CHECK(check_number(1e-4) && check_number(nextafter(1e-4, 0)) && check_number(1e6) &&
          check_number(nextafter(1e6, 0)) && check_number(1e16) &&
          check_number(nextafter(1e16, 0)));
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* Runs one misuse after a good family and checks the sticky error, then a reset. */
static void expect_error(void (*misuse)(struct lora_exposition *), const char *msg)
{
    struct lora_exposition w;
    char err[256] = "";
    const struct lora_exposition_label ok[] = {{"a", "1"}};

    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "good", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(&w, ok, 1, 1);
    lora_exposition_family_end(&w);
    misuse(&w);
    /* Later calls change nothing: the first error stays. */
    lora_exposition_family_begin(&w, "later", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(&w, ok, 1, 2);
    lora_exposition_family_end(&w);
    size_t len = 12345;
    CHECK(lora_exposition_text(&w, &len, err, sizeof(err)) == NULL);
    CHECK(len == 12345);
    CHECK_CONTAINS(err, msg);
    CHECK(lora_exposition_text(&w, NULL, NULL, 0) == NULL);
    /* A reset clears it, and the writer works again from empty. */
    lora_exposition_reset(&w);
    lora_exposition_family_begin(&w, "again", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(&w, ok, 1, 3);
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP again h\n# TYPE again gauge\nagain{a=\"1\"} 3.0\n");
    lora_exposition_release(&w);
}

static const struct lora_exposition_label one_label[] = {{"a", "1"}};

static void m_bad_family_digit(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "1abc", LORA_EXPOSITION_GAUGE, "h");
}
static void m_bad_family_dash(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "a-b", LORA_EXPOSITION_GAUGE, "h");
}
static void m_bad_family_empty(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "", LORA_EXPOSITION_GAUGE, "h");
}
static void m_bad_family_null(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, NULL, LORA_EXPOSITION_GAUGE, "h");
}
static void m_bad_family_long(struct lora_exposition *w)
{
    char name[300];
    memset(name, 'x', sizeof(name) - 1);
    name[sizeof(name) - 1] = 0;
    lora_exposition_family_begin(w, name, LORA_EXPOSITION_GAUGE, "h");
}
static void m_bad_type(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "t", (enum lora_exposition_type)7, "h");
}
static void sample_with(struct lora_exposition *w, const char *name)
{
    const struct lora_exposition_label l[] = {{"ok", "x"}, {name, "v"}};
    lora_exposition_family_begin(w, "f", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(w, l, 2, 1);
    lora_exposition_family_end(w);
}
static void m_label_le(struct lora_exposition *w)
{
    sample_with(w, "le");
}
static void m_label_digit(struct lora_exposition *w)
{
    sample_with(w, "1a");
}
static void m_label_colon(struct lora_exposition *w)
{
    sample_with(w, "a:b");
}
static void m_label_reserved(struct lora_exposition *w)
{
    sample_with(w, "__name__");
}
static void m_label_empty(struct lora_exposition *w)
{
    sample_with(w, "");
}
static void m_label_null(struct lora_exposition *w)
{
    sample_with(w, NULL);
}
static void m_label_twice(struct lora_exposition *w)
{
    sample_with(w, "ok");
}
static void m_too_many_labels(struct lora_exposition *w)
{
    struct lora_exposition_label l[LORA_EXPOSITION_MAX_LABELS + 1];
    static const char *const names[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    for (int i = 0; i <= LORA_EXPOSITION_MAX_LABELS; i++)
        l[i] = (struct lora_exposition_label){names[i], "v"};
    lora_exposition_family_begin(w, "f", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(w, l, LORA_EXPOSITION_MAX_LABELS + 1, 1);
}
static void m_negative_labels(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "f", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(w, one_label, -1, 1);
}
static void m_outside(struct lora_exposition *w)
{
    lora_exposition_sample(w, one_label, 1, 1);
}
static void m_histogram_outside(struct lora_exposition *w)
{
    static const double b[] = {1};
    struct lora_exposition_histogram h;
    lora_exposition_histogram_init(&h, b, 1);
    lora_exposition_histogram(w, one_label, 1, &h);
    lora_exposition_histogram_release(&h);
}
static void m_plain_in_histogram(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "hh", LORA_EXPOSITION_HISTOGRAM, "h");
    lora_exposition_sample(w, one_label, 1, 1);
}
static void m_histogram_in_gauge(struct lora_exposition *w)
{
    static const double b[] = {1};
    struct lora_exposition_histogram h;
    lora_exposition_histogram_init(&h, b, 1);
    lora_exposition_family_begin(w, "gg", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_histogram(w, one_label, 1, &h);
    lora_exposition_histogram_release(&h);
}
static void m_empty_histogram(struct lora_exposition *w)
{
    struct lora_exposition_histogram h;
    memset(&h, 0, sizeof(h));
    lora_exposition_family_begin(w, "hh", LORA_EXPOSITION_HISTOGRAM, "h");
    lora_exposition_histogram(w, NULL, 0, &h);
}
static void m_nested(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "outer", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_family_begin(w, "inner", LORA_EXPOSITION_GAUGE, "h");
}
static void m_end_unbegun(struct lora_exposition *w)
{
    lora_exposition_family_end(w);
}
static void m_duplicate_series(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "d", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(w, one_label, 1, 1);
    lora_exposition_sample(w, one_label, 1, 2);
    lora_exposition_family_end(w);
}
static void m_left_open(struct lora_exposition *w)
{
    lora_exposition_family_begin(w, "open", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(w, one_label, 1, 1);
}

static void test_errors(void)
{
    expect_error(m_bad_family_digit, "bad family name '1abc'");
    expect_error(m_bad_family_dash, "bad family name 'a-b'");
    expect_error(m_bad_family_empty, "bad family name");
    expect_error(m_bad_family_null, "bad family name");
    expect_error(m_bad_family_long, "bad family name");
    expect_error(m_bad_type, "bad family name 't'");
    expect_error(m_label_le, "f: bad label name 'le'");
    expect_error(m_label_digit, "bad label name '1a'");
    expect_error(m_label_colon, "bad label name 'a:b'");
    expect_error(m_label_reserved, "bad label name '__name__'");
    expect_error(m_label_empty, "bad label name ''");
    expect_error(m_label_null, "bad label name");
    expect_error(m_label_twice, "label 'ok' twice");
    expect_error(m_too_many_labels, "f: 9 labels");
    expect_error(m_negative_labels, "f: -1 labels");
    expect_error(m_outside, "a sample outside a family");
    expect_error(m_histogram_outside, "a sample outside a family");
    expect_error(m_plain_in_histogram, "hh: a plain sample in a histogram family");
    expect_error(m_histogram_in_gauge, "gg: a histogram sample in a plain family");
    expect_error(m_empty_histogram, "hh: an empty histogram");
    expect_error(m_nested, "family 'inner' begun inside 'outer'");
    expect_error(m_end_unbegun, "a family ended that was not begun");
    expect_error(m_duplicate_series, "d: two series with the labels {a=\"1\"}");

    /* A family left open is no sticky error: the text is refused until it is ended. */
    struct lora_exposition w;
    char err[128] = "";
    lora_exposition_init(&w);
    m_left_open(&w);
    CHECK(lora_exposition_text(&w, NULL, err, sizeof(err)) == NULL);
    CHECK_CONTAINS(err, "a family was left open");
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP open h\n# TYPE open gauge\nopen{a=\"1\"} 1.0\n");
    lora_exposition_release(&w);
}

static void test_reset_and_reuse(void)
{
    struct lora_exposition w;
    const struct lora_exposition_label l[] = {{"a", "x"}};

    lora_exposition_init(&w);
    for (int round = 0; round < 3; round++) {
        lora_exposition_reset(&w);
        lora_exposition_family_begin(&w, "c_total", LORA_EXPOSITION_COUNTER, "h");
        lora_exposition_sample(&w, l, 1, round);
        lora_exposition_family_end(&w);
        char want[128];
        snprintf(want, sizeof(want),
                 "# HELP c_total h\n# TYPE c_total counter\n"
                 "c_total{a=\"x\"} %d.0\n",
                 round);
        CHECK_TEXT(&w, want);
    }
    /* A reset inside an open family drops it. */
    lora_exposition_family_begin(&w, "open", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_sample(&w, l, 1, 1);
    lora_exposition_reset(&w);
    CHECK_TEXT(&w, "");
    lora_exposition_family_begin(&w, "g", LORA_EXPOSITION_GAUGE, "h");
    lora_exposition_family_end(&w);
    CHECK_TEXT(&w, "# HELP g h\n# TYPE g gauge\n");
    lora_exposition_release(&w);
    CHECK(w.out == NULL && w.len == 0);
    lora_exposition_release(&w); /* twice is fine */

    /* Output larger than the first buffer: many series, all kept in order. */
    lora_exposition_init(&w);
    lora_exposition_family_begin(&w, "big", LORA_EXPOSITION_GAUGE, "h");
    char val[32];
    for (int i = 999; i >= 0; i--) {
        snprintf(val, sizeof(val), "%d", i);
        const struct lora_exposition_label li[] = {{"i", val}};
        lora_exposition_sample(&w, li, 1, i);
    }
    lora_exposition_family_end(&w);
    const char *t = text_of(&w);
    CHECK(t != NULL);
    int n = 0, last = -1;
    for (const char *p = t ? strstr(t, "big{") : NULL; p; p = strstr(p + 1, "big{")) {
        int i = atoi(p + 7);
        if (i != last + 1)
            break;
        last = i;
        n++;
    }
    CHECK(n == 1000);
    lora_exposition_release(&w);
}

/* ---- the fuzz test: a validating 0.0.4 parser ------------------------------------------------ */

/* Length of the well-formed UTF-8 sequence at s (n bytes left; the Unicode standard's table of
 * well-formed byte sequences), 0 when ill-formed. */
static int wf_utf8(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    int len;

    if (c <= 0x7f)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c == 0xe0)
        len = 3, lo = 0xa0;
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
        len = 3;
    else if (c == 0xed)
        len = 3, hi = 0x9f;
    else if (c == 0xf0)
        len = 4, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
        len = 4;
    else if (c == 0xf4)
        len = 4, hi = 0x8f;
    else
        return 0;
    if ((size_t)len > n || s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int l = wf_utf8((const unsigned char *)s + i, n - i);
        if (!l)
            return false;
        i += (size_t)l;
    }
    return true;
}

/* What a label value should read as after unescaping: each ill-formed byte as U+FFFD. */
static size_t sanitized(const char *in, char *out)
{
    size_t n = strlen(in), k = 0;
    for (size_t i = 0; i < n;) {
        int l = wf_utf8((const unsigned char *)in + i, n - i);
        if (!l) {
            memcpy(out + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        } else {
            memcpy(out + k, in + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        }
    }
    out[k] = 0;
    return k;
}

#define F_MAX_FAMILIES 4
#define F_MAX_SERIES   6
#define F_MAX_LABELS   4
#define F_MAX_VALUE    24
#define F_MAX_BOUNDS   6

struct f_series {
    int n_labels;
    char names[F_MAX_LABELS][16];
    char values[F_MAX_LABELS][F_MAX_VALUE + 1];
    double value;
    double bounds[F_MAX_BOUNDS];
    struct lora_exposition_histogram h;
};

struct f_family {
    char name[40];
    char help[40];
    enum lora_exposition_type type;
    int n_series;
    struct f_series s[F_MAX_SERIES];
    int seen[F_MAX_SERIES]; /* lines of each series found in the output */
};

static const char name_first[] = "abcxyzABCXYZ_:";
static const char name_rest[] = "abcxyzABCXYZ_:0123456789";

/* A valid name of 1 to max - 1 characters; ':' only in metric names. */
static void random_name(char *out, int max, bool colon)
{
    int n = 1 + (int)(rng() % (uint64_t)(max - 1));
    for (int i = 0; i < n; i++) {
        const char *set = i ? name_rest : name_first;
        char c;
        do
            c = set[rng() % strlen(set)];
        while (!colon && c == ':');
        out[i] = c;
    }
    out[n] = 0;
}

/* Random label bytes: garbage without NUL, quotes, backslashes, newlines, UTF-8 pieces. */
static void random_value(char *out)
{
    static const char *const pieces[] = {
        "\\",   "\"",           "\n",   "\xc3\xa9", "\xe2\x82\xac",     "\xf0\x9f\x98\x80",
        "\xc3", "\xed\xa0\x80", "\xff", "\x80",     "\xf4\x90\x80\x80", "\xe0\x80",
        "1",    "10",           "a"};
    int n = 0, want = (int)(rng() % (F_MAX_VALUE + 1));
    while (n < want) {
        if (rng() % 3 == 0) {
            char c = (char)(1 + rng() % 255);
            out[n++] = c;
        } else {
            const char *p = pieces[rng() % COUNT(pieces)];
            size_t l = strlen(p);
            if (n + (int)l > want)
                break;
            memcpy(out + n, p, l);
            n += (int)l;
        }
    }
    out[n] = 0;
}

static double random_sample_value(void)
{
    switch (rng() % 8) {
    case 0:
        return NAN;
    case 1:
        return rng() & 1 ? INFINITY : -INFINITY;
    case 2:
        return (double)(rng() % 1000);
    case 3:
        return (double)rng();
    case 4: {
        double v;
        do
            v = bits_to_double(rng());
        while (!isfinite(v));
        return v;
    }
    default:
        return (double)(int64_t)(rng() % 2000000 - 1000000) / 64.0;
    }
}

/* Unescapes a label value from *pp (after the opening quote) up to the closing quote. Returns
 * its length in out, or -1 for a raw newline, a bad escape or no closing quote. */
static long parse_label_value(const char **pp, const char *end, char *out, size_t cap)
{
    const char *p = *pp;
    size_t k = 0;

    while (p < end && *p != '"') {
        char c = *p++;
        if (c == '\n')
            return -1;
        if (c == '\\') {
            if (p >= end)
                return -1;
            char e = *p++;
            c = e == '\\' ? '\\' : e == '"' ? '"' : e == 'n' ? '\n' : 0;
            if (!c)
                return -1;
        }
        if (k + 1 >= cap)
            return -1;
        out[k++] = c;
    }
    if (p >= end)
        return -1;
    out[k] = 0;
    *pp = p + 1;
    return (long)k;
}

struct p_sample {
    char name[64];
    int n_labels;
    char lname[F_MAX_LABELS + 1][16];
    char lvalue[F_MAX_LABELS + 1][4 * F_MAX_VALUE + 8];
    char value[40];
    const char *labels_at; /* the label text, braces included, in the line */
    size_t labels_len;
};

static bool is_name_char(char c, bool first, bool colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

/* Reads a name at *pp; false when there is none. */
static bool parse_name(const char **pp, const char *end, char *out, size_t cap, bool colon)
{
    const char *p = *pp;
    size_t k = 0;
    while (p < end && is_name_char(*p, k == 0, colon) && k + 1 < cap)
        out[k++] = *p++;
    out[k] = 0;
    *pp = p;
    return k > 0;
}

/* name{l="v",...} value, nothing after it (no timestamp). */
static bool parse_sample(const char *p, const char *end, struct p_sample *s)
{
    memset(s, 0, sizeof(*s));
    if (!parse_name(&p, end, s->name, sizeof(s->name), true))
        return false;
    s->labels_at = p;
    if (p < end && *p == '{') {
        p++;
        for (;;) {
            if (s->n_labels > F_MAX_LABELS)
                return false;
            char *ln = s->lname[s->n_labels], *lv = s->lvalue[s->n_labels];
            if (!parse_name(&p, end, ln, sizeof(s->lname[0]), false))
                return false;
            if (end - p < 2 || p[0] != '=' || p[1] != '"')
                return false;
            p += 2;
            long n = parse_label_value(&p, end, lv, sizeof(s->lvalue[0]));
            if (n < 0 || !valid_utf8(lv, (size_t)n))
                return false;
            s->n_labels++;
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (p < end && *p == '}') {
                p++;
                break;
            }
            return false;
        }
    }
    s->labels_len = (size_t)(p - s->labels_at);
    if (p >= end || *p != ' ')
        return false;
    p++;
    size_t vl = (size_t)(end - p);
    if (vl == 0 || vl >= sizeof(s->value) || memchr(p, ' ', vl))
        return false;
    memcpy(s->value, p, vl);
    s->value[vl] = 0;
    if (strcmp(s->value, "+Inf") == 0 || strcmp(s->value, "-Inf") == 0 ||
        strcmp(s->value, "NaN") == 0)
        return true;
    char *e;
    strtod(s->value, &e);
    /* strtod takes "inf" and "nan" too: only the spellings above are the format's */
    return *e == 0 && !strpbrk(s->value, "iInN");
}

static bool same_number(const char *text, double v)
{
    if (isnan(v))
        return strcmp(text, "NaN") == 0;
    if (isinf(v))
        return strcmp(text, v > 0 ? "+Inf" : "-Inf") == 0;
    return double_to_bits(strtod(text, NULL)) == double_to_bits(v);
}

/* Natural order of two label texts, written here from the header's words: runs of digits
 * compare by value (then fewer leading zeros first), everything else bytewise. */
static int natural(const char *a, size_t an, const char *b, size_t bn)
{
    size_t i = 0, j = 0;
    while (i < an && j < bn) {
        bool da = a[i] >= '0' && a[i] <= '9', db = b[j] >= '0' && b[j] <= '9';
        if (!da || !db) {
            if (a[i] != b[j])
                return (unsigned char)a[i] < (unsigned char)b[j] ? -1 : 1;
            i++, j++;
            continue;
        }
        size_t ie = i, je = j;
        while (ie < an && a[ie] >= '0' && a[ie] <= '9')
            ie++;
        while (je < bn && b[je] >= '0' && b[je] <= '9')
            je++;
        size_t zi = i, zj = j;
        while (zi + 1 < ie && a[zi] == '0')
            zi++;
        while (zj + 1 < je && b[zj] == '0')
            zj++;
        if (ie - zi != je - zj)
            return ie - zi < je - zj ? -1 : 1;
        int c = memcmp(a + zi, b + zj, ie - zi);
        if (c)
            return c;
        if (zi - i != zj - j)
            return zi - i < zj - j ? -1 : 1;
        i = ie, j = je;
    }
    return (i < an) - (j < bn);
}

/* Validates text against the families it was made from; false with a diagnostic. */
static bool validate(const char *text, size_t len, struct f_family *fam, int n_fam)
{
    const char *p = text, *end = text + len;
    int f = -1, expect = 0; /* 0: HELP next, 1: TYPE next, 2: samples or HELP */
    int open_id = -1;       /* the histogram series whose lines are being read */
    char prev_key[512] = "";
    size_t prev_len = 0;
    bool have_prev = false;
    int line_no = 0;
    static const char *const types[] = {"counter", "gauge", "histogram"};

    if (len && text[len - 1] != '\n')
        goto bad;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line_no++;
        if (!valid_utf8(p, (size_t)(le - p)))
            goto bad;
        if (le - p >= 7 && memcmp(p, "# HELP ", 7) == 0) {
            if (expect == 1 || f + 1 >= n_fam)
                goto bad;
            f++;
            /* the previous family had all its lines */
            if (f > 0) {
                struct f_family *pf = &fam[f - 1];
                int per = pf->type == LORA_EXPOSITION_HISTOGRAM ? 0 : 1;
                for (int i = 0; i < pf->n_series; i++) {
                    int want = per ? 1 : pf->s[i].h.n_bounds + 3;
                    if (pf->seen[i] != want)
                        goto bad;
                }
            }
            const char *q = p + 7;
            char name[64], help[128];
            size_t k = 0;
            if (!parse_name(&q, le, name, sizeof(name), true) || strcmp(name, fam[f].name) ||
                q >= le || *q != ' ')
                goto bad;
            for (q++; q < le; q++) {
                char c = *q;
                if (c == '\\') {
                    if (q + 1 >= le || (q[1] != '\\' && q[1] != 'n'))
                        goto bad;
                    c = q[1] == 'n' ? '\n' : '\\';
                    q++;
                }
                help[k++] = c;
            }
            help[k] = 0;
            if (strcmp(help, fam[f].help) != 0)
                goto bad;
            expect = 1;
            have_prev = false;
            open_id = -1;
        } else if (le - p >= 7 && memcmp(p, "# TYPE ", 7) == 0) {
            if (expect != 1)
                goto bad;
            char want[128];
            snprintf(want, sizeof(want), "# TYPE %s %s", fam[f].name, types[fam[f].type]);
            if ((size_t)(le - p) != strlen(want) || memcmp(p, want, strlen(want)) != 0)
                goto bad;
            expect = 2;
        } else {
            struct p_sample s;
            if (expect != 2 || !parse_sample(p, le, &s))
                goto bad;
            struct f_family *cf = &fam[f];
            bool hist = cf->type == LORA_EXPOSITION_HISTOGRAM;
            size_t fl = strlen(cf->name);
            const char *suffix = s.name + fl;
            if (strncmp(s.name, cf->name, fl) != 0)
                goto bad;
            bool bucket = hist && strcmp(suffix, "_bucket") == 0;
            if (hist ? !bucket && strcmp(suffix, "_sum") && strcmp(suffix, "_count") : *suffix != 0)
                goto bad;
            /* which series: the "id" label */
            int id = -1, n_own = s.n_labels - bucket;
            for (int i = 0; i < n_own; i++)
                if (strcmp(s.lname[i], "id") == 0)
                    id = atoi(s.lvalue[i]);
            if (id < 0 || id >= cf->n_series)
                goto bad;
            struct f_series *fs = &cf->s[id];
            if (n_own != fs->n_labels)
                goto bad;
            for (int i = 0; i < n_own; i++) {
                char want[4 * F_MAX_VALUE + 8];
                sanitized(fs->values[i], want);
                if (strcmp(s.lname[i], fs->names[i]) || strcmp(s.lvalue[i], want))
                    goto bad;
                /* a value that was valid UTF-8 reads back exactly */
                if (valid_utf8(fs->values[i], strlen(fs->values[i])) &&
                    strcmp(s.lvalue[i], fs->values[i]))
                    goto bad;
            }
            int at = cf->seen[id]++;
            if (!hist) {
                if (!same_number(s.value, fs->value))
                    goto bad;
            } else {
                const struct lora_exposition_histogram *h = &fs->h;
                uint64_t cum = 0;
                if (at <= h->n_bounds) {
                    char lev[40];
                    if (!bucket || strcmp(s.lname[s.n_labels - 1], "le"))
                        goto bad;
                    for (int b = 0; b <= at; b++)
                        cum += h->buckets[b];
                    if (at < h->n_bounds) {
                        lora_exposition_format_double(lev, sizeof(lev), h->bounds[at]);
                        if (!same_number(s.lvalue[s.n_labels - 1], h->bounds[at]) ||
                            strcmp(lev, s.lvalue[s.n_labels - 1]))
                            goto bad;
                    } else if (strcmp(s.lvalue[s.n_labels - 1], "+Inf")) {
                        goto bad;
                    }
                    if (!same_number(s.value, (double)cum))
                        goto bad;
                } else if (at == h->n_bounds + 1) {
                    if (strcmp(suffix, "_sum") || !same_number(s.value, h->sum))
                        goto bad;
                } else if (at == h->n_bounds + 2) {
                    if (strcmp(suffix, "_count") || !same_number(s.value, (double)h->count))
                        goto bad;
                } else {
                    goto bad;
                }
            }
            /* a histogram's lines stay together */
            if (hist) {
                if (open_id >= 0 && open_id != id)
                    goto bad;
                open_id = cf->seen[id] == fs->h.n_bounds + 3 ? -1 : id;
            }
            /* series in natural order of their label text (a histogram's without le: its _sum) */
            if (!hist || at == fs->h.n_bounds + 1) {
                if (s.labels_len >= sizeof(prev_key) ||
                    (have_prev && natural(prev_key, prev_len, s.labels_at, s.labels_len) >= 0))
                    goto bad;
                memcpy(prev_key, s.labels_at, s.labels_len);
                prev_len = s.labels_len;
                have_prev = true;
            }
        }
        p = le + 1;
    }
    if (f != n_fam - 1 || (n_fam && expect != 2))
        goto bad;
    for (int i = 0; n_fam && i < fam[f].n_series; i++) {
        struct f_family *pf = &fam[f];
        int want = pf->type == LORA_EXPOSITION_HISTOGRAM ? pf->s[i].h.n_bounds + 3 : 1;
        if (pf->seen[i] != want)
            goto bad;
    }
    return true;
bad:
    printf("# invalid output at line %d:\n", line_no);
    for (const char *q = text; q < end; q++)
        putchar(*q);
    return false;
}

static void build_family(struct f_family *f, int index)
{
    char name[24];

    memset(f, 0, sizeof(*f));
    f->type = (enum lora_exposition_type)(rng() % 3);
    random_name(name, sizeof(name), true);
    /* distinct names: the format wants each family once */
    snprintf(f->name, sizeof(f->name), "%s_%d%s", name, index,
             f->type == LORA_EXPOSITION_COUNTER ? "_total" : "");
    int hl = (int)(rng() % 20);
    for (int i = 0; i < hl; i++) {
        static const char help_chars[] = "ab \\\n\"{}#=09";
        f->help[i] = help_chars[rng() % (sizeof(help_chars) - 1)];
    }
    f->n_series = (int)(rng() % (F_MAX_SERIES + 1));
    /* Label names are the family's, the same for every series, one of them "id". */
    int n_labels = 1 + (int)(rng() % F_MAX_LABELS);
    int id_at = (int)(rng() % (uint64_t)n_labels);
    char names[F_MAX_LABELS][16];
    for (int l = 0; l < n_labels; l++) {
        bool dup;
        do {
            random_name(names[l], 8, false);
            dup = strcmp(names[l], "le") == 0 || strncmp(names[l], "__", 2) == 0 ||
                  strcmp(names[l], "id") == 0;
            for (int k = 0; k < l; k++)
                dup |= strcmp(names[l], names[k]) == 0;
        } while (dup);
    }
    strcpy(names[id_at], "id");
    for (int i = 0; i < f->n_series; i++) {
        struct f_series *s = &f->s[i];
        s->n_labels = n_labels;
        for (int l = 0; l < n_labels; l++) {
            strcpy(s->names[l], names[l]);
            if (l == id_at)
                snprintf(s->values[l], sizeof(s->values[l]), "%d", i);
            else
                random_value(s->values[l]);
        }
        s->value = random_sample_value();
        if (f->type == LORA_EXPOSITION_HISTOGRAM) {
            int nb = (int)(rng() % (F_MAX_BOUNDS + 1));
            double b = (double)(int)(rng() % 10) - 5;
            for (int k = 0; k < nb; k++) {
                b += (double)(1 + rng() % 100) / 8;
                s->bounds[k] = b;
            }
            if (lora_exposition_histogram_init(&s->h, s->bounds, nb) < 0) {
                check_cur_failed = 1;
                continue;
            }
            int n_obs = (int)(rng() % 8);
            for (int k = 0; k < n_obs; k++)
                lora_exposition_histogram_observe(
                    &s->h, rng() % 5 ? (double)(int)(rng() % 40) / 4 - 5 : random_sample_value(),
                    rng() % 4);
        }
    }
}

/* Observations recounted independently: bucket b holds the values <= bounds[b] and above the
 * bound before it. */
static bool buckets_right(const struct lora_exposition_histogram *h)
{
    uint64_t total = 0;
    for (int b = 0; b <= h->n_bounds; b++)
        total += h->buckets[b];
    return total == h->count;
}

static void test_fuzz(void)
{
    struct lora_exposition w;
    int n_bad = 0, n_lines = 0, n_errors = 0;
    static struct f_family fam[F_MAX_FAMILIES];
    struct lora_exposition_histogram no_bounds;

    CHECK(lora_exposition_histogram_init(&no_bounds, NULL, 0) == 0);
    lora_exposition_init(&w);
    for (int iter = 0; iter < 3000 && n_bad < 3; iter++) {
        int n_fam = (int)(rng() % (F_MAX_FAMILIES + 1));
        lora_exposition_reset(&w);
        for (int f = 0; f < n_fam; f++)
            build_family(&fam[f], f);
        bool inject = rng() % 10 == 0;
        for (int f = 0; f < n_fam; f++) {
            struct f_family *cf = &fam[f];
            lora_exposition_family_begin(&w, cf->name, cf->type, cf->help);
            /* in a random order */
            int order[F_MAX_SERIES];
            for (int i = 0; i < cf->n_series; i++)
                order[i] = i;
            for (int i = cf->n_series - 1; i > 0; i--) {
                int j = (int)(rng() % (uint64_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
            for (int k = 0; k < cf->n_series; k++) {
                struct f_series *s = &cf->s[order[k]];
                struct lora_exposition_label l[F_MAX_LABELS];
                for (int i = 0; i < s->n_labels; i++)
                    l[i] = (struct lora_exposition_label){s->names[i], s->values[i]};
                if (cf->type == LORA_EXPOSITION_HISTOGRAM)
                    lora_exposition_histogram(&w, l, s->n_labels, &s->h);
                else
                    lora_exposition_sample(&w, l, s->n_labels, s->value);
            }
            if (inject && f == n_fam - 1) {
                const struct lora_exposition_label bad[] = {{"le", "x"}};
                if (cf->type == LORA_EXPOSITION_HISTOGRAM)
                    lora_exposition_histogram(&w, bad, 1, &no_bounds);
                else
                    lora_exposition_sample(&w, bad, 1, 1);
            }
            lora_exposition_family_end(&w);
        }
        char err[256] = "";
        size_t len = 0;
        const char *t = lora_exposition_text(&w, &len, err, sizeof(err));
        if (inject && n_fam > 0) {
            /* a sample of either kind with a label "le" is refused */
            n_errors++;
            if (t || !strstr(err, "bad label name 'le'")) {
                printf("# injected error not reported: '%s'\n", err);
                n_bad++;
            }
        } else if (!t || strlen(t) != len) {
            printf("# iteration %d: %s\n", iter, err);
            n_bad++;
        } else {
            n_bad += !validate(t, len, fam, n_fam);
            for (const char *q = t; *q; q++)
                n_lines += *q == '\n';
        }
        for (int f = 0; f < n_fam; f++)
            for (int i = 0; i < fam[f].n_series; i++) {
                if (fam[f].type == LORA_EXPOSITION_HISTOGRAM && !buckets_right(&fam[f].s[i].h))
                    n_bad++;
                lora_exposition_histogram_release(&fam[f].s[i].h);
            }
    }
    printf("# 3000 random expositions, %d lines checked, %d with an injected error\n", n_lines,
           n_errors);
    CHECK(n_bad == 0);
    CHECK(n_lines > 10000);
    lora_exposition_release(&w);
    lora_exposition_histogram_release(&no_bounds);
}

int main(void)
{
    RUN(test_empty_families);
    RUN(test_counter_gauge_exact);
    RUN(test_histogram_exact);
    RUN(test_histogram_init);
    RUN(test_natural_order);
    RUN(test_label_escaping);
    RUN(test_help_escaping);
    RUN(test_format_table);
    RUN(test_format_random);
    RUN(test_errors);
    RUN(test_reset_and_reuse);
    RUN(test_fuzz);
    return check_done();
}
