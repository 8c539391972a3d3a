/* json_file: reads a JSON object from a file with actionable errors; see json_file.h. */
#include "json_file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

json_t *lora_json_file_load(const char *path, char *err, size_t err_len)
{
    json_error_t jerr;
    FILE *f = fopen(path, "rb");

    if (!f) {
        int e = errno;
        snprintf(err, err_len, "%s: unable to open: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) {
        snprintf(err, err_len, "%s: invalid JSON at line %d column %d: %s", path, jerr.line,
                 jerr.column, jerr.text);
        errno = EINVAL;
        return NULL;
    }
    if (!json_is_object(root)) {
        snprintf(err, err_len, "%s: top level must be a JSON object", path);
        json_decref(root);
        errno = EINVAL;
        return NULL;
    }
    return root;
}
