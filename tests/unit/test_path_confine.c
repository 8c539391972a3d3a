/* path_confine: every escape is refused with its reason; paths inside come back resolved. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/fs.h"
#include "base/path_confine.h"

static char base[PATH_MAX], root[PATH_MAX + 8];

static void setup(void)
{
    char tmpl[] = "/tmp/test_path_confine.XXXXXX";
    char *d = mkdtemp(tmpl);
    char *r = d ? realpath(d, NULL) : NULL;
    snprintf(base, sizeof(base), "%s", r ? r : "/nonexistent");
    free(r);
    snprintf(root, sizeof(root), "%s/root", base);
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/a/sub", root);
    lora_fs_mkdir_p(p, NULL, 0);
    snprintf(p, sizeof(p), "%s/outside", base);
    lora_fs_mkdir_p(p, NULL, 0);
    snprintf(p, sizeof(p), "%s/file", root);
    FILE *f = fopen(p, "w");
    if (f)
        fclose(f);
    char target[PATH_MAX + 64];
    snprintf(target, sizeof(target), "%s/outside", base);
    snprintf(p, sizeof(p), "%s/out-link", root);
    if (symlink(target, p) < 0)
        perror("symlink");
    snprintf(p, sizeof(p), "%s/in-link", root);
    if (symlink("a", p) < 0)
        perror("symlink");
    snprintf(p, sizeof(p), "%s/a/file-link", root);
    if (symlink("../file", p) < 0)
        perror("symlink");
    snprintf(p, sizeof(p), "%s/a/up-link", root);
    if (symlink("../..", p) < 0)
        perror("symlink");
    snprintf(p, sizeof(p), "%s/fifo", root);
    if (mkfifo(p, 0600) < 0)
        perror("mkfifo");
}

static bool allow;

static enum lora_path_confine_error try(const char *path, char **out)
{
    enum lora_path_confine_error why;
    char err[512];
    *out = lora_path_confine(root, path, allow, &why, err, sizeof(err));
    if (!*out)
        printf("# %s: %s\n", path, err);
    return why;
}

static void test_inside(void)
{
    char *r, want[PATH_MAX + 16];
    snprintf(want, sizeof(want), "%s/a", root);
    CHECK(try("a", &r) == LORA_CONFINE_OK && r && strcmp(r, want) == 0);
    free(r);
    CHECK(try(want, &r) == LORA_CONFINE_OK && r && strcmp(r, want) == 0);
    free(r);
    /* A link that stays under the root: refused, unless links are allowed. */
    CHECK(try("in-link", &r) == LORA_CONFINE_SYMLINK && !r);
    CHECK(try("in-link/sub", &r) == LORA_CONFINE_SYMLINK && !r);
    allow = true;
    CHECK(try("in-link", &r) == LORA_CONFINE_OK && r && strcmp(r, want) == 0);
    free(r);
    CHECK(try("out-link", &r) == LORA_CONFINE_ESCAPE && !r);
    allow = false;
    CHECK(try("./a/sub/", &r) == LORA_CONFINE_OK && r);
    free(r);
}

static void test_escapes(void)
{
    char *r, p[PATH_MAX + 32];
    CHECK(try("../outside", &r) == LORA_CONFINE_ESCAPE && !r);
    CHECK(try("a/../a", &r) == LORA_CONFINE_ESCAPE && !r);
    CHECK(try("a/..", &r) == LORA_CONFINE_ESCAPE && !r);
    snprintf(p, sizeof(p), "%s/outside", base);
    CHECK(try(p, &r) == LORA_CONFINE_ESCAPE && !r);
    CHECK(try("/etc", &r) == LORA_CONFINE_ESCAPE && !r);
    CHECK(try("out-link", &r) == LORA_CONFINE_ESCAPE && !r);
    snprintf(p, sizeof(p), "%sx/a", root); /* a sibling whose name starts like the root */
    CHECK(try(p, &r) == LORA_CONFINE_ESCAPE && !r);
    CHECK(try(root, &r) == LORA_CONFINE_ESCAPE && !r); /* the root itself is no adapter */
    CHECK(try("", &r) == LORA_CONFINE_ESCAPE && !r);
}

static void test_missing_and_files(void)
{
    char *r;
    enum lora_path_confine_error why;
    char err[512];
    CHECK(try("nope", &r) == LORA_CONFINE_MISSING && !r);
    CHECK(try("file", &r) == LORA_CONFINE_NOT_DIR && !r);
    CHECK(try("file/x", &r) == LORA_CONFINE_MISSING && !r);
    r = lora_path_confine(root, "../x", false, &why, err, sizeof(err));
    CHECK_CONTAINS(err, "'../x': a path with '..' is not accepted");
    r = lora_path_confine(root, "out-link", false, &why, err, sizeof(err));
    CHECK_CONTAINS(err, "leads outside the adapter root");
    r = lora_path_confine(root, "nope", false, &why, err, sizeof(err));
    CHECK_CONTAINS(err, "no such adapter directory");
}

typedef int (*open_fn)(int, const char *, const char *, int, bool, enum lora_path_confine_error *,
                       char *, size_t);

/* Opens rel beneath the root with fn; returns why, closing what opened. */
static enum lora_path_confine_error open_under(open_fn fn, const char *rel, int flags, bool links)
{
    enum lora_path_confine_error why = LORA_CONFINE_OK;
    char err[512];
    int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = fn(rfd, "ROOT", rel, flags, links, &why, err, sizeof(err));
    if (fd >= 0)
        close(fd);
    else
        printf("# %s: %s\n", rel, err);
    close(rfd);
    return why;
}

/* Both ways (openat2, and the walk without it) give the same answers where links are refused. */
static void check_refusing_links(open_fn fn)
{
    CHECK(open_under(fn, "a", O_DIRECTORY, false) == LORA_CONFINE_OK);
    CHECK(open_under(fn, "a/sub", O_DIRECTORY, false) == LORA_CONFINE_OK);
    CHECK(open_under(fn, "./a//sub/", O_DIRECTORY, false) == LORA_CONFINE_OK);
    CHECK(open_under(fn, "file", 0, false) == LORA_CONFINE_OK);
    CHECK(open_under(fn, "in-link", O_DIRECTORY, false) == LORA_CONFINE_SYMLINK);
    CHECK(open_under(fn, "in-link/sub", O_DIRECTORY, false) == LORA_CONFINE_SYMLINK);
    CHECK(open_under(fn, "out-link", O_DIRECTORY, false) == LORA_CONFINE_SYMLINK);
    CHECK(open_under(fn, "a/file-link", 0, false) == LORA_CONFINE_SYMLINK);
    CHECK(open_under(fn, "../root/a", O_DIRECTORY, false) == LORA_CONFINE_ESCAPE);
    CHECK(open_under(fn, "a/../a", O_DIRECTORY, false) == LORA_CONFINE_ESCAPE);
    CHECK(open_under(fn, "/etc", O_DIRECTORY, false) == LORA_CONFINE_ESCAPE);
    CHECK(open_under(fn, ".", O_DIRECTORY, false) == LORA_CONFINE_ESCAPE);
    CHECK(open_under(fn, "nope", O_DIRECTORY, false) == LORA_CONFINE_MISSING);
    CHECK(open_under(fn, "file", O_DIRECTORY, false) == LORA_CONFINE_NOT_DIR);
    /* A FIFO opens without blocking; the caller checks its kind. */
    CHECK(open_under(fn, "fifo", 0, false) == LORA_CONFINE_OK);
}

static void test_open_beneath(void)
{
    check_refusing_links(lora_path_confine_open);
    /* Links allowed: those that stay beneath the root are followed, the others refused. */
    CHECK(open_under(lora_path_confine_open, "in-link/sub", O_DIRECTORY, true) == LORA_CONFINE_OK);
    CHECK(open_under(lora_path_confine_open, "a/file-link", 0, true) == LORA_CONFINE_OK);
    CHECK(open_under(lora_path_confine_open, "out-link", O_DIRECTORY, true) == LORA_CONFINE_ESCAPE);
    CHECK(open_under(lora_path_confine_open, "a/up-link/outside", O_DIRECTORY, true) ==
          LORA_CONFINE_ESCAPE);
}

static void test_open_walk(void)
{
    check_refusing_links(lora_path_confine_open_walk);
    /* Without openat2 a link cannot be followed safely: refused even when allowed. */
    CHECK(open_under(lora_path_confine_open_walk, "in-link", O_DIRECTORY, true) == LORA_CONFINE_SYMLINK);
}

static void test_relative(void)
{
    CHECK(lora_path_confine_relative("/r", "/r/a") &&
          strcmp(lora_path_confine_relative("/r", "/r/a"), "a") == 0);
    CHECK(lora_path_confine_relative("/r/", "/r//a/b") &&
          strcmp(lora_path_confine_relative("/r/", "/r//a/b"), "a/b") == 0);
    CHECK(!lora_path_confine_relative("/r", "/r"));
    CHECK(!lora_path_confine_relative("/r", "/r/"));
    CHECK(!lora_path_confine_relative("/r", "/rx/a"));
    CHECK(!lora_path_confine_relative("/r", "/other"));
}

int main(void)
{
    setup();
    RUN(test_inside);
    RUN(test_escapes);
    RUN(test_missing_and_files);
    RUN(test_open_beneath);
    RUN(test_open_walk);
    RUN(test_relative);
    lora_fs_remove_tree(base);
    return check_done();
}
