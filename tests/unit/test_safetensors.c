/* Unit tests for lib/runtime/safetensors: conversions against known bit patterns (and the compiler's
 * _Float16 as an independent F16 reference), write/read round trips, every malformed-header
 * error, and a fixed-seed mutation run that must never crash.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include "check.h"
#include "fixture.h"
#include "runtime/safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_BYTES 256

/* Writes fx_tmp_dir/name into buf (PATH_BYTES) and returns buf. */
static const char *tmp_path(char *buf, const char *name)
{
    int n = snprintf(buf, PATH_BYTES, "%s/%s", fx_tmp_dir, name);

    if (n < 0 || n >= PATH_BYTES)
        buf[0] = '\0'; /* never a name of ours; fails loudly at the first use */
    return buf;
}

static uint32_t bits_of(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

static float float_of(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Writes bytes to path; returns 0 or -1. */
static int write_bytes(const char *path, const void *p, size_t len)
{
    FILE *f = fopen(path, "wb");
    int ret = 0;

    if (!f)
        return -1;
    if (len && fwrite(p, 1, len, f) != len)
        ret = -1;
    if (fclose(f) != 0)
        ret = -1;
    return ret;
}

/* Writes a raw safetensors file: an 8-byte little-endian header_len, the JSON text, then
 * data_len bytes of data (a counting pattern). header_len need not match the JSON's length. */
static int write_raw_len(const char *path, uint64_t header_len, const char *json, size_t data_len)
{
    size_t json_len = strlen(json);
    unsigned char *buf = malloc(8 + json_len + data_len + 1);
    int ret;

    if (!buf)
        return -1;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(header_len >> (8 * i));
    memcpy(buf + 8, json, json_len);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + json_len + i] = (unsigned char)i;
    ret = write_bytes(path, buf, 8 + json_len + data_len);
    free(buf);
    return ret;
}

static int write_raw(const char *path, const char *json, size_t data_len)
{
    return write_raw_len(path, strlen(json), json, data_len);
}

/* Opens path and returns 1 when it fails with an error containing the file name and every
 * one of want (NULL-terminated); prints the error otherwise. */
static int open_fails_with(const char *path, const char *want1, const char *want2)
{
    char err[512];
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));

    if (st) {
        printf("# %s: opened, expected an error with '%s'\n", path, want1);
        lora_safetensors_close(&st);
        return 0;
    }
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, want1);
    if (want2)
        CHECK_CONTAINS(err, want2);
    return strstr(err, path) && strstr(err, want1) && (!want2 || strstr(err, want2));
}

/* Writes json (with data_len data bytes) and expects opening to fail with want1 and want2. */
static void expect_bad(const char *json, size_t data_len, const char *want1, const char *want2)
{
    char path[PATH_BYTES];

    tmp_path(path, "bad.safetensors");
    CHECK(write_raw(path, json, data_len) == 0);
    if (!open_fails_with(path, want1, want2))
        printf("# header was: %s\n", json);
}

static void test_dtype_names_sizes(void)
{
    static const struct {
        enum lora_dtype dtype;
        const char *name;
        size_t size;
    } want[] = {
        {LORA_DTYPE_F32, "F32", 4},   {LORA_DTYPE_F16, "F16", 2}, {LORA_DTYPE_BF16, "BF16", 2},
        {LORA_DTYPE_F64, "F64", 8},   {LORA_DTYPE_I64, "I64", 8}, {LORA_DTYPE_I32, "I32", 4},
        {LORA_DTYPE_I16, "I16", 2},   {LORA_DTYPE_I8, "I8", 1},   {LORA_DTYPE_U8, "U8", 1},
        {LORA_DTYPE_BOOL, "BOOL", 1},
    };

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        CHECK(strcmp(lora_dtype_name(want[i].dtype), want[i].name) == 0);
        CHECK(lora_dtype_size(want[i].dtype) == want[i].size);
    }
}

static void test_bf16_conversion(void)
{
    uint16_t nan_bits;
    unsigned char buf[5];
    float out[2];

    CHECK(lora_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(lora_f32_to_bf16(-2.0f) == 0xC000);
    CHECK(lora_f32_to_bf16(0.0f) == 0x0000);
    CHECK(lora_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(lora_f32_to_bf16(INFINITY) == 0x7F80);
    CHECK(lora_f32_to_bf16(-INFINITY) == 0xFF80);
    /* ties go to the even result; just above a tie rounds up */
    CHECK(lora_f32_to_bf16(float_of(0x3F808000)) == 0x3F80);
    CHECK(lora_f32_to_bf16(float_of(0x3F818000)) == 0x3F82);
    CHECK(lora_f32_to_bf16(float_of(0x3F808001)) == 0x3F81);
    CHECK(lora_f32_to_bf16(float_of(0x3F807FFF)) == 0x3F80);
    /* the largest float rounds up to infinity */
    CHECK(lora_f32_to_bf16(float_of(0x7F7FFFFF)) == 0x7F80);
    nan_bits = lora_f32_to_bf16(NAN);
    CHECK((nan_bits & 0x7F80) == 0x7F80 && (nan_bits & 0x7F) != 0);
    /* a NaN whose payload sits only in the dropped bits stays NaN */
    nan_bits = lora_f32_to_bf16(float_of(0x7F800001));
    CHECK((nan_bits & 0x7F80) == 0x7F80 && (nan_bits & 0x7F) != 0);

    /* every non-NaN bf16 value survives bf16 -> f32 -> bf16, and the widening is a shift */
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint16_t v = (uint16_t)h;
        float f;
        if ((h & 0x7F80) == 0x7F80 && (h & 0x7F))
            continue;
        CHECK(lora_dtype_to_f32(LORA_DTYPE_BF16, &v, &f, 1) == 0);
        if (bits_of(f) != h << 16 || lora_f32_to_bf16(f) != v) {
            CHECK(0);
            printf("# bf16 0x%04x failed\n", (unsigned)h);
            break;
        }
    }

    /* unaligned source */
    buf[0] = 0xAA;
    buf[1] = 0x80; /* 0x3F80 = 1.0, little-endian */
    buf[2] = 0x3F;
    buf[3] = 0x40; /* 0xC040 = -3.0 */
    buf[4] = 0xC0;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_BF16, buf + 1, out, 2) == 0);
    CHECK(out[0] == 1.0f && out[1] == -3.0f);
}

/* Half-precision reference from the compiler (libgcc's soft-float conversion). */
#ifdef __FLT16_MAX__
static uint16_t ref_f32_to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;

    memcpy(&u, &h, sizeof(u));
    return u;
}
#endif

static void test_f16_conversion(void)
{
    uint16_t h;
    float f;

    CHECK(lora_f32_to_f16(1.0f) == 0x3C00);
    CHECK(lora_f32_to_f16(-2.0f) == 0xC000);
    CHECK(lora_f32_to_f16(0.5f) == 0x3800);
    CHECK(lora_f32_to_f16(-0.0f) == 0x8000);
    CHECK(lora_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(lora_f32_to_f16(65519.0f) == 0x7BFF); /* below the tie at 65520 */
    CHECK(lora_f32_to_f16(65520.0f) == 0x7C00); /* the tie rounds to even: infinity */
    CHECK(lora_f32_to_f16(1e6f) == 0x7C00);
    CHECK(lora_f32_to_f16(-1e6f) == 0xFC00);
    CHECK(lora_f32_to_f16(INFINITY) == 0x7C00);
    /* subnormals: 1e-7 = 1.68 * 2^-24 rounds to 2 * 2^-24 */
    CHECK(lora_f32_to_f16(1e-7f) == 0x0002);
    CHECK(lora_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(lora_f32_to_f16(0x1p-25f) == 0x0000);        /* tie, to even */
    CHECK(lora_f32_to_f16(0x1.8p-25f) == 0x0001);      /* above the tie */
    CHECK(lora_f32_to_f16(0x1.8p-24f) == 0x0002);      /* 1.5 ulp: tie, to even */
    CHECK(lora_f32_to_f16(0x1p-14f) == 0x0400);        /* smallest normal */
    CHECK(lora_f32_to_f16(0x1.ffcp-15f) == 0x0400);    /* subnormal rounding up into normal */
    CHECK(lora_f32_to_f16(float_of(1)) == 0x0000);     /* f32 subnormal */
    CHECK(lora_f32_to_f16(1.0f + 0x1p-11f) == 0x3C00); /* tie, to even */
    CHECK(lora_f32_to_f16(1.0f + 0x1.8p-10f) == 0x3C02);
    h = lora_f32_to_f16(NAN);
    CHECK((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0);
    h = lora_f32_to_f16(float_of(0x7F800001)); /* payload only in the dropped bits */
    CHECK((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0);

    /* widening: known values */
    h = 0x0001;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && f == 0x1p-24f);
    h = 0x3555;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && f == 0x1.554p-2f);
    h = 0x7BFF;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && f == 65504.0f);
    h = 0xFC00;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && isinf(f) && f < 0);
    h = 0x7E00;
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && isnan(f));
    h = 0x83FF; /* largest negative subnormal */
    CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &h, &f, 1) == 0 && f == -0x3FFp-24f);

    /* every non-NaN f16 value survives f16 -> f32 -> f16 */
    for (uint32_t u = 0; u < 0x10000; u++) {
        uint16_t v = (uint16_t)u;
        if ((u & 0x7C00) == 0x7C00 && (u & 0x3FF))
            continue;
        CHECK(lora_dtype_to_f32(LORA_DTYPE_F16, &v, &f, 1) == 0);
        if (lora_f32_to_f16(f) != v) {
            CHECK(0);
            printf("# f16 0x%04x failed\n", (unsigned)u);
            break;
        }
    }

#ifdef __FLT16_MAX__
    /* narrowing against the compiler across a spread of float bit patterns */
    uint32_t x = 0x12345678u;
    for (int i = 0; i < 200000; i++) {
        float v;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        /* keep exponents near the f16 range so rounding paths get exercised */
        v = float_of((x & 0x807FFFFFu) | ((uint32_t)(96 + x % 64) << 23));
        if (lora_f32_to_f16(v) != ref_f32_to_f16(v)) {
            CHECK(0);
            printf("# f16 of 0x%08" PRIx32 ": 0x%04x, reference 0x%04x\n", bits_of(v),
                   lora_f32_to_f16(v), ref_f32_to_f16(v));
            break;
        }
    }
#endif
    CHECK(lora_dtype_to_f32(LORA_DTYPE_I32, &h, &f, 1) == -1);
}

static float test_value(int t, int64_t i)
{
    return (float)((i * 37 + t * 11) % 101 - 50) * 0.0371f + (float)t;
}

static void test_round_trip(void)
{
    static const struct lora_tensor_out shapes[] = {
        {"model.embed_tokens.weight", LORA_DTYPE_F32, 2, {4, 8}, NULL},
        {"a.f16", LORA_DTYPE_F16, 1, {100}, NULL},
        {"b.bf16", LORA_DTYPE_BF16, 3, {2, 3, 5}, NULL},
        {"empty", LORA_DTYPE_F32, 2, {0, 7}, NULL},
        {"scalar", LORA_DTYPE_BF16, 0, {0}, NULL},
        {"special.f16", LORA_DTYPE_F16, 1, {6}, NULL},
        {"special.bf16", LORA_DTYPE_BF16, 1, {3}, NULL},
    };
    enum { N = sizeof(shapes) / sizeof(shapes[0]) };
    static const float special_f16[6] = {1.0f, 65504.0f, 1e-7f, 1e6f, -2.0f, 0.0f};
    static const uint16_t special_f16_bits[6] = {0x3C00, 0x7BFF, 0x0002, 0x7C00, 0xC000, 0};
    static const float special_bf16[3] = {1.0f, 0x1.01p0f, 0x1.03p0f}; /* two ties */
    static const uint16_t special_bf16_bits[3] = {0x3F80, 0x3F80, 0x3F82};
    struct lora_tensor_out t[N];
    float *data[N] = {0};
    char path[PATH_BYTES], err[512];
    struct lora_safetensors *st;

    tmp_path(path, "round.safetensors");
    memcpy(t, shapes, sizeof(t));
    for (int k = 0; k < N; k++) {
        int64_t numel = 1;
        for (int d = 0; d < t[k].n_dims; d++)
            numel *= t[k].shape[d];
        data[k] = malloc((size_t)(numel ? numel : 1) * sizeof(float));
        for (int64_t i = 0; i < numel; i++)
            data[k][i] = test_value(k, i);
        t[k].data = data[k];
    }
    t[5].data = special_f16;
    t[6].data = special_bf16;

    CHECK(lora_safetensors_write(path, t, N, err, sizeof(err)) == 0);
    CHECK(access(tmp_path(err, "round.safetensors.tmp"), F_OK) != 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(st != NULL);
    if (!st) {
        printf("# %s\n", err);
        goto out;
    }
    CHECK(st->n_tensors == N);
    CHECK(lora_safetensors_find(st, "missing") == NULL);
    for (int k = 0; k < N && k < st->n_tensors; k++) {
        const struct lora_tensor_info *ti = &st->tensors[k];
        float *got;

        CHECK(strcmp(ti->name, t[k].name) == 0); /* header order is write order */
        CHECK(lora_safetensors_find(st, t[k].name) == ti);
        CHECK(ti->dtype == t[k].dtype);
        CHECK(ti->n_dims == t[k].n_dims);
        for (int d = 0; d < ti->n_dims; d++)
            CHECK(ti->shape[d] == t[k].shape[d]);
        CHECK(ti->bytes == (size_t)ti->numel * lora_dtype_size(ti->dtype));
        got = malloc((size_t)(ti->numel ? ti->numel : 1) * sizeof(float));
        CHECK(lora_dtype_to_f32(ti->dtype, ti->data, got, (size_t)ti->numel) == 0);
        for (int64_t i = 0; i < ti->numel; i++) {
            float want = t[k].data[i];
            uint16_t raw;
            /* expected: the value rounded to the dtype, widened back (checked above) */
            if (ti->dtype == LORA_DTYPE_F16) {
                raw = lora_f32_to_f16(t[k].data[i]);
                lora_dtype_to_f32(LORA_DTYPE_F16, &raw, &want, 1);
            } else if (ti->dtype == LORA_DTYPE_BF16) {
                want = float_of((uint32_t)lora_f32_to_bf16(t[k].data[i]) << 16);
            }
            if (bits_of(got[i]) != bits_of(want)) {
                CHECK(0);
                printf("# %s[%" PRId64 "] = %.9g, want %.9g\n", ti->name, i, got[i], want);
                break;
            }
        }
        free(got);
    }
    CHECK(st->tensors[0].numel == 32);
    CHECK(st->tensors[3].numel == 0 && st->tensors[3].bytes == 0);
    CHECK(st->tensors[4].numel == 1 && st->tensors[4].n_dims == 0);
    for (int i = 0; i < 6; i++) {
        uint16_t raw;
        memcpy(&raw, (const unsigned char *)st->tensors[5].data + 2 * i, 2);
        CHECK(raw == special_f16_bits[i]);
    }
    for (int i = 0; i < 3; i++) {
        uint16_t raw;
        memcpy(&raw, (const unsigned char *)st->tensors[6].data + 2 * i, 2);
        CHECK(raw == special_bf16_bits[i]);
    }
    lora_safetensors_close(&st);
    CHECK(st == NULL);
    lora_safetensors_close(&st);
    lora_safetensors_close(NULL);
out:
    for (int k = 0; k < N; k++)
        free(data[k]);
}

/* A write large enough to cross several conversion chunks. */
static void test_round_trip_large(void)
{
    enum { NUMEL = 200003 };
    float *data = malloc(NUMEL * sizeof(float));
    struct lora_tensor_out t = {"big", LORA_DTYPE_F16, 2, {NUMEL, 1}, data};
    char path[PATH_BYTES], err[512];
    struct lora_safetensors *st;
    const unsigned char *p;
    int bad = 0;

    for (int i = 0; i < NUMEL; i++)
        data[i] = (float)(i % 2048) - 1024.0f; /* exact in f16 */
    tmp_path(path, "big.safetensors");
    CHECK(lora_safetensors_write(path, &t, 1, err, sizeof(err)) == 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(st != NULL);
    if (st) {
        p = st->tensors[0].data;
        for (int i = 0; i < NUMEL && !bad; i++) {
            float f;
            lora_dtype_to_f32(LORA_DTYPE_F16, p + 2 * (size_t)i, &f, 1);
            bad = f != data[i];
        }
        CHECK(!bad);
    }
    lora_safetensors_close(&st);
    free(data);
}

static void test_header_padding(void)
{
    char path[PATH_BYTES], err[512];
    float v[3] = {1, 2, 3};
    /* names of several lengths so the raw JSON length varies through all residues mod 8 */
    static const char *names[8] = {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "x8"};

    tmp_path(path, "pad.safetensors");
    for (int k = 0; k < 8; k++) {
        struct lora_tensor_out t = {names[k], LORA_DTYPE_F32, 1, {3}, v};
        unsigned char *buf;
        uint64_t header_len = 0;
        json_t *root, *meta;
        json_error_t jerr;
        FILE *f;
        long size;

        CHECK(lora_safetensors_write(path, &t, 1, err, sizeof(err)) == 0);
        f = fopen(path, "rb");
        CHECK(f != NULL);
        if (!f)
            return;
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        rewind(f);
        buf = malloc((size_t)size);
        CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size);
        fclose(f);
        for (int i = 7; i >= 0; i--)
            header_len = header_len << 8 | buf[i];
        CHECK(header_len % 8 == 0);
        CHECK((uint64_t)size == 8 + header_len + sizeof(v));
        CHECK(buf[8 + header_len - 1] == ' ' || buf[8 + header_len - 1] == '}');
        CHECK(memcmp(buf + 8 + header_len, v, sizeof(v)) == 0);
        root = json_loadb((const char *)buf + 8, (size_t)header_len, 0, &jerr);
        CHECK(json_is_object(root));
        meta = json_object_get(root, "__metadata__");
        CHECK(json_is_object(meta));
        CHECK(json_is_string(json_object_get(meta, "format")) &&
              strcmp(json_string_value(json_object_get(meta, "format")), "pt") == 0);
        CHECK(json_is_object(json_object_get(root, names[k])));
        json_decref(root);
        free(buf);
    }
}

static void test_valid_edge_cases(void)
{
    char path[PATH_BYTES], err[512];
    struct lora_safetensors *st;
    const struct lora_tensor_info *ti;

    tmp_path(path, "edge.safetensors");
    /* zero tensors */
    CHECK(write_raw(path, "{}", 0) == 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(st != NULL && st->n_tensors == 0);
    lora_safetensors_close(&st);
    CHECK(lora_safetensors_write(path, NULL, 0, err, sizeof(err)) == 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(st != NULL && st->n_tensors == 0);
    lora_safetensors_close(&st);

    /* metadata only, trailing padding, empty tensors anywhere, other dtypes, spare data */
    CHECK(write_raw(path,
                    "{\"__metadata__\":{\"k\":\"v\"},\"e\":{\"dtype\":\"F32\",\"shape\":[0],"
                    "\"data_offsets\":[2,2]},\"i\":{\"dtype\":\"I16\",\"shape\":[2],"
                    "\"data_offsets\":[0,4]},\"e2\":{\"dtype\":\"BOOL\",\"shape\":[3,0],"
                    "\"data_offsets\":[4,4]},\"d\":{\"dtype\":\"F64\",\"shape\":[],"
                    "\"data_offsets\":[4,12]}}   ",
                    16) == 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(st != NULL);
    if (!st) {
        printf("# %s\n", err);
        return;
    }
    CHECK(st->n_tensors == 4);
    ti = lora_safetensors_find(st, "i");
    CHECK(ti && ti->dtype == LORA_DTYPE_I16 && ti->bytes == 4 && ti->numel == 2);
    ti = lora_safetensors_find(st, "d");
    CHECK(ti && ti->dtype == LORA_DTYPE_F64 && ti->n_dims == 0 && ti->numel == 1);
    ti = lora_safetensors_find(st, "e2");
    CHECK(ti && ti->numel == 0 && ti->bytes == 0);
    CHECK(lora_safetensors_find(st, "__metadata__") == NULL);
    lora_safetensors_close(&st);
}

static void test_bad_framing(void)
{
    char path[PATH_BYTES], dir[PATH_BYTES];

    tmp_path(path, "short.safetensors");
    CHECK(write_bytes(path, "\x05\0\0\0", 4) == 0);
    open_fails_with(path, "shorter than", NULL);
    CHECK(write_bytes(path, "", 0) == 0);
    open_fails_with(path, "shorter than", NULL);

    tmp_path(path, "zero.safetensors");
    CHECK(write_raw_len(path, 0, "{}", 0) == 0);
    open_fails_with(path, "header length is 0", NULL);

    tmp_path(path, "huge.safetensors");
    CHECK(write_raw_len(path, LORA_SAFETENSORS_MAX_HEADER + 1ull, "{}", 0) == 0);
    open_fails_with(path, "exceeds the limit", NULL);
    CHECK(write_raw_len(path, UINT64_MAX, "{}", 0) == 0);
    open_fails_with(path, "exceeds the limit", NULL);

    tmp_path(path, "past.safetensors");
    CHECK(write_raw_len(path, 3, "{}", 0) == 0);
    open_fails_with(path, "truncated", NULL);

    tmp_path(path, "missing.safetensors");
    open_fails_with(path, "unable to open", NULL);
    tmp_path(dir, "adir");
    CHECK(mkdir(dir, 0700) == 0);
    open_fails_with(dir, "not a regular file", NULL);
    rmdir(dir);

    expect_bad("{\"a\":", 0, "invalid JSON", NULL);
    expect_bad("[1, 2]", 0, "not a JSON object", NULL);
    expect_bad("\"str\"", 0, "not a JSON object", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "invalid JSON", "duplicate");
    expect_bad("{\"__metadata__\":[1]}", 0, "\"__metadata__\" is not an object", NULL);
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "is not a string", "'k'");
}

/* A FIFO, a socket or a directory in the file's place fails at once (a FIFO opened for reading
 * would block until a writer came). */
static void test_special_files(void)
{
    char path[PATH_BYTES];

    tmp_path(path, "fifo.safetensors");
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0);
    open_fails_with(path, "not a regular file (a FIFO)", NULL);
    unlink(path);
    tmp_path(path, "sock.safetensors");
    unlink(path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", path);
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0);
    open_fails_with(path, "not a regular file (a socket)", NULL);
    close(s);
    unlink(path);
}

/* Errors about what a file holds give positions, never its bytes: a file that is no
 * safetensors file (a secret read by mistake) must not show up in a log. */
static void test_errors_never_quote(void)
{
    char path[PATH_BYTES], err[512], num[32];
    const char *secret = "TOPSECRET-4711 and the rest of the secret";
    uint64_t len = 0;

    for (int i = 7; i >= 0; i--)
        len = len << 8 | (unsigned char)secret[i];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)len);
    tmp_path(path, "secret.safetensors");
    CHECK(write_bytes(path, secret, strlen(secret)) == 0);
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(!st);
    CHECK_CONTAINS(err, "not a safetensors file");
    CHECK(!strstr(err, "TOPSECRET") && !strstr(err, num));
    /* A header length that fits, then text that is no JSON: the byte where it breaks. */
    CHECK(write_raw_len(path, 14, "{\"a\": SECRET9}", 0) == 0);
    st = lora_safetensors_open(path, err, sizeof(err));
    CHECK(!st);
    CHECK_CONTAINS(err, "invalid JSON header at byte 20"); /* where jansson stopped reading */
    CHECK(!strstr(err, "SECRET9"));
    printf("# %s\n", err);
    CHECK(write_raw_len(path, 20, "{\"SECRET8\": 1, \"SECRET8\": 2}", 0) == 0);
    CHECK(!lora_safetensors_open(path, err, sizeof(err)));
    CHECK(!strstr(err, "SECRET8"));
}

static void test_bad_entries(void)
{
    expect_bad("{\"w\":[1]}", 0, "tensor 'w'", "entry is not an object");
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "missing \"dtype\"");
    expect_bad("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "\"dtype\" is not a string");
    expect_bad("{\"w\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "unknown dtype (not F32");
    expect_bad("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "unknown dtype");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "missing \"shape\"");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "\"shape\" is not an array");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
               "tensor 'w'", "9 dims");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w'", "negative");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w'", "not an integer");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w'", "not an integer");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "tensor 'w'", "overflows");
    /* numel fits but numel * 8 bytes does not */
    expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
               "\"data_offsets\":[0,4]}}",
               4, "tensor 'w'", "overflows the byte count");
}

static void test_bad_offsets(void)
{
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w'",
               "missing \"data_offsets\"");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "tensor 'w'",
               "not an array of two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               "tensor 'w'", "not an array of two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4,
               "tensor 'w'", "not an array of two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"a\":0}}}", 4,
               "tensor 'w'", "not an array of two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "tensor 'w'",
               "negative");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "tensor 'w'",
               "begin after");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, "tensor 'w'",
               "truncated");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,"
               "9223372036854775807]}}",
               4, "tensor 'w'", "truncated");
    expect_bad("{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],"
               "\"data_offsets\":[0,100]}}",
               128,
               "tensor 'model.embed_tokens.weight': size mismatch: data_offsets [0, 100] hold "
               "100 bytes but shape [4, 8] of F32 needs 128",
               NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
               20, "tensor 'b'", "overlap tensor 'a'");
    /* the same overlap listed the other way round, and a tensor inside another */
    expect_bad("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
               20, "overlap", "'a'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
               "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               32, "tensor 'b'", "overlap tensor 'a'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "overlap", "'a'");
}

static void test_write_errors(void)
{
    char path[PATH_BYTES], mpath[PATH_BYTES], err[512];
    struct rlimit old_lim;
    float v[4] = {0};
    struct lora_tensor_out t[2] = {
        {"a", LORA_DTYPE_F32, 1, {4}, v},
        {"b", LORA_DTYPE_F32, 1, {4}, v},
    };

    tmp_path(path, "w.safetensors");
    t[1].dtype = LORA_DTYPE_I32;
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, "tensor 'b': cannot write dtype I32");
    t[1].dtype = LORA_DTYPE_F16;
    t[1].shape[0] = -1;
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "negative");
    t[1].shape[0] = 4;
    t[1].n_dims = LORA_SAFETENSORS_MAX_DIMS + 1;
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "dims");
    t[1].n_dims = 1;
    t[1].name = NULL;
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no name");
    t[1].name = "a";
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "used twice");
    t[1].name = "__metadata__";
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "reserved");
    t[1].name = "b";
    t[1].data = NULL;
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "no data");
    t[1].data = v;
    CHECK(lora_safetensors_write(path, t, -1, err, sizeof(err)) == -1);
    CHECK(access(path, F_OK) != 0); /* nothing written on a validation error */

    tmp_path(path, "no-such-dir/w.safetensors");
    CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, "unable to create");

    /* a write that fails part way (file size limit, EFBIG): reported, no file left behind */
    tmp_path(path, "limited.safetensors");
    if (getrlimit(RLIMIT_FSIZE, &old_lim) == 0) {
        struct rlimit lim = old_lim;
        void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
        lim.rlim_cur = 16;
        CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
        CHECK(lora_safetensors_write(path, t, 2, err, sizeof(err)) == -1);
        setrlimit(RLIMIT_FSIZE, &old_lim);
        signal(SIGXFSZ, old_handler);
        CHECK_CONTAINS(err, path);
        CHECK_CONTAINS(err, "unable to write: ");
        CHECK(access(path, F_OK) != 0);
        CHECK(access(tmp_path(mpath, "limited.safetensors.tmp"), F_OK) != 0);
    }
    /* a NULL or tiny error buffer is fine */
    t[1].dtype = LORA_DTYPE_U8;
    tmp_path(path, "w.safetensors");
    CHECK(lora_safetensors_write(path, t, 2, NULL, 0) == -1);
    CHECK(lora_safetensors_write(path, t, 2, err, 4) == -1 && strlen(err) == 3);
    CHECK(lora_safetensors_open(path, NULL, 0) == NULL);
}

/* xorshift64*: a fixed-seed generator so that failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

/* Mutates a valid file ~2000 times; every open must succeed with its data inside the mapping
 * or fail with a message. ASan and UBSan catch what a CHECK cannot. */
static void test_mutations(void)
{
    float v[12];
    struct lora_tensor_out t[4] = {
        {"layers.0.q.weight", LORA_DTYPE_F32, 2, {2, 3}, v},
        {"layers.0.k.weight", LORA_DTYPE_BF16, 1, {4}, v},
        {"empty", LORA_DTYPE_F16, 2, {3, 0}, v},
        {"layers.0.v.weight", LORA_DTYPE_F16, 3, {1, 2, 1}, v},
    };
    char path[PATH_BYTES], mpath[PATH_BYTES], err[512];
    unsigned char *orig = NULL, *buf = NULL;
    size_t size, header_end;
    int n_ok = 0, n_fail = 0;
    FILE *f;

    for (int i = 0; i < 12; i++)
        v[i] = (float)i - 5.5f;
    tmp_path(path, "seed.safetensors");
    tmp_path(mpath, "mut.safetensors");
    CHECK(lora_safetensors_write(path, t, 4, err, sizeof(err)) == 0);
    f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    size = (size_t)ftell(f);
    rewind(f);
    orig = malloc(size);
    buf = malloc(size);
    CHECK(fread(orig, 1, size, f) == size);
    fclose(f);
    header_end = 8 + (size_t)orig[0] + ((size_t)orig[1] << 8);

    for (int iter = 0; iter < 2000; iter++) {
        size_t len = size;
        int kind = (int)(rng() % 4);
        struct lora_safetensors *st;

        memcpy(buf, orig, size);
        if (kind == 0) {
            len = (size_t)(rng() % size);
        } else if (kind == 1) {
            int n = 1 + (int)(rng() % 4);
            for (int k = 0; k < n; k++)
                buf[rng() % header_end] = (unsigned char)rng();
        } else if (kind == 2) {
            /* replace a digit with another (or a sign), shifting sizes and offsets */
            for (int tries = 0; tries < 64; tries++) {
                size_t at = 8 + (size_t)(rng() % (header_end - 8));
                if (buf[at] >= '0' && buf[at] <= '9') {
                    buf[at] = (unsigned char)("0123456789-"[rng() % 11]);
                    break;
                }
            }
        } else {
            /* the length prefix itself */
            buf[rng() % 8] ^= (unsigned char)(1u << (rng() % 8));
        }
        CHECK(write_bytes(mpath, buf, len) == 0);
        err[0] = '\0';
        st = lora_safetensors_open(mpath, err, sizeof(err));
        if (st) {
            const unsigned char *lo = st->map, *hi = lo + st->map_bytes;
            n_ok++;
            for (int k = 0; k < st->n_tensors; k++) {
                const struct lora_tensor_info *ti = &st->tensors[k];
                const unsigned char *p = ti->data;
                CHECK(p >= lo && p <= hi && ti->bytes <= (size_t)(hi - p));
                CHECK(ti->bytes == (size_t)ti->numel * lora_dtype_size(ti->dtype));
            }
            lora_safetensors_close(&st);
        } else {
            n_fail++;
            CHECK(err[0] != '\0');
            CHECK_CONTAINS(err, mpath);
        }
    }
    printf("# mutations: %d opened, %d rejected\n", n_ok, n_fail);
    CHECK(n_ok > 0 && n_fail > 0);
    free(orig);
    free(buf);
}

int main(void)
{
    if (fx_init("/tmp/lora-test-safetensors-XXXXXX", &check_cur_failed) < 0)
        return 1;
    RUN(test_dtype_names_sizes);
    RUN(test_bf16_conversion);
    RUN(test_f16_conversion);
    RUN(test_round_trip);
    RUN(test_round_trip_large);
    RUN(test_header_padding);
    RUN(test_valid_edge_cases);
    RUN(test_bad_framing);
    RUN(test_special_files);
    RUN(test_errors_never_quote);
    RUN(test_bad_entries);
    RUN(test_bad_offsets);
    RUN(test_write_errors);
    RUN(test_mutations);
    fx_cleanup();
    return check_done();
}
