/* fs: directory helpers; see fs.h. */
#include "fs.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
