/* fs: directory helpers; see fs.h. */
#include "base/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WALK_OPEN_FDS 16 /* directories nftw may hold open at once */

int lora_fs_mkdir_p(const char *path, char *err, size_t err_len)
{
    struct stat st;
    char *p = strdup(path);

    if (!p) {
        if (err && err_len > 0)
            snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    /* Each parent in turn (a leading '/' is the root, not a parent to create), then path. */
    for (char *s = p; *s; s++) {
        if (*s != '/' || s == p)
            continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            goto fail_errno;
        *s = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        goto fail_errno;
    if (stat(p, &st) != 0)
        goto fail_errno;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        goto fail_errno;
    }
    free(p);
    return 0;
fail_errno:
    if (err && err_len > 0)
        snprintf(err, err_len, "%s: unable to create directory: %s", p, strerror(errno));
    free(p);
    return -1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

void lora_fs_remove_tree(const char *path)
{
    nftw(path, remove_entry, WALK_OPEN_FDS, FTW_DEPTH | FTW_PHYS);
}

const char *lora_fs_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "not a regular file";
}

int lora_fs_check_regular(int fd, const char *label, struct stat *st, char *err, size_t err_len)
{
    struct stat own;

    if (!st)
        st = &own;
    if (fstat(fd, st) < 0) {
        snprintf(err, err_len, "%s: unable to stat: %s", label, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, err_len, "%s: not a regular file (%s)", label, lora_fs_kind(st->st_mode));
        errno = EINVAL;
        return -1;
    }
    return 0;
}

int lora_fs_open_regular(int dir_fd, const char *path, const char *label, bool follow,
                         struct stat *st, char *err, size_t err_len)
{
    struct stat lst;
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (follow ? 0 : O_NOFOLLOW);
    int fd = openat(dir_fd, path, flags);

    if (!label)
        label = path;
    if (fd < 0) {
        int e = errno;
        /* Say what is there when open refused it: a socket answers ENXIO, a link ELOOP. */
        bool known = e != ENOENT &&
                     fstatat(dir_fd, path, &lst, follow ? 0 : AT_SYMLINK_NOFOLLOW) == 0;
        if (known && S_ISLNK(lst.st_mode))
            snprintf(err, err_len, "%s: a symbolic link, refused (links are not followed here)",
                     label);
        else if (known && !S_ISREG(lst.st_mode))
            snprintf(err, err_len, "%s: not a regular file (%s)", label, lora_fs_kind(lst.st_mode));
        else
            snprintf(err, err_len, "%s: unable to open: %s", label, strerror(e));
        errno = e;
        return -1;
    }
    if (lora_fs_check_regular(fd, label, st, err, err_len) < 0) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}
