/* path_confine: the check of a path string and the confined open; see path_confine.h. */
#include "base/path_confine.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/errbuf.h"

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

/* The first component of joined below root that is a symbolic link, as a path written into
 * link (len bytes), or NULL when there is none. */
static const char *first_link(const char *root, const char *joined, char *link, size_t len)
{
    struct stat st;
    size_t n = strlen(root);

    if (strncmp(joined, root, n) != 0 || joined[n] != '/')
        return NULL;
    snprintf(link, len, "%s", joined);
    for (char *s = link + n + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (lstat(link, &st) == 0 && S_ISLNK(st.st_mode))
            return link;
        *s = '/';
    }
    size_t l = strlen(link);
    while (l > n + 1 && link[l - 1] == '/')
        link[--l] = 0;
    if (lstat(link, &st) == 0 && S_ISLNK(st.st_mode))
        return link;
    return NULL;
}

char *lora_path_confine(const char *root, const char *path, bool allow_symlinks,
                        enum lora_path_confine_error *why, char *err, size_t err_len)
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
    char link[PATH_MAX];
    if (!allow_symlinks && first_link(root, joined, link, sizeof(link))) {
        *why = LORA_CONFINE_SYMLINK;
        lora_errf(err, err_len,
                  "'%s': '%s' is a symbolic link, and links under the adapter root are refused "
                  "(--lora-allow-symlinks allows those that stay under it)",
                  path, link + strlen(root) + 1);
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

const char *lora_path_confine_relative(const char *root, const char *path)
{
    size_t n = strlen(root);

    while (n > 1 && root[n - 1] == '/')
        n--;
    if (strncmp(root, path, n) != 0 || path[n] != '/')
        return NULL;
    const char *rel = path + n;
    while (*rel == '/')
        rel++;
    return *rel ? rel : NULL;
}

/* Whether rel names something below the root: not empty, not absolute, no "..". */
static bool rel_is_plain(const char *rel)
{
    if (!rel || !*rel || rel[0] == '/' || has_dotdot(rel))
        return false;
    for (const char *s = rel; *s; s++)
        if (*s != '/' && *s != '.')
            return true;
    return false; /* only "." and slashes: the root itself */
}

static int refuse(enum lora_path_confine_error *why, enum lora_path_confine_error w, int e)
{
    *why = w;
    errno = e;
    return -1;
}

/* Explains why opening rel failed with errno e at a component. */
static int open_failed(int dir_fd, const char *comp, const char *label, const char *rel, int e,
                       enum lora_path_confine_error *why, char *err, size_t err_len)
{
    struct stat st;

    if (e == ENOENT) {
        lora_errf(err, err_len, "%s/%s: no such file or directory", label, rel);
        return refuse(why, LORA_CONFINE_MISSING, e);
    }
    if (fstatat(dir_fd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        lora_errf(err, err_len,
                  "%s/%s: '%s' is a symbolic link, and links under the adapter root are refused",
                  label, rel, comp);
        return refuse(why, LORA_CONFINE_SYMLINK, ELOOP);
    }
    if (e == ENOTDIR) {
        lora_errf(err, err_len, "%s/%s: '%s' is not a directory", label, rel, comp);
        return refuse(why, LORA_CONFINE_NOT_DIR, e);
    }
    lora_errf(err, err_len, "%s/%s: unable to open: %s", label, rel, strerror(e));
    return refuse(why, LORA_CONFINE_ESCAPE, e);
}

int lora_path_confine_open_walk(int root_fd, const char *label, const char *rel, int flags,
                           bool allow_symlinks, enum lora_path_confine_error *why, char *err,
                           size_t err_len)
{
    char buf[PATH_MAX];
    int fd = root_fd;

    if (!rel_is_plain(rel) || strlen(rel) >= sizeof(buf)) {
        lora_errf(err, err_len, "%s/%s: not a path below the adapter root", label, rel ? rel : "");
        return refuse(why, LORA_CONFINE_ESCAPE, EINVAL);
    }
    snprintf(buf, sizeof(buf), "%s", rel);
    char *save = NULL, *comp = strtok_r(buf, "/", &save);
    while (comp) {
        char *next = strtok_r(NULL, "/", &save);
        while (next && strcmp(next, ".") == 0)
            next = strtok_r(NULL, "/", &save);
        if (strcmp(comp, ".") == 0) {
            comp = next;
            continue;
        }
        int f = next ? O_RDONLY | O_DIRECTORY : O_RDONLY | O_NONBLOCK | O_NOCTTY | flags;
        int nfd = openat(fd, comp, f | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0) {
            int e = errno;
            open_failed(fd, comp, label, rel, e, why, err, err_len);
            if (*why == LORA_CONFINE_SYMLINK && allow_symlinks)
                lora_errf(err, err_len,
                          "%s/%s: '%s' is a symbolic link, and this kernel lacks openat2 to "
                          "follow it safely beneath the adapter root",
                          label, rel, comp);
            if (fd != root_fd)
                close(fd);
            return -1;
        }
        if (fd != root_fd)
            close(fd);
        fd = nfd;
        comp = next;
    }
    *why = LORA_CONFINE_OK;
    return fd;
}

int lora_path_confine_open(int root_fd, const char *label, const char *rel, int flags,
                      bool allow_symlinks, enum lora_path_confine_error *why, char *err, size_t err_len)
{
    if (!rel_is_plain(rel)) {
        lora_errf(err, err_len, "%s/%s: not a path below the adapter root", label, rel ? rel : "");
        return refuse(why, LORA_CONFINE_ESCAPE, EINVAL);
    }
    struct open_how how = {
        .flags = (uint64_t)(O_RDONLY | O_CLOEXEC | flags |
                            (flags & O_DIRECTORY ? 0 : O_NONBLOCK | O_NOCTTY) |
                            (allow_symlinks ? 0 : O_NOFOLLOW)),
        .resolve =
            RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | (allow_symlinks ? 0 : RESOLVE_NO_SYMLINKS),
    };
    int fd = (int)syscall(SYS_openat2, root_fd, rel, &how, sizeof(how));
    if (fd >= 0) {
        *why = LORA_CONFINE_OK;
        return fd;
    }
    int e = errno;
    if (e == ENOSYS || e == EPERM) /* no openat2, or a seccomp filter that refuses it */
        return lora_path_confine_open_walk(root_fd, label, rel, flags, allow_symlinks, why, err,
                                      err_len);
    if (e == EXDEV) {
        lora_errf(err, err_len, "%s/%s: leads outside the adapter root", label, rel);
        return refuse(why, LORA_CONFINE_ESCAPE, e);
    }
    if (!allow_symlinks) {
        /* openat2 says ELOOP or ENOTDIR for a link, whichever check comes first; the walk,
         * as safe, says which component is what. */
        int fd2 = lora_path_confine_open_walk(root_fd, label, rel, flags, false, why, err, err_len);
        return fd2; /* opened when it was swapped back meanwhile: as safe */
    }
    if (e == ENOENT) {
        lora_errf(err, err_len, "%s/%s: no such file or directory", label, rel);
        return refuse(why, LORA_CONFINE_MISSING, e);
    }
    if (e == ENOTDIR) {
        lora_errf(err, err_len, "%s/%s: not a directory", label, rel);
        return refuse(why, LORA_CONFINE_NOT_DIR, e);
    }
    if (e == ENXIO) { /* a socket */
        lora_errf(err, err_len, "%s/%s: not a regular file (a socket)", label, rel);
        return refuse(why, LORA_CONFINE_NOT_DIR, e);
    }
    lora_errf(err, err_len, "%s/%s: unable to open: %s", label, rel, strerror(e));
    return refuse(why, LORA_CONFINE_ESCAPE, e);
}
