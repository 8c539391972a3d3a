/* lora-bench: writing result files atomically; see bench.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errbuf.h"
#include "bench.h"

int files_write_json(const char *path, const json_t *doc, char *err, size_t err_len)
{
    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    FILE *f = NULL;

    if (!tmp) {
        lora_errf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (!f || json_dumpf(doc, f, JSON_INDENT(1) | JSON_ENSURE_ASCII) < 0 || fputc('\n', f) < 0 ||
        fflush(f) != 0 || fsync(fileno(f)) != 0) {
        int e = errno;
        if (f)
            fclose(f);
        unlink(tmp);
        free(tmp);
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(e));
        return -1;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        lora_errf_path(err, err_len, path, "unable to write: %s", strerror(e));
        return -1;
    }
    free(tmp);
    return 0;
}
