/* dtype: the element types of backend/backend.h: sizes, names, conversions between float and
 * the 16-bit types, the byte layout of a tensor of each compute type, and the int8 quantizer
 * that writes the I8 layout.
 *
 * Owns the one table of dtypes that safetensors parses with and every backend sizes its tensors
 * with, so the file format and the compute side can never disagree on an element's size
 * (docs/design.md, "Backend").
 */
#include "backend/backend.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [LORA_DTYPE_F32] = {"F32", 4},   [LORA_DTYPE_F16] = {"F16", 2}, [LORA_DTYPE_BF16] = {"BF16", 2},
    [LORA_DTYPE_F64] = {"F64", 8},   [LORA_DTYPE_I64] = {"I64", 8}, [LORA_DTYPE_I32] = {"I32", 4},
    [LORA_DTYPE_I16] = {"I16", 2},   [LORA_DTYPE_I8] = {"I8", 1},   [LORA_DTYPE_U8] = {"U8", 1},
    [LORA_DTYPE_BOOL] = {"BOOL", 1},
};

#define N_DTYPES ((int)(sizeof(dtype_table) / sizeof(dtype_table[0])))

static bool dtype_is_valid(enum lora_dtype dtype)
{
    return (int)dtype >= 0 && (int)dtype < N_DTYPES;
}

size_t lora_dtype_size(enum lora_dtype dtype)
{
    return dtype_is_valid(dtype) ? dtype_table[dtype].size : 0;
}

const char *lora_dtype_name(enum lora_dtype dtype)
{
    return dtype_is_valid(dtype) ? dtype_table[dtype].name : "?";
}

int lora_dtype_parse(const char *s, enum lora_dtype *dtype)
{
    for (int i = 0; i < N_DTYPES; i++) {
        if (strcmp(s, dtype_table[i].name) == 0) {
            *dtype = (enum lora_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- element conversion ---- */

static float f32_from_bits(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;

    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float mag = (float)mant * 0x1p-24f;
        return sign ? -mag : mag;
    }
    if (exp == 31) /* infinity or NaN, payload kept */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t lora_f32_to_bf16(float f)
{
    uint32_t u = f32_to_bits(f);

    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040);
    /* round to nearest even on the 16 dropped bits; a carry into the exponent is correct,
     * including the one that turns the largest finite values into infinity */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Shifts m right by shift (1..31) with round-to-nearest-even. */
static uint32_t shift_round_even(uint32_t m, int shift)
{
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);

    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

uint16_t lora_f32_to_f16(float f)
{
    uint32_t u = f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    int exp = (int)((u >> 23) & 0xff);
    uint32_t mant = u & 0x7fffff;
    int e = exp - 127 + 15; /* f16 biased exponent */

    if (exp == 0xff) /* infinity, or NaN kept quiet and non-zero */
        return sign | 0x7c00 | (mant ? 0x200 | (uint16_t)(mant >> 13) : 0);
    if (e >= 31)
        return sign | 0x7c00;
    if (e <= 0) {
        /* f16 subnormal: value = h * 2^-24 = (mant | 2^23) * 2^(e - 14) */
        int shift = 14 - e;
        if (shift > 24) /* below half the smallest subnormal (f32 subnormals included) */
            return sign;
        /* a carry to 0x400 is the smallest normal, encoded correctly */
        return sign | (uint16_t)shift_round_even(mant | 0x800000u, shift);
    }
    /* normal: a carry out of the mantissa bumps the exponent, up to infinity at 0x7c00 */
    return sign | (uint16_t)shift_round_even(((uint32_t)e << 23) | mant, 13);
}

int lora_dtype_to_f32(enum lora_dtype dtype, const void *src, float *dst, size_t n)
{
    const unsigned char *p = src;
    uint16_t h;

    switch (dtype) {
    case LORA_DTYPE_F32:
        if (n)
            memcpy(dst, src, n * sizeof(float));
        return 0;
    case LORA_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, sizeof(h));
            dst[i] = bf16_to_f32(h);
        }
        return 0;
    case LORA_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, sizeof(h));
            dst[i] = f16_to_f32(h);
        }
        return 0;
    default:
        return -1;
    }
}

int lora_dtype_convert(enum lora_dtype from, const void *src, enum lora_dtype to, void *dst,
                       size_t n)
{
    const unsigned char *p = src;
    unsigned char *q = dst;
    float chunk[256];

    if (from == to && lora_dtype_size(from)) {
        if (n)
            memcpy(dst, src, n * lora_dtype_size(from));
        return 0;
    }
    if (to == LORA_DTYPE_F32)
        return lora_dtype_to_f32(from, src, dst, n);
    if (to != LORA_DTYPE_BF16 && to != LORA_DTYPE_F16)
        return -1;
    /* Through float32, which holds every F16 and BF16 value exactly: one rounding. */
    for (size_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? n - i : 256;
        if (lora_dtype_to_f32(from, p + i * lora_dtype_size(from), chunk, k) < 0)
            return -1;
        for (size_t j = 0; j < k; j++) {
            uint16_t h = to == LORA_DTYPE_BF16 ? lora_f32_to_bf16(chunk[j])
                                               : lora_f32_to_f16(chunk[j]);
            memcpy(q + 2 * (i + j), &h, sizeof(h));
        }
    }
    return 0;
}

bool lora_dtype_is_compute(enum lora_dtype dtype)
{
    return dtype == LORA_DTYPE_F32 || dtype == LORA_DTYPE_BF16 || dtype == LORA_DTYPE_F16 ||
           dtype == LORA_DTYPE_I8;
}

/* ---- tensors of the compute types ---- */

size_t lora_tensor_bytes(enum lora_dtype dtype, int64_t rows, int64_t cols)
{
    if (dtype != LORA_DTYPE_I8)
        return (size_t)rows * (size_t)cols * lora_dtype_size(dtype);
    return (size_t)rows *
           ((size_t)lora_i8_row_bytes(cols) + (size_t)lora_i8_groups(cols) * sizeof(float));
}

int lora_tensor_row_to_f32(enum lora_dtype dtype, const void *data, int64_t rows, int64_t cols,
                           int64_t row, float *dst)
{
    const char *p = data;

    if (!lora_dtype_is_compute(dtype))
        return -1;
    if (dtype != LORA_DTYPE_I8)
        return lora_dtype_to_f32(dtype, p + (size_t)row * (size_t)cols * lora_dtype_size(dtype),
                                 dst, (size_t)cols);
    int64_t n_groups = lora_i8_groups(cols), row_bytes = lora_i8_row_bytes(cols);
    const char *scales = p + (size_t)(rows * row_bytes) + (size_t)(row * n_groups) * sizeof(float);
    const signed char *q = (const signed char *)p + (size_t)(row * row_bytes);
    for (int64_t c = 0; c < cols; c++) {
        float scale;
        memcpy(&scale, scales + (c / LORA_I8_GROUP) * sizeof(float), sizeof(scale));
        dst[c] = (float)q[lora_i8_offset(cols, c)] * scale;
    }
    return 0;
}

/* Element i of src (F32, BF16 or F16) as float. */
static float elem_f32(enum lora_dtype dtype, const unsigned char *src, size_t i)
{
    uint16_t h;
    float f;

    if (dtype == LORA_DTYPE_F32) {
        memcpy(&f, src + 4 * i, sizeof(f));
        return f;
    }
    memcpy(&h, src + 2 * i, sizeof(h));
    return dtype == LORA_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* One row: q (lora_i8_row_bytes(cols), in the layout's order) and its scales. Returns -1 on a
 * value that is not finite. */
static int quantize_row(enum lora_dtype dtype, const unsigned char *src, int64_t cols,
                        signed char *q, char *scales)
{
    memset(q, 0, (size_t)lora_i8_row_bytes(cols)); /* the last group's padding */
    for (int64_t g0 = 0; g0 < cols; g0 += LORA_I8_GROUP) {
        int64_t g1 = g0 + LORA_I8_GROUP < cols ? g0 + LORA_I8_GROUP : cols;
        float max = 0;
        for (int64_t c = g0; c < g1; c++) {
            float v = fabsf(elem_f32(dtype, src, (size_t)c));
            if (!(v <= FLT_MAX))
                return -1;
            max = v > max ? v : max;
        }
        /* The same float operations as the matmul's activations (matmul_i8_cpu.c), so that a
         * row quantized here and there gives the same bytes. */
        float scale = max / 127.0f;
        for (int64_t c = g0; c < g1; c++) {
            float r = scale > 0 ? nearbyintf(elem_f32(dtype, src, (size_t)c) / scale) : 0.0f;
            q[lora_i8_offset(cols, c)] = (signed char)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
        memcpy(scales + (g0 / LORA_I8_GROUP) * sizeof(float), &scale, sizeof(scale));
    }
    return 0;
}

int lora_quantize_i8(enum lora_dtype src_dtype, const void *src, int64_t rows, int64_t cols,
                     void *dst)
{
    if ((src_dtype != LORA_DTYPE_F32 && src_dtype != LORA_DTYPE_BF16 &&
         src_dtype != LORA_DTYPE_F16) ||
        rows < 0 || cols < 0)
        return -1;
    size_t esize = lora_dtype_size(src_dtype);
    size_t n_groups = (size_t)lora_i8_groups(cols), row_bytes = (size_t)lora_i8_row_bytes(cols);
    char *scales = (char *)dst + (size_t)rows * row_bytes;
    int bad = 0;

    /* Rows are independent: threads take them in chunks (a model's largest tensor is a few
     * hundred megabytes, quantized once when it loads). */
#pragma omp parallel for schedule(dynamic, 64) reduction(| : bad) if (rows * cols > 1 << 20)
    for (int64_t r = 0; r < rows; r++)
        bad |=
            quantize_row(src_dtype, (const unsigned char *)src + (size_t)r * (size_t)cols * esize,
                         cols, (signed char *)dst + (size_t)r * row_bytes,
                         scales + (size_t)r * n_groups * sizeof(float)) < 0;
    return bad ? -1 : 0;
}
