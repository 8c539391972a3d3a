/* path_confine: see path_confine.h. */
#include "path_confine.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errbuf.h"

static bool has_dotdot(const char *p)
{
    for (const char *s = p; *s;) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return true;
        if (!e)
            break;
        s = e + 1;
    }
    return false;
}

/* Whether p is root or under it. */
static bool under(const char *root, const char *p, bool strictly)
{
    size_t n = strlen(root);
    if (strncmp(root, p, n) != 0)
        return false;
    if (p[n] == 0)
        return !strictly;
    return p[n] == '/' || (n == 1 && root[0] == '/');
}

char *lora_path_confine(const char *root, const char *path, enum lora_confine_error *why,
                        char *err, size_t err_len)
{
    char joined[PATH_MAX];

    *why = LORA_CONFINE_ESCAPE;
    if (!*path) {
        lora_errf(err, err_len, "the adapter path is empty");
        return NULL;
    }
    if (has_dotdot(path)) {
        lora_errf(err, err_len, "'%s': a path with '..' is not accepted", path);
        return NULL;
    }
    if (path[0] == '/') {
        if (!under(root, path, false)) {
            lora_errf(err, err_len, "'%s' is outside the adapter root '%s'", path, root);
            return NULL;
        }
        snprintf(joined, sizeof(joined), "%s", path);
    } else if ((size_t)snprintf(joined, sizeof(joined), "%s/%s", root, path) >= sizeof(joined)) {
        lora_errf(err, err_len, "'%s': the path is too long", path);
        return NULL;
    }
    char *real = realpath(joined, NULL);
    if (!real) {
        int e = errno;
        *why = e == ENOENT || e == ENOTDIR ? LORA_CONFINE_MISSING : LORA_CONFINE_ESCAPE;
        lora_errf(err, err_len, "'%s': %s", path,
                  e == ENOENT ? "no such adapter directory" : strerror(e));
        return NULL;
    }
    if (!under(root, real, true)) {
        lora_errf(err, err_len, "'%s' leads outside the adapter root '%s'", path, root);
        free(real);
        return NULL;
    }
    struct stat st;
    if (stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
        *why = LORA_CONFINE_NOT_DIR;
        lora_errf(err, err_len, "'%s' is not a directory", path);
        free(real);
        return NULL;
    }
    *why = LORA_CONFINE_OK;
    return real;
}
