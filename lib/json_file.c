/* json_file: reads a JSON object from a file with actionable errors; see json_file.h. */
#include "json_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fails with err and errno e: closes fd (when >= 0) and returns NULL. */
static json_t *fail(int fd, int e)
{
    if (fd >= 0)
        close(fd);
    errno = e;
    return NULL;
}

json_t *lora_json_file_load_bounded(const char *path, size_t max_bytes, char *err,
                                    size_t err_len)
{
    struct stat st;
    json_error_t jerr;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

    if (fd < 0) {
        int e = errno;
        snprintf(err, err_len, "%s: unable to open: %s", path, strerror(e));
        return fail(-1, e);
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        return fail(fd, EINVAL);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        snprintf(err, err_len, "%s: larger than %zu bytes", path, max_bytes);
        return fail(fd, EFBIG);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, err_len, "%s: unable to read: %s", path, strerror(e));
        return fail(fd, e);
    }
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) {
        snprintf(err, err_len, "%s: invalid JSON at line %d column %d: %s", path, jerr.line,
                 jerr.column, jerr.text);
        return fail(-1, EINVAL);
    }
    if (!json_is_object(root)) {
        snprintf(err, err_len, "%s: top level must be a JSON object", path);
        json_decref(root);
        return fail(-1, EINVAL);
    }
    return root;
}

json_t *lora_json_file_load(const char *path, char *err, size_t err_len)
{
    return lora_json_file_load_bounded(path, LORA_JSON_FILE_MAX_BYTES, err, err_len);
}
