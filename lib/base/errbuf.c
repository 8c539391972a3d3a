/* errbuf: writing a message into a caller's error buffer (see errbuf.h). */
#include "base/errbuf.h"

#include <stdarg.h>
#include <stdio.h>

void lora_errf(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (!err || err_len == 0)
        return;
    err[0] = '\0'; /* stays a string even if vsnprintf fails */
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

void lora_errf_path(char *err, size_t err_len, const char *path, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (!err || err_len == 0)
        return;
    err[0] = '\0';
    n = snprintf(err, err_len, "%s: ", path ? path : "(null)");
    if (n < 0 || (size_t)n >= err_len)
        return;
    va_start(ap, fmt);
    vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    va_end(ap);
}
