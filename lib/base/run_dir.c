/* run_dir: whether a run directory is safe to use; see run_dir.h. */
#include "base/run_dir.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errbuf.h"

int lora_run_dir_check(const char *path, char *err, size_t err_len)
{
    struct stat st;
    uid_t me = geteuid();

    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        goto fail_errno;
    }
    if (S_ISLNK(st.st_mode)) {
        if (st.st_uid != me) {
            lora_errf(err, err_len, "run directory '%s' is a symbolic link owned by uid %u", path,
                      (unsigned)st.st_uid);
            return -1;
        }
        if (stat(path, &st) != 0) {
            if (errno == ENOENT)
                return 0; /* a dangling link: binding there fails with its own message */
            goto fail_errno;
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        lora_errf(err, err_len, "run directory '%s' is not a directory", path);
        return -1;
    }
    if (st.st_uid != me) {
        lora_errf(err, err_len, "run directory '%s' is owned by uid %u, not by uid %u (the caller)",
                  path, (unsigned)st.st_uid, (unsigned)me);
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        lora_errf(err, err_len, "run directory '%s' is writable by group or others (mode %04o)",
                  path, (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
fail_errno:
    lora_errf(err, err_len, "unable to examine run directory '%s': %s", path, strerror(errno));
    return -1;
}
