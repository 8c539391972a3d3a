/* run_dir: a run directory is accepted only when the caller owns it and no one else may write
 * to it; each refusal says why. The cases that need another owner run only as root. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/fs.h"
#include "base/run_dir.h"

#define NOBODY 65534

static char base[PATH_MAX];

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", base, name);
}

/* lora_run_dir_check on base/name: its return, and the message in err. */
static int check(const char *name, char *err, size_t len)
{
    char p[PATH_MAX + 64];
    path_of(p, sizeof(p), name);
    err[0] = '\0';
    int rc = lora_run_dir_check(p, err, len);
    if (rc < 0)
        printf("# %s: %s\n", name, err);
    return rc;
}

static void make_dir(const char *name, mode_t mode)
{
    char p[PATH_MAX + 64];
    path_of(p, sizeof(p), name);
    if (mkdir(p, 0700) != 0 || chmod(p, mode) != 0)
        perror(p);
}

static void test_own_private_dirs(void)
{
    char err[512];
    make_dir("private", 0700);
    make_dir("readable", 0755);
    CHECK(check("private", err, sizeof(err)) == 0);
    CHECK(check("readable", err, sizeof(err)) == 0);
    CHECK(check("missing", err, sizeof(err)) == 0);
    CHECK(err[0] == '\0');
}

static void test_writable_by_others(void)
{
    char err[512];
    make_dir("open", 0777);
    make_dir("group", 0770);
    make_dir("sticky", 01777);
    CHECK(check("open", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "/open' is writable by group or others (mode 0777)");
    CHECK(check("group", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "(mode 0770)");
    CHECK(check("sticky", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "(mode 1777)");
}

static void test_not_a_directory(void)
{
    char err[512], p[PATH_MAX + 64];
    path_of(p, sizeof(p), "file");
    FILE *f = fopen(p, "w");
    if (f)
        fclose(f);
    CHECK(check("file", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "/file' is not a directory");
}

static void test_links(void)
{
    char err[512], p[PATH_MAX + 64];
    path_of(p, sizeof(p), "to-private");
    if (symlink("private", p) != 0)
        perror(p);
    path_of(p, sizeof(p), "to-open");
    if (symlink("open", p) != 0)
        perror(p);
    CHECK(check("to-private", err, sizeof(err)) == 0);
    CHECK(check("to-open", err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, "/to-open' is writable by group or others (mode 0777)");
}

static void test_other_owners(void)
{
    char err[512], p[PATH_MAX + 64], want[128];
    if (geteuid() != 0) {
        printf("# skipped: needs root to give a directory to another user\n");
        return;
    }
    make_dir("theirs", 0700);
    path_of(p, sizeof(p), "theirs");
    if (chown(p, NOBODY, NOBODY) != 0)
        perror(p);
    CHECK(check("theirs", err, sizeof(err)) == -1);
    snprintf(want, sizeof(want), "/theirs' is owned by uid %d, not by uid 0 (the caller)", NOBODY);
    CHECK_CONTAINS(err, want);
    /* Our own directory behind someone else's link. */
    path_of(p, sizeof(p), "their-link");
    if (symlink("private", p) != 0 || lchown(p, NOBODY, NOBODY) != 0)
        perror(p);
    CHECK(check("their-link", err, sizeof(err)) == -1);
    snprintf(want, sizeof(want), "/their-link' is a symbolic link owned by uid %d", NOBODY);
    CHECK_CONTAINS(err, want);
}

int main(void)
{
    char tmpl[] = "/tmp/test_run_dir.XXXXXX";
    char *d = mkdtemp(tmpl);
    snprintf(base, sizeof(base), "%s", d ? d : "/nonexistent");
    RUN(test_own_private_dirs);
    RUN(test_writable_by_others);
    RUN(test_not_a_directory);
    RUN(test_links);
    RUN(test_other_owners);
    lora_fs_remove_tree(base);
    return check_done();
}
