/* sampler: temperature / top-k / top-p sampling and log-probabilities over one row of logits.
 *
 * Rank order, used everywhere: higher logit first, ties to the lower id; a NaN logit counts as
 * -inf and -0 as +0. It is encoded as one 64-bit key per token (order-preserving bits of the value
 * above the inverted id), so keys are distinct and compare as integers.
 *
 * Nothing sorts the whole vocabulary. Greedy is one vectorised pass. Top-k (and top-n for
 * log-probabilities) keeps a bounded min-heap, skipping blocks whose maximum cannot enter, then
 * sorts the k. Top-p without top-k drops tokens that provably fall outside the nucleus, then finds
 * the nucleus and the drawn token with a weighted quickselect, O(V) expected, which picks the
 * token a walk in rank order would pick. Draws walk the kept tokens in rank order; with neither
 * top-k nor top-p there is nothing to order and the walk goes in id order: the same
 * distribution, without a sort.
 *
 * Weights exp((l - max) / T) come from a vectorisable float exponential (relative error below
 * 3e-7) and are summed in double; log-probabilities use a double one (error near 1e-16), in a
 * loop cloned for the machine's widest vectors. A token's own log-probability needs only the row's
 * normaliser: the row of log-probabilities is written only when alternatives are asked for.
 *
 * All scratch is allocated by lora_sampler_new(); sample() and logprobs() never allocate.
 */
#include "runtime/sampler.h"

#if defined(__FAST_MATH__)
#error "sampler.c relies on IEEE NaN and infinity semantics: build it without -ffast-math"
#endif

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per block: block maxima let top-k skip most of the vocabulary, block sums let a draw
 * and the top-p filter skip blocks. */
#define BLOCK_TOKENS 64
/* Independent accumulators in the vectorised loops. */
#define LANES 8

/* One token in a candidate list. */
struct cand {
    uint64_t key; /* rank key: larger ranks higher; see rank_key() */
    double w;     /* unnormalised probability exp((l - max) / T) */
};

struct lora_sampler {
    int vocab_size;
    struct cand *cand; /* (vocab_size) candidates: heap or partitions */
    float *val;        /* (vocab_size) by token id: sampling weights or log-probabilities */
    double *block_w;   /* (vocab_size / BLOCK_TOKENS rounded up) total weight of each block */
};

/* ---- random numbers: splitmix64 seeding, xoshiro256** stream ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void lora_rng_seed(struct lora_rng *rng, uint64_t seed)
{
    uint64_t x = seed;

    /* splitmix64 never yields four zero words, so the xoshiro state is never all-zero. */
    for (int i = 0; i < 4; i++)
        rng->state[i] = splitmix64(&x);
}

void lora_rng_seed_draw(struct lora_rng *rng, uint64_t seed, uint64_t draw)
{
    uint64_t x = seed;

    /* Mix the draw index in through a full splitmix64 round so neighbouring draws of one seed
     * start from unrelated states. */
    x = splitmix64(&x) ^ draw;
    lora_rng_seed(rng, x);
}

uint64_t lora_rng_next(struct lora_rng *rng)
{
    uint64_t *s = rng->state;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double lora_rng_uniform(struct lora_rng *rng)
{
    return (double)(lora_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* ---- lifecycle ---- */

struct lora_sampler *lora_sampler_new(int vocab_size)
{
    struct lora_sampler *s;
    size_t n;

    if (vocab_size <= 0) {
        errno = EINVAL;
        return NULL;
    }
    n = (size_t)vocab_size;
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->vocab_size = vocab_size;
    s->cand = malloc(n * sizeof(*s->cand));
    s->val = malloc(n * sizeof(*s->val));
    s->block_w = malloc((n + BLOCK_TOKENS - 1) / BLOCK_TOKENS * sizeof(*s->block_w));
    if (!s->cand || !s->val || !s->block_w) {
        lora_sampler_destroy(&s);
        errno = ENOMEM;
        return NULL;
    }
    return s;
}

void lora_sampler_destroy(struct lora_sampler **s)
{
    if (!s || !*s)
        return;
    free((*s)->cand);
    free((*s)->val);
    free((*s)->block_w);
    free(*s);
    *s = NULL;
}

/* ---- float helpers, all branch-free so that the loops using them vectorise ---- */

static inline uint32_t float_bits(float x)
{
    uint32_t b;

    memcpy(&b, &x, sizeof(b));
    return b;
}

static inline float bits_float(uint32_t b)
{
    float x;

    memcpy(&x, &b, sizeof(x));
    return x;
}

static inline uint64_t double_bits(double x)
{
    uint64_t b;

    memcpy(&b, &x, sizeof(b));
    return b;
}

static inline double bits_double(uint64_t b)
{
    double x;

    memcpy(&x, &b, sizeof(x));
    return x;
}

/* NaN becomes -inf; adding +0 turns -0 into +0 so that the two zeros tie. */
static inline float clean(float x)
{
    uint32_t nan = 0u - (uint32_t)(x != x);

    return bits_float((float_bits(x + 0.0f) & ~nan) | (float_bits(-INFINITY) & nan));
}

/* e^a for a <= 0, relative error below 3e-7; 0 below -87, for -inf and for NaN. Out-of-range
 * inputs compute defined garbage (no float-to-int casts) that the final mask clears: a select
 * or an early return would stop the weight loop vectorising, and libm's expf does not. */
static inline float exp_neg(float a)
{
    const float log2e = 1.44269504f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float shifted = a * log2e + round;
    float n = shifted - round;             /* in [-126, 0] when a is in range */
    float r = a - n * ln2_hi - n * ln2_lo; /* |r| <= ln2 / 2 */
    /* Taylor to degree 6: the remainder is below 1.2e-7 relative on |r| <= ln2 / 2. */
    float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r / 720)))));
    /* shifted holds round + n, so its bits differ from round's by n: 2^n without a cast. */
    float scale = bits_float((float_bits(shifted) - float_bits(round) + 127u) << 23);
    uint32_t keep = 0u - (uint32_t)(a >= -87.0f);

    return bits_float(float_bits(p * scale) & keep);
}

/* The same in double: e^a for a <= 0 with a relative error near 1e-16; 0 below -708. */
static inline double exp_neg_d(double a)
{
    /* ln2 split: the float nearest ln2, exact times any n here, and the rest. */
    const double log2e = 1.4426950408889634, ln2_hi = 0.693147182464599609375,
                 ln2_lo = -1.9046542999577679e-9;
    const double round = 6755399441055744.0; /* 1.5 * 2^52 */
    double shifted = a * log2e + round;
    double n = shifted - round; /* in [-1021, 0] when a is in range */
    double r = a - n * ln2_hi - n * ln2_lo;
    /* Taylor to degree 13: the remainder is below 2e-17 relative on |r| <= ln2 / 2. */
    double p = 1.0 / 6227020800.0;

    p = 1.0 / 479001600.0 + r * p;
    p = 1.0 / 39916800.0 + r * p;
    p = 1.0 / 3628800.0 + r * p;
    p = 1.0 / 362880.0 + r * p;
    p = 1.0 / 40320.0 + r * p;
    p = 1.0 / 5040.0 + r * p;
    p = 1.0 / 720.0 + r * p;
    p = 1.0 / 120.0 + r * p;
    p = 1.0 / 24.0 + r * p;
    p = 1.0 / 6.0 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    return bits_double(
        double_bits(p * bits_double((double_bits(shifted) - double_bits(round) + 1023u) << 52)) &
        (0u - (uint64_t)(a >= -708.0)));
}

/* Maximum of v[0..BLOCK_TOKENS), NaN ignored; -inf when there is nothing else. */
static inline float block_max(const float *v)
{
    float m[LANES], best = -INFINITY;

    for (int l = 0; l < LANES; l++)
        m[l] = -INFINITY;
    for (int j = 0; j < BLOCK_TOKENS; j += LANES) {
        for (int l = 0; l < LANES; l++)
            m[l] = v[j + l] > m[l] ? v[j + l] : m[l];
    }
    for (int l = 0; l < LANES; l++)
        best = m[l] > best ? m[l] : best;
    return best;
}

/* First index of the maximum of v[0..n), NaN ignored; 0 when every value is -inf or NaN.
 * Only the block that first holds the maximum is scanned token by token. */
static int argmax(const float *v, int n)
{
    float best = -INFINITY;
    int block = -1, tail_best = -1, i = 0;

    for (; i + BLOCK_TOKENS <= n; i += BLOCK_TOKENS) {
        float bm = block_max(v + i);

        if (bm > best) {
            best = bm;
            block = i;
        }
    }
    for (; i < n; i++) {
        if (v[i] > best) {
            best = v[i];
            tail_best = i;
        }
    }
    if (tail_best >= 0)
        return tail_best;
    if (block < 0)
        return 0;
    for (i = block;; i++) {
        if (v[i] == best)
            return i;
    }
}

/* ---- rank keys and selection ---- */

/* Key of token id with value x: order-preserving bits of clean(x) in the high half, the inverted
 * id in the low half, so a larger key means a higher value or, on a tie, a lower id. */
static inline uint64_t rank_key(float x, int id)
{
    uint32_t b = float_bits(clean(x));

    /* Negative: flip every bit; otherwise set the sign bit. */
    b ^= (0u - (b >> 31)) | 0x80000000u;
    return (uint64_t)b << 32 | (uint32_t) ~(uint32_t)id;
}

static inline int key_id(uint64_t key)
{
    return (int)~(uint32_t)key;
}

static inline void swap_cand(struct cand *a, struct cand *b)
{
    struct cand t = *a;

    *a = *b;
    *b = t;
}

/* Min-heap on key: the lowest-ranked candidate sits at the root. */
static void sift_down(struct cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;

        if (c >= n)
            return;
        if (c + 1 < n && h[c + 1].key < h[c].key)
            c++;
        if (h[i].key <= h[c].key)
            return;
        swap_cand(&h[i], &h[c]);
        i = c;
    }
}

/* Offers token i to the k-heap h whose root value is *root. A later id loses every tie, so only
 * a strictly larger value enters; NaN never does. */
static inline void offer(struct cand *h, int k, const float *v, int i, float *root)
{
    if (!(v[i] > *root))
        return;
    h[0].key = rank_key(v[i], i);
    sift_down(h, (size_t)k, 0);
    *root = clean(v[key_id(h[0].key)]);
}

/* Fills out[0..k) with the keys of the k highest-ranked tokens of v[0..n), in rank order;
 * 1 <= k <= n. The w fields are left undefined. */
static void select_top(struct cand *out, int k, const float *v, int n)
{
    float root;
    int i = k;

    for (int j = 0; j < k; j++)
        out[j].key = rank_key(v[j], j);
    for (size_t j = (size_t)k / 2; j-- > 0;)
        sift_down(out, (size_t)k, j);
    root = clean(v[key_id(out[0].key)]);
    for (; i < n && i % BLOCK_TOKENS; i++)
        offer(out, k, v, i, &root);
    for (; i + BLOCK_TOKENS <= n; i += BLOCK_TOKENS) {
        if (!(block_max(v + i) > root))
            continue;
        for (int j = i; j < i + BLOCK_TOKENS; j++)
            offer(out, k, v, j, &root);
    }
    for (; i < n; i++)
        offer(out, k, v, i, &root);
    /* Heapsort: each step moves the current lowest to the end, leaving rank order. */
    for (size_t m = (size_t)k; m > 1; m--) {
        swap_cand(&out[0], &out[m - 1]);
        sift_down(out, m - 1, 0);
    }
}

/* Splits c[lo..hi) around a pivot: returns p with c[lo..p) ranked above c[p] and c[p + 1..hi)
 * below, and the weight of c[lo..p) in *above_w. The pivot is the median of three positions
 * from *seed, which keeps ordered inputs from going quadratic. */
static size_t partition(struct cand *c, size_t lo, size_t hi, uint64_t *seed, double *above_w)
{
    size_t n = hi - lo, a, b, m, store = lo;
    uint64_t pivot;
    double sum = 0.0;

    a = lo + splitmix64(seed) % n;
    b = lo + splitmix64(seed) % n;
    m = lo + splitmix64(seed) % n;
    if (c[a].key > c[b].key)
        swap_cand(&c[a], &c[b]);
    if (c[m].key > c[b].key)
        m = b;
    else if (c[m].key < c[a].key)
        m = a;
    swap_cand(&c[m], &c[hi - 1]);
    pivot = c[hi - 1].key;
    /* Branch-free Lomuto: the comparison is a coin flip, so a branch would mostly mispredict.
     * Swapping unconditionally is harmless: c[store..i) all rank below the pivot. */
    for (size_t i = lo; i < hi - 1; i++) {
        struct cand t = c[i];
        bool up = t.key > pivot;

        c[i] = c[store];
        c[store] = t;
        sum += up ? t.w : 0.0;
        store += up;
    }
    swap_cand(&c[store], &c[hi - 1]);
    *above_w = sum;
    return store;
}

/* Weighted selection over c[0..n): finds the token at which the cumulative weight, taken in rank
 * order, first reaches need (first exceeds it when strict). On return c[0..p] are the p + 1
 * highest-ranked tokens, in no particular order, and c[p] is the one found. Returns p, or -1
 * when rounding leaves the total short of need. Expected O(n). */
static long weighted_select(struct cand *c, size_t n, double need, bool strict)
{
    size_t lo = 0, hi = n;
    uint64_t seed = n;

    /* Invariant: c[0..lo) rank above c[lo..hi), and need has been reduced by their weight. */
    while (lo < hi) {
        double above, upto;
        size_t p = partition(c, lo, hi, &seed, &above);

        upto = above + c[p].w;
        if (strict ? above > need : above >= need) {
            hi = p;
        } else if (strict ? upto > need : upto >= need) {
            return (long)p;
        } else {
            need -= upto;
            lo = p + 1;
        }
    }
    return -1;
}

/* ---- sampling ---- */

/* Unnormalised probability exp((logit - max) / t). NaN logits give NaN, hence 0, like -inf.
 * Division rather than a reciprocal keeps every float t > 0 exact at the maximum (0 / t), and
 * -inf / inf is NaN, hence 0. */
static inline float weight(float logit, float max, float t)
{
    return exp_neg((logit - max) / t);
}

/* Fills w[0..n) with the weight of every token and block_w[b] with the sum of block b (tokens
 * [b * BLOCK_TOKENS, (b + 1) * BLOCK_TOKENS), clipped to n); returns the sum of the blocks. */
static double fill_weights(float *restrict w, double *restrict block_w,
                           const float *restrict logits, int n, float max, float t)
{
    double total = 0.0;

    for (int b = 0, i = 0; i < n; b++) {
        int end = i + BLOCK_TOKENS < n ? i + BLOCK_TOKENS : n;
        double part[LANES] = {0}, sum = 0.0;

        for (; i + LANES <= end; i += LANES) {
            for (int l = 0; l < LANES; l++) {
                float x = weight(logits[i + l], max, t);

                w[i + l] = x;
                part[l] += x;
            }
        }
        for (; i < end; i++) {
            w[i] = weight(logits[i], max, t);
            sum += w[i];
        }
        for (int l = 0; l < LANES; l++)
            sum += part[l];
        block_w[b] = sum;
        total += sum;
    }
    return total;
}

/* Inverse-CDF draw in id order over the weights of fill_weights(): finds the block, then the
 * token. Returns a token with positive weight, or -1 when rounding defeats the search. */
static int draw_by_id(const float *w, const double *block_w, int n, double target)
{
    double cum = 0.0;
    int b = 0, n_blocks = (n + BLOCK_TOKENS - 1) / BLOCK_TOKENS, end, last = -1;

    for (; b < n_blocks - 1; b++) {
        if (target < cum + block_w[b])
            break;
        cum += block_w[b];
    }
    /* Only rounding can carry target into an empty last block: fall back to one with mass. */
    while (b > 0 && !(block_w[b] > 0.0))
        b--;
    end = (b + 1) * BLOCK_TOKENS < n ? (b + 1) * BLOCK_TOKENS : n;
    for (int i = b * BLOCK_TOKENS; i < end; i++) {
        if (w[i] > 0.0f)
            last = i;
        cum += w[i];
        if (target < cum)
            return i;
    }
    return last;
}

/* top-k (1 <= k < vocab), then top-p when top_p < 1, then a draw in rank order. */
static int sample_top_k(struct lora_sampler *s, const float *logits, int k, float t, double top_p,
                        double u)
{
    struct cand *c = s->cand;
    double total = 0.0, target, cum = 0.0;
    float max;
    int m = k, last;

    select_top(c, k, logits, s->vocab_size);
    max = clean(logits[key_id(c[0].key)]);
    if (isinf(max))
        return key_id(c[0].key); /* all -inf (then token 0) or a +inf logit: no distribution */
    for (int j = 0; j < k; j++) {
        c[j].w = weight(logits[key_id(c[j].key)], max, t);
        total += c[j].w;
    }
    if (top_p < 1.0) {
        double need = top_p * total;

        for (m = 0, total = 0.0; m < k && !(total >= need); m++)
            total += c[m].w;
    }
    target = u * total;
    last = key_id(c[0].key);
    for (int j = 0; j < m; j++) {
        if (c[j].w > 0.0)
            last = key_id(c[j].key);
        cum += c[j].w;
        if (target < cum)
            return key_id(c[j].key);
    }
    return last; /* rounding put target at the very top: the last token with any mass */
}

/* top-p over the whole vocabulary after fill_weights(), with best the argmax. The tokens ranked
 * at or below a token of probability q carry at most V * q, so when V * q <= (1 - top_p) / 2 the
 * tokens above it hold more than top_p, by a margin far beyond rounding, and it is outside the
 * nucleus. Whole blocks go when their sum is that small. The argmax (weight 1 >= total / V)
 * always stays. */
static int sample_top_p(struct lora_sampler *s, const float *logits, double total, double top_p,
                        int best, double u)
{
    const float *w = s->val;
    struct cand *c = s->cand;
    double cutoff = 0.5 * (1.0 - top_p) * total / s->vocab_size, kept = 0.0;
    size_t n = 0;
    long p;

    for (int i = 0, b = 0; i < s->vocab_size; b++) {
        int end = i + BLOCK_TOKENS < s->vocab_size ? i + BLOCK_TOKENS : s->vocab_size;

        if (!(s->block_w[b] > cutoff)) {
            i = end;
            continue;
        }
        /* Branch-free compaction (n <= i): in a flat distribution about as many go as stay.
         * The key holds the bare id for now. */
        for (; i < end; i++) {
            c[n].w = w[i];
            c[n].key = (uint64_t)i;
            n += w[i] > cutoff;
        }
    }
    for (size_t j = 0; j < n; j++)
        c[j].key = rank_key(logits[c[j].key], (int)c[j].key);
    p = weighted_select(c, n, top_p * total, false);
    if (p >= 0)
        n = (size_t)p + 1; /* c[0..n) is now the nucleus */
    for (size_t j = 0; j < n; j++)
        kept += c[j].w;
    p = weighted_select(c, n, u * kept, true);
    return p >= 0 ? key_id(c[p].key) : best;
}

int lora_sampler_sample(struct lora_sampler *s, const float *logits,
                        const struct lora_sampling_params *p, struct lora_rng *rng)
{
    double top_p, total;
    int vocab, k, best, tok;
    float t, max;

    if (!s || !logits || !p)
        return -1;
    vocab = s->vocab_size;
    t = p->temperature;
    /* Zero, negative or NaN temperature: greedy. */
    if (!(t > 0.0f))
        return argmax(logits, vocab);
    if (!rng)
        return -1;
    top_p = p->top_p;
    if (!(top_p < 1.0))
        top_p = 1.0; /* NaN or >= 1: off */
    if (!(top_p > 0.0))
        return argmax(logits, vocab); /* out of range: the one-token nucleus */
    k = p->top_k;
    if (k > 0 && k < vocab)
        return sample_top_k(s, logits, k, t, top_p, lora_rng_uniform(rng));

    best = argmax(logits, vocab);
    max = clean(logits[best]);
    if (isinf(max))
        return best; /* all -inf (best == 0) or a +inf logit: no distribution */
    total = fill_weights(s->val, s->block_w, logits, vocab, max, t);
    if (top_p < 1.0)
        return sample_top_p(s, logits, total, top_p, best, lora_rng_uniform(rng));
    /* Neither filter: walk in id order (see the file comment). */
    tok = draw_by_id(s->val, s->block_w, vocab, lora_rng_uniform(rng) * total);
    return tok >= 0 ? tok : best;
}

/* ---- log-probabilities ---- */

/* What log-probabilities of a row need: its maximum (NaN as -inf) and, with a finite one,
 * lse = max + log(the sum of e^(l - max)) in double; with +inf logits those tokens share all the
 * mass: share = -log(their count); with every logit -inf or NaN there is no distribution and
 * every entry is -inf. */
struct norm {
    double max, lse;
    float share;
};

/* The sum of e^(l - max) over the row, in LANES partial sums then the tail: one order whatever
 * the vector width of the clone the machine runs (the widest it has; each lane does the same
 * IEEE operations). NaN and -inf give exp_neg_d() == 0. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) static double
sum_exp(const float *logits, int n, double max)
{
    double part[LANES] = {0}, sum = 0.0;
    int i = 0;

    for (; i + LANES <= n; i += LANES) {
        for (int l = 0; l < LANES; l++)
            part[l] += exp_neg_d((double)logits[i + l] - max);
    }
    for (; i < n; i++)
        sum += exp_neg_d((double)logits[i] - max);
    for (int l = 0; l < LANES; l++)
        sum += part[l];
    return sum;
}

static struct norm row_norm(const float *logits, int n)
{
    struct norm z = {clean(logits[argmax(logits, n)]), 0.0, 0.0f};

    if (z.max == INFINITY) {
        int n_inf = 0;
        for (int i = 0; i < n; i++)
            n_inf += logits[i] == INFINITY;
        z.share = (float)-log((double)n_inf);
    } else if (z.max != -INFINITY) {
        z.lse = z.max + log(sum_exp(logits, n, z.max));
    }
    return z;
}

/* log_softmax at a token of logit l in a row of finite maximum, computed in double and
 * rounded. */
static inline float lp_finite(double lse, float l)
{
    return (float)((double)clean(l) - lse);
}

/* log_softmax at a token of logit l, whatever the row. */
static inline float lp_at(const struct norm *z, float l)
{
    if (z->max == -INFINITY)
        return -INFINITY;
    if (z->max == INFINITY)
        return l == INFINITY ? z->share : -INFINITY;
    return lp_finite(z->lse, l);
}

/* lp[i] = log_softmax(logits)[i] for every token: lp_at, with the row's case decided once so
 * that the common one is a plain loop. */
static void log_softmax(float *restrict lp, const float *restrict logits, int n,
                        const struct norm *z)
{
    if (!isfinite(z->max)) {
        for (int i = 0; i < n; i++)
            lp[i] = lp_at(z, logits[i]);
        return;
    }
    for (int i = 0; i < n; i++)
        lp[i] = lp_finite(z->lse, logits[i]);
}

float lora_sampler_logprobs(struct lora_sampler *s, const float *logits, int token, int top_n,
                            int *top_ids, float *top_logprobs)
{
    if (!s || !logits)
        return NAN;
    if (top_n > s->vocab_size)
        top_n = s->vocab_size;
    if (!top_ids || !top_logprobs)
        top_n = 0;
    struct norm z = row_norm(logits, s->vocab_size);
    /* Without alternatives only the token's own value is needed. */
    if (top_n == 0)
        return token >= 0 && token < s->vocab_size ? lp_at(&z, logits[token]) : NAN;
    log_softmax(s->val, logits, s->vocab_size, &z);
    /* Selection runs on the rounded float log-probabilities, so the reported values never
     * increase and equal values come in id order. */
    select_top(s->cand, top_n, s->val, s->vocab_size);
    for (int j = 0; j < top_n; j++) {
        top_ids[j] = key_id(s->cand[j].key);
        top_logprobs[j] = s->val[top_ids[j]];
    }
    if (token < 0 || token >= s->vocab_size)
        return NAN;
    return s->val[token];
}
