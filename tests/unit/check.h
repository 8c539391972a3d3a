/* check.h: a minimal TAP producer for the C unit tests.
 *
 * Each test is a function run with RUN(fn); every CHECK inside it that fails prints a diagnostic
 * line, and the test is reported as one `ok N - name` or `not ok N - name` line. tests/run counts
 * those lines across all programs. main() ends with `return check_done();`.
 */
#ifndef LORA_TEST_CHECK_H
#define LORA_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_n_run, check_n_failed, check_cur_failed;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            printf("# %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);              \
            check_cur_failed = 1;                                                            \
        }                                                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                \
    do {                                                                                     \
        double check_a_ = (a), check_b_ = (b);                                               \
        if (!(fabs(check_a_ - check_b_) <= (tol))) {                                         \
            printf("# %s:%d: %s = %.9g, %s = %.9g, tolerance %g\n", __FILE__, __LINE__, #a,  \
                   check_a_, #b, check_b_, (double)(tol));                                   \
            check_cur_failed = 1;                                                            \
        }                                                                                    \
    } while (0)

/* Checks that string s contains the substring sub (error messages). */
#define CHECK_CONTAINS(s, sub)                                                               \
    do {                                                                                     \
        const char *check_s_ = (s);                                                          \
        if (!check_s_ || !strstr(check_s_, (sub))) {                                         \
            printf("# %s:%d: '%s' does not contain '%s'\n", __FILE__, __LINE__,              \
                   check_s_ ? check_s_ : "(null)", (sub));                                   \
            check_cur_failed = 1;                                                            \
        }                                                                                    \
    } while (0)

#define RUN(fn)                                                                              \
    do {                                                                                     \
        check_cur_failed = 0;                                                                \
        fn();                                                                                \
        check_n_run++;                                                                       \
        if (check_cur_failed)                                                                \
            check_n_failed++;                                                                \
        printf("%s %d - %s\n", check_cur_failed ? "not ok" : "ok", check_n_run, #fn);        \
        fflush(stdout);                                                                      \
    } while (0)

static inline int check_done(void)
{
    printf("1..%d\n", check_n_run);
    return check_n_failed ? 1 : 0;
}

#endif
