/* Unit tests for lib/runtime/emit: the stop rules (EOS, stop ids, min_tokens, max_tokens) and the
 * draw's masks (allowed_token_ids, the tokens banned before min_tokens), checked against
 * hand-worked cases on a six-token vocabulary. */
#include "check.h"
#include "runtime/emit.h"

#include <math.h>

#define VOCAB 6

static const int32_t eos[] = {5};
static const int32_t stops[] = {3};

static struct lora_emit_rules rules(int max_tokens, int min_tokens, bool ignore_eos)
{
    return (struct lora_emit_rules){max_tokens, min_tokens, ignore_eos, eos, 1, stops, 1};
}

static void test_finish_reasons(void)
{
    struct lora_emit_rules r = rules(4, 0, false);

    CHECK(lora_emit_finish(&r, 1, 0) == NULL);
    CHECK(strcmp(lora_emit_finish(&r, 1, 5), "stop") == 0);
    CHECK(strcmp(lora_emit_finish(&r, 2, 3), "stop") == 0);
    CHECK(strcmp(lora_emit_finish(&r, 4, 0), "length") == 0);
    /* A stop token on the last allowed position is a stop, as vLLM reports it. */
    CHECK(strcmp(lora_emit_finish(&r, 4, 5), "stop") == 0);
}

static void test_min_tokens_and_ignore_eos(void)
{
    struct lora_emit_rules r = rules(8, 2, false);

    CHECK(lora_emit_finish(&r, 1, 5) == NULL); /* before min_tokens: EOS does not end it */
    CHECK(lora_emit_finish(&r, 1, 3) == NULL);
    CHECK(strcmp(lora_emit_finish(&r, 2, 5), "stop") == 0);
    r = rules(8, 0, true);
    CHECK(lora_emit_finish(&r, 1, 5) == NULL); /* ignore_eos: EOS is a token like another */
    CHECK(strcmp(lora_emit_finish(&r, 1, 3), "stop") == 0); /* stop ids still stop */
}

static void test_banned(void)
{
    int32_t out[4];
    struct lora_emit_rules r = rules(8, 2, false);

    CHECK(lora_emit_banned(&r, out, 4) == 2 && out[0] == 5 && out[1] == 3);
    r.ignore_eos = true;
    CHECK(lora_emit_banned(&r, out, 4) == 1 && out[0] == 3);
    r.ignore_eos = false;
    CHECK(lora_emit_banned(&r, out, 1) == 1 && out[0] == 5); /* bounded by cap */
}

static struct lora_emit_draw greedy(const float *row)
{
    return (struct lora_emit_draw){.row = row, .sampling = {0, 0, 1}, .top_n = 2};
}

static void test_draw_masks(void)
{
    /* Token 5 (EOS) is the model's favourite, then 3, then 1. */
    const float row[VOCAB] = {0.0f, 2.0f, 0.5f, 3.0f, 1.0f, 4.0f};
    const int32_t banned[] = {5, 3}, allowed[] = {3, 5}, allowed_one[] = {2};
    struct lora_sampler *s = lora_sampler_new(VOCAB);
    float masked[VOCAB], lp, top_lps[2];
    int32_t top[2];
    struct lora_emit_draw d = greedy(row);

    CHECK(s != NULL);
    CHECK(lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps) == 5);
    d.banned = banned;
    d.n_banned = 2;
    CHECK(lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps) == 1);
    /* The reported log-probability and top tokens are the model's, not the masked row's. */
    double z = 0;
    for (int t = 0; t < VOCAB; t++)
        z += exp(row[t]);
    CHECK_NEAR(lp, 2.0 - log(z), 1e-5);
    CHECK(top[0] == 5 && top[1] == 3);
    /* Every allowed token banned: the allowed set wins. */
    d.allowed = allowed;
    d.n_allowed = 2;
    CHECK(lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps) == 5);
    d.allowed = allowed_one;
    d.n_allowed = 1;
    CHECK(lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps) == 2);
    lora_sampler_destroy(&s);
}

static void test_draw_is_seeded_by_position(void)
{
    const float row[VOCAB] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    struct lora_sampler *s = lora_sampler_new(VOCAB);
    float masked[VOCAB], lp, top_lps[2];
    int32_t top[2];
    struct lora_emit_draw d = greedy(row);
    int first[16], again[16];
    bool differ = false;

    d.sampling.temperature = 1.0f;
    d.seed = 42;
    for (int k = 0; k < 16; k++) {
        d.n_generated = k;
        first[k] = lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps);
    }
    for (int k = 15; k >= 0; k--) { /* in another order: the same draws */
        d.n_generated = k;
        again[k] = lora_emit_token(s, VOCAB, &d, masked, &lp, top, top_lps);
    }
    for (int k = 0; k < 16; k++) {
        CHECK(first[k] == again[k]);
        differ |= first[k] != first[0];
    }
    CHECK(differ); /* positions draw differently on a flat row */
    lora_sampler_destroy(&s);
}

int main(void)
{
    RUN(test_finish_reasons);
    RUN(test_min_tokens_and_ignore_eos);
    RUN(test_banned);
    RUN(test_draw_masks);
    RUN(test_draw_is_seeded_by_position);
    return check_done();
}
