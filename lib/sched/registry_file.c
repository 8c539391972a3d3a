/* registry_file: the adapter registry on disk; see registry_file.h. */
#include "sched/registry_file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errbuf.h"

#define FILE_MAX_BYTES (64u << 20) /* far above LORA_REGISTRY_MAX entries of the longest size */

int lora_registry_file_add(struct lora_registry *r, const char *name, const char *path, bool pinned)
{
    if (r->n_adapters >= LORA_REGISTRY_MAX) {
        errno = ENOSPC;
        return -1;
    }
    struct lora_registry_entry *a = realloc(r->adapters, sizeof(*a) * (size_t)(r->n_adapters + 1));
    if (!a)
        return -1;
    r->adapters = a;
    char *n = strdup(name), *p = strdup(path);
    if (!n || !p) {
        free(n);
        free(p);
        return -1;
    }
    a[r->n_adapters++] = (struct lora_registry_entry){n, p, pinned};
    return 0;
}

int lora_registry_file_add_startup(struct lora_registry *r, const char *name)
{
    if (r->n_startup >= LORA_REGISTRY_MAX) {
        errno = ENOSPC;
        return -1;
    }
    char **s = realloc(r->startup, sizeof(*s) * (size_t)(r->n_startup + 1));
    if (!s)
        return -1;
    r->startup = s;
    if (!(s[r->n_startup] = strdup(name)))
        return -1;
    r->n_startup++;
    return 0;
}

int lora_registry_file_find(const struct lora_registry *r, const char *name)
{
    for (int i = 0; i < r->n_adapters; i++)
        if (strcmp(r->adapters[i].name, name) == 0)
            return i;
    return -1;
}

bool lora_registry_file_has_startup(const struct lora_registry *r, const char *name)
{
    for (int i = 0; i < r->n_startup; i++)
        if (strcmp(r->startup[i], name) == 0)
            return true;
    return false;
}

void lora_registry_file_release(struct lora_registry *r)
{
    for (int i = 0; i < r->n_adapters; i++) {
        free(r->adapters[i].name);
        free(r->adapters[i].path);
    }
    for (int i = 0; i < r->n_startup; i++)
        free(r->startup[i]);
    free(r->adapters);
    free(r->startup);
    *r = (struct lora_registry){0};
}

/* ---- reading ---------------------------------------------------------------------------- */

/* The whole file, NUL-terminated, or NULL with err; errno ENOENT when it does not exist. */
static char *slurp(const char *path, size_t *len, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;

    if (fd < 0) {
        int e = errno;
        lora_errf_path(err, err_len, path, "unable to open: %s", strerror(e));
        errno = e;
        return NULL;
    }
    const char *why = NULL;
    if (fstat(fd, &st) < 0)
        why = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "is a directory";
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else if ((size_t)st.st_size > FILE_MAX_BYTES)
        why = "larger than 64 MiB";
    if (why) {
        lora_errf_path(err, err_len, path, "unable to read: %s", why);
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            lora_errf_path(err, err_len, path, "unable to read: %s",
                           n < 0 ? strerror(errno) : "the file shrank while read");
            free(buf);
            close(fd);
            errno = EIO;
            return NULL;
        }
        got += (size_t)n;
    }
    close(fd);
    if (!buf) {
        lora_errf_path(err, err_len, path, "out of memory");
        errno = ENOMEM;
        return NULL;
    }
    buf[got] = 0;
    *len = got;
    return buf;
}

static bool is_text(const json_t *v, size_t max)
{
    return json_is_string(v) && json_string_length(v) >= 1 && json_string_length(v) <= max &&
           strlen(json_string_value(v)) == json_string_length(v);
}

static int decode(const char *path, json_t *root, struct lora_registry *r, char *err,
                  size_t err_len)
{
    json_t *v = json_object_get(root, "version");
    if (!json_is_integer(v) || json_integer_value(v) != LORA_REGISTRY_VERSION) {
        lora_errf_path(err, err_len, path, "\"version\" must be %d", LORA_REGISTRY_VERSION);
        return -1;
    }
    json_t *list = json_object_get(root, "adapters");
    if (!json_is_array(list) || json_array_size(list) > LORA_REGISTRY_MAX) {
        lora_errf_path(err, err_len, path, "\"adapters\" must be an array of at most %d",
                       LORA_REGISTRY_MAX);
        return -1;
    }
    size_t i;
    json_t *a;
    json_array_foreach (list, i, a) {
        json_t *name = json_object_get(a, "name"), *p = json_object_get(a, "path"),
               *pin = json_object_get(a, "pinned");
        if (!is_text(name, LORA_REGISTRY_NAME_MAX)) {
            lora_errf_path(err, err_len, path,
                           "adapters[%zu].name must be a string of 1 to %d bytes", i,
                           LORA_REGISTRY_NAME_MAX);
            return -1;
        }
        if (!is_text(p, LORA_REGISTRY_PATH_MAX)) {
            lora_errf_path(err, err_len, path,
                           "adapters[%zu].path must be a string of 1 to %d bytes", i,
                           LORA_REGISTRY_PATH_MAX);
            return -1;
        }
        if (!json_is_boolean(pin)) {
            lora_errf_path(err, err_len, path, "adapters[%zu].pinned must be true or false", i);
            return -1;
        }
        if (lora_registry_file_find(r, json_string_value(name)) >= 0) {
            lora_errf_path(err, err_len, path, "adapters[%zu]: adapter '%s' is listed twice", i,
                           json_string_value(name));
            return -1;
        }
        if (lora_registry_file_add(r, json_string_value(name), json_string_value(p), json_is_true(pin)) <
            0) {
            lora_errf_path(err, err_len, path, "out of memory");
            return -1;
        }
    }
    list = json_object_get(root, "startup_modules");
    if (list && (!json_is_array(list) || json_array_size(list) > LORA_REGISTRY_MAX)) {
        lora_errf_path(err, err_len, path,
                       "\"startup_modules\" must be an array of at most %d names",
                       LORA_REGISTRY_MAX);
        return -1;
    }
    json_array_foreach (list, i, a) {
        if (!is_text(a, LORA_REGISTRY_NAME_MAX)) {
            lora_errf_path(err, err_len, path,
                           "startup_modules[%zu] must be a string of 1 to %d bytes", i,
                           LORA_REGISTRY_NAME_MAX);
            return -1;
        }
        if (!lora_registry_file_has_startup(r, json_string_value(a)) &&
            lora_registry_file_add_startup(r, json_string_value(a)) < 0) {
            lora_errf_path(err, err_len, path, "out of memory");
            return -1;
        }
    }
    return 0;
}

int lora_registry_file_read(const char *path, struct lora_registry *r, char *err, size_t err_len)
{
    size_t len = 0;
    json_error_t jerr;

    *r = (struct lora_registry){0};
    char *text = slurp(path, &len, err, err_len);
    if (!text)
        return errno == ENOENT ? 1 : -1;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        lora_errf_path(err, err_len, path, "invalid JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root))
        lora_errf_path(err, err_len, path, "top level must be a JSON object");
    else
        rc = decode(path, root, r, err, err_len);
    json_decref(root);
    if (rc < 0)
        lora_registry_file_release(r);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------- */

static json_t *encode(const struct lora_registry *r)
{
    json_t *root = json_object(), *list = json_array(), *names = json_array();
    int bad = !root || !list || !names;

    for (int i = 0; !bad && i < r->n_adapters; i++) {
        const struct lora_registry_entry *a = &r->adapters[i];
        bad |= json_array_append_new(list, json_pack("{s:s, s:s, s:b}", "name", a->name, "path",
                                                     a->path, "pinned", a->pinned)) < 0;
    }
    for (int i = 0; !bad && i < r->n_startup; i++)
        bad |= json_array_append_new(names, json_string(r->startup[i])) < 0;
    if (!bad) {
        bad |= json_object_set_new(root, "version", json_integer(LORA_REGISTRY_VERSION)) < 0;
        bad |= json_object_set(root, "adapters", list) < 0;
        bad |= json_object_set(root, "startup_modules", names) < 0;
    }
    json_decref(list);
    json_decref(names);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* fsync of the directory that holds path, so that the rename itself is durable. */
static int sync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int lora_registry_file_write(const char *path, const struct lora_registry *r, char *err,
                             size_t err_len)
{
    json_t *root = encode(r);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    char tmp[LORA_REGISTRY_PATH_MAX + 64];
    int fd = -1, e = 0;
    const char *what = "";

    json_decref(root);
    if (!text) {
        lora_errf_path(err, err_len, path, "unable to write: out of memory");
        errno = ENOMEM;
        return -1;
    }
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= sizeof(tmp)) {
        lora_errf_path(err, err_len, path, "unable to write: the path is too long");
        free(text);
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        what = "unable to create its temporary file";
        goto fail;
    }
    if (write_all(fd, text, strlen(text)) < 0 || write_all(fd, "\n", 1) < 0) {
        what = "unable to write its temporary file";
        goto fail;
    }
    if (fsync(fd) < 0) {
        what = "unable to fsync its temporary file";
        goto fail;
    }
    if (close(fd) < 0) {
        fd = -1;
        what = "unable to close its temporary file";
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        what = "unable to rename its temporary file over it";
        goto fail;
    }
    free(text);
    if (sync_dir_of(path) < 0) {
        e = errno;
        lora_errf_path(err, err_len, path, "unable to fsync its directory: %s", strerror(e));
        errno = e;
        return -1;
    }
    return 0;
fail:
    e = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(text);
    lora_errf_path(err, err_len, path, "%s: %s", what, strerror(e));
    errno = e;
    return -1;
}
