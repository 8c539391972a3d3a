/* fuzz_util: the private directory and file writing of the fuzz targets (see fuzz.h). */
#include "fuzz.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];
static char path[8][512];
static int n_path;

static void remove_dir(void)
{
    for (int i = 0; i < n_path; i++)
        unlink(path[i]);
    rmdir(dir);
}

const char *fuzz_dir(void)
{
    if (!dir[0]) {
        /* A memory file system where there is one: writing each input to a disk-backed file
         * made the path-taking targets four times slower. */
        const char *tmp = getenv("TMPDIR");
        if (access("/dev/shm", W_OK | X_OK) == 0)
            tmp = "/dev/shm";
        snprintf(dir, sizeof(dir), "%s/lora-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: unable to create a temporary directory");
            abort();
        }
        atexit(remove_dir);
    }
    return dir;
}

const char *fuzz_write(const char *name, const void *data, size_t size)
{
    int i;
    char p[512];

    snprintf(p, sizeof(p), "%s/%s", fuzz_dir(), name);
    for (i = 0; i < n_path && strcmp(path[i], p) != 0; i++)
        ;
    if (i == n_path) {
        if (n_path == 8)
            abort();
        snprintf(path[n_path++], sizeof(path[0]), "%s", p);
    }
    int fd = open(path[i], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror("fuzz: unable to write an input");
        abort();
    }
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, (const char *)data + off, size - off);
        if (n <= 0) {
            perror("fuzz: unable to write an input");
            abort();
        }
        off += (size_t)n;
    }
    close(fd);
    return path[i];
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}
