/* json_file: reads a JSON object from a file with actionable errors; see json_file.h. */
#include "base/json_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

const char *lora_json_error_what(const json_error_t *jerr)
{
    switch (json_error_code(jerr)) {
    case json_error_out_of_memory:
        return "out of memory";
    case json_error_stack_overflow:
        return "nested too deeply";
    case json_error_cannot_open_file:
        return "unable to read";
    case json_error_premature_end_of_input:
        return "unexpected end of input";
    case json_error_end_of_input_expected:
        return "text after the end of the document";
    case json_error_invalid_utf8:
        return "invalid UTF-8";
    case json_error_invalid_format:
        return "invalid format";
    case json_error_wrong_type:
        return "wrong type";
    case json_error_null_character:
        return "a NUL character";
    case json_error_null_value:
        return "a null value";
    case json_error_null_byte_in_key:
        return "a NUL byte in a key";
    case json_error_duplicate_key:
        return "a duplicate key";
    case json_error_numeric_overflow:
        return "a number out of range";
    case json_error_item_not_found:
        return "item not found";
    case json_error_index_out_of_range:
        return "index out of range";
    default:
        return "invalid syntax";
    }
}

json_t *lora_json_file_load_fd(int fd, const char *path, size_t max_bytes, char *err,
                               size_t err_len)
{
    struct stat st;
    json_error_t jerr;

    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        return fail(fd, EINVAL);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        snprintf(err, err_len, "%s: larger than %zu bytes", path, max_bytes);
        return fail(fd, EFBIG);
    }
    /* One read of the whole file, then the parser on memory: json_loadf reads a byte at a
     * time through stdio, which is most of the load of a large tokenizer.json. */
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        snprintf(err, err_len, "%s: out of memory reading %zu bytes", path, size);
        return fail(fd, ENOMEM);
    }
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            snprintf(err, err_len, "%s: unable to read: %s", path,
                     n < 0 ? strerror(e) : "the file shrank while read");
            free(buf);
            return fail(fd, e);
        }
        got += (size_t)n;
    }
    close(fd);
    json_t *root = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root) {
        snprintf(err, err_len, "%s: invalid JSON at line %d column %d (byte %d): %s", path,
                 jerr.line, jerr.column, jerr.position, lora_json_error_what(&jerr));
        return fail(-1, EINVAL);
    }
    if (!json_is_object(root)) {
        snprintf(err, err_len, "%s: top level must be a JSON object", path);
        json_decref(root);
        return fail(-1, EINVAL);
    }
    return root;
}

json_t *lora_json_file_load_bounded(const char *path, size_t max_bytes, char *err,
                                    size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);

    if (fd < 0) {
        int e = errno;
        snprintf(err, err_len, "%s: unable to open: %s", path, strerror(e));
        return fail(-1, e);
    }
    return lora_json_file_load_fd(fd, path, max_bytes, err, err_len);
}

json_t *lora_json_file_load(const char *path, char *err, size_t err_len)
{
    return lora_json_file_load_bounded(path, LORA_JSON_FILE_MAX_BYTES, err, err_len);
}
