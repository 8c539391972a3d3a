/* lora-frontend: what the engine sent for one request, kept apart from the link that fills it
 * (link.c) and the completions that read it (completions.c): the growable token arrays and the
 * prompt's log-probabilities. Nothing here locks; the callers hold the link's lock where the
 * data is shared. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

struct fe_seq *seq_new(const char *id)
{
    struct fe_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    snprintf(s->id, sizeof(s->id), "%s", id);
    return s;
}

int seq_grow_tokens(int32_t **ids, float **lps, int32_t **top_ids, float **top_lps, size_t *cap,
                    size_t need, int top_n)
{
    if (need <= *cap && (top_n == 0 || *top_ids))
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    int32_t *i = realloc(*ids, n * sizeof(*i));
    if (i)
        *ids = i;
    float *l = realloc(*lps, n * sizeof(*l));
    if (l)
        *lps = l;
    if (!i || !l)
        return -1;
    if (top_n) {
        int32_t *ti = realloc(*top_ids, n * (size_t)top_n * sizeof(*ti));
        if (ti)
            *top_ids = ti;
        float *tl = realloc(*top_lps, n * (size_t)top_n * sizeof(*tl));
        if (tl)
            *top_lps = tl;
        if (!ti || !tl)
            return -1;
    }
    *cap = n;
    return 0;
}

void seq_copy_prompt_lps(struct fe_prompt_lps *dst, int n, const float *lps, const int32_t *ranks,
                         int top_n, const int32_t *top_ids, const float *top_lps)
{
    if (n <= 0 || dst->lps || !(dst->lps = malloc(sizeof(float) * (size_t)n)))
        return;
    memcpy(dst->lps, lps, sizeof(float) * (size_t)n);
    dst->n = n;
    if (ranks && (dst->ranks = malloc(sizeof(int32_t) * (size_t)n)))
        memcpy(dst->ranks, ranks, sizeof(int32_t) * (size_t)n);
    size_t n_top = (size_t)n * (size_t)top_n;
    if (n_top && (dst->top_ids = malloc(sizeof(int32_t) * n_top)) &&
        (dst->top_lps = malloc(sizeof(float) * n_top))) {
        memcpy(dst->top_ids, top_ids, sizeof(int32_t) * n_top);
        memcpy(dst->top_lps, top_lps, sizeof(float) * n_top);
        dst->top_n = top_n;
    }
}

void seq_free_prompt_lps(struct fe_prompt_lps *p)
{
    free(p->lps);
    free(p->ranks);
    free(p->top_ids);
    free(p->top_lps);
    *p = (struct fe_prompt_lps){0};
}

void seq_free(struct fe_seq *s)
{
    free(s->tokens);
    free(s->lps);
    free(s->top_ids);
    free(s->top_lps);
    seq_free_prompt_lps(&s->prompt);
    free(s);
}
