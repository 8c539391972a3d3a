/* matmul_amx_cpu: the fast BF16 matmul on AMX tiles (y = alpha · x · wᵀ (+ y), x rounded to
 * bf16), for machines with AMX-BF16 and weights whose n and k are multiples of 32.
 *
 * The product is taken transposed, yᵀ = w · xᵀ, so that the weights are the tiles' A operand
 * read where they lie: 16 rows of w, 32 values of each, are one tile load at w's own row stride,
 * with no packing and no copy of a mapped checkpoint. xᵀ is the B operand, which AMX wants as
 * pairs: row r of a B tile holds, for each of 16 rows of x, its values 2r and 2r + 1. Staging
 * writes x in that layout once per call, 16 rows to a block (docs/design.md, "AMX").
 *
 * Batch invariance: an output (n, i) is one column of a C tile, accumulated over k in 32-value
 * steps in a fixed order, whatever else shares its tile; a row of x never changes another
 * column. Padding rows of a block are zero and their outputs are dropped.
 */
#include "backend/cpu/kernels_cpu.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

#define AHEAD               64 /* values of a row of w fetched ahead */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

/* The tile configuration: tiles 0-3 accumulate (2 blocks of w by 2 blocks of x), 4-5 hold w,
 * 6-7 hold x; every tile is 16 rows of 64 bytes. */
struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

bool lora_cpu_amx_available(void)
{
    unsigned a, b, c, d;

    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) /* AMX-BF16, AMX-TILE */
        return false;
    /* Linux hands out the tile state only to a process that asks for it. */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Where the staged block holding row i of x starts: 16 rows of k bf16 values to a block. */
static size_t block_offset(int i, int k)
{
    return (size_t)(i / 16) * 16 * (size_t)k * sizeof(uint16_t);
}

/* Row i of x (k values, k even) into its block of the staging: block i / 16 is k / 2 rows of
 * 64 bytes, row r holding each of the block's 16 rows' pair (2r, 2r + 1). Rounding to nearest
 * even, NaN kept quiet, as lora_f32_to_bf16. */
TAMX void lora_cpu_amx_stage_row(const float *x, int k, int i, char *stage)
{
    uint32_t *block = (uint32_t *)(stage + block_offset(i, k));
    int col = i % 16;

    for (int c = 0; c < k; c += 32) {
        __m512 lo = _mm512_loadu_ps(x + c), hi = _mm512_loadu_ps(x + c + 16);
        __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* values c .. c + 31 in order */
        uint32_t p[16];
        _mm512_storeu_si512(p, pairs);
        for (int r = 0; r < 16; r++)
            block[(size_t)(c / 2 + r) * 16 + (size_t)col] = p[r];
    }
}

/* Zeros in the rows m % 16 .. 15 of the last block (m % 16 != 0): one masked store per row of
 * the block, which leaves the columns of x's rows, staged alongside, as they are. Padding a
 * single row of x this way instead of as 15 rows of zeros took 13% of the matmul's time at one
 * row (docs/design.md, "AMX"). */
TAMX void lora_cpu_amx_stage_padding(int m, int k, char *stage)
{
    char *block = stage + block_offset(m, k);
    __mmask16 pad = (__mmask16)(0xffffu << (m % 16));

    for (int r = 0; r < k / 2; r++)
        _mm512_mask_storeu_epi32(block + (size_t)r * 64, pad, _mm512_setzero_si512());
}

/* Outputs (n0 .. n0 + 31) x (rows i0 .. i0 + 15 or + 31) of yᵀ from tiles 0-3, their rows of x
 * below m. */
TAMX static void store_block(float *y, int ldy, int n0, int i0, int m, int blocks_x, float alpha,
                             bool acc)
{
    float c[4][16][16];

    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    if (blocks_x > 1) {
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
    }
    for (int t = 0; t < 2 * blocks_x; t++) {
        int nb = n0 + 16 * (t % 2), ib = i0 + 16 * (t / 2);
        for (int i = 0; i < 16 && ib + i < m; i++) { /* row i of y: column i of the tile */
            float *out = y + (size_t)(ib + i) * (size_t)ldy + nb, v[16];
            for (int j = 0; j < 16; j++)
                v[j] = alpha * c[t][j][i];
            if (acc)
                for (int j = 0; j < 16; j++)
                    out[j] += v[j];
            else
                memcpy(out, v, sizeof(v));
        }
    }
}

TAMX void lora_cpu_amx_panel(float *y, int ldy, const char *stage, const uint16_t *w, int m, int k,
                             int n0, int n1, float alpha, bool acc)
{
    struct tile_config cfg = {.palette = 1};
    size_t w_stride = (size_t)k * sizeof(uint16_t), block_bytes = block_offset(16, k);

    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    for (int n = n0; n < n1; n += 32) {
        const uint16_t *w0 = w + (size_t)n * (size_t)k, *w1 = w0 + (size_t)16 * (size_t)k;
        for (int i0 = 0; i0 < m; i0 += 32) {
            const char *b0 = stage + block_offset(i0, k), *b1 = b0 + block_bytes;
            int blocks_x = m - i0 > 16 ? 2 : 1;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kk = 0; kk < k; kk += 32) {
                /* Each row's next line but one: 32 rows at a time are more streams than the
                 * hardware prefetcher follows. 64 values ahead decoded fastest (docs/design.md,
                 * "AMX"). */
                if (kk + AHEAD < k)
                    for (int r = 0; r < 32; r++)
                        _mm_prefetch((const char *)(w0 + (size_t)r * (size_t)k + kk + AHEAD),
                                     _MM_HINT_T0);
                _tile_loadd(4, w0 + kk, w_stride);
                _tile_loadd(5, w1 + kk, w_stride);
                _tile_loadd(6, b0 + (size_t)kk * 32, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 5, 6);
                if (blocks_x > 1) {
                    _tile_loadd(7, b1 + (size_t)kk * 32, 64);
                    _tile_dpbf16ps(2, 4, 7);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            store_block(y, ldy, n, i0, m, blocks_x, alpha, acc);
        }
    }
    _tile_release();
}
