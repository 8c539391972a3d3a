/* registry_file: round trip in order, every broken file an error naming its path, a missing file
 * told apart, atomic replacement (an open reader keeps the old file, no temporary file stays). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/fs.h"
#include "sched/registry_file.h"

static char dir[64];

static const char *in_dir(const char *name)
{
    static char p[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
    return p[k];
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static char *get(const char *path)
{
    static char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return buf;
}

static void test_round_trip(void)
{
    struct lora_registry r = {0}, back;
    char err[512] = "";
    const char *path = in_dir("round.json");

    /* Names that sort differently from their registration order. */
    CHECK(lora_registry_file_add(&r, "zeta", "/m/adapters/zeta", false) == 0);
    CHECK(lora_registry_file_add(&r, "alpha", "/m/adapters/alpha", true) == 0);
    CHECK(lora_registry_file_add(&r, "mid \"quoted\"", "relative/dir", false) == 0);
    CHECK(lora_registry_file_add_startup(&r, "alpha") == 0);
    CHECK(lora_registry_file_add_startup(&r, "gone") == 0);
    CHECK(lora_registry_file_write(path, &r, err, sizeof(err)) == 0);
    CHECK(lora_registry_file_read(path, &back, err, sizeof(err)) == 0);
    CHECK(back.n_adapters == 3 && back.n_startup == 2);
    if (back.n_adapters == 3) {
        CHECK(strcmp(back.adapters[0].name, "zeta") == 0 && !back.adapters[0].pinned);
        CHECK(strcmp(back.adapters[1].name, "alpha") == 0 && back.adapters[1].pinned);
        CHECK(strcmp(back.adapters[1].path, "/m/adapters/alpha") == 0);
        CHECK(strcmp(back.adapters[2].name, "mid \"quoted\"") == 0);
        CHECK(strcmp(back.adapters[2].path, "relative/dir") == 0);
    }
    CHECK(lora_registry_file_has_startup(&back, "gone") && !lora_registry_file_has_startup(&back, "zeta"));
    CHECK(lora_registry_file_find(&back, "alpha") == 1 && lora_registry_file_find(&back, "nope") == -1);
    /* The file is what the header documents, readable by other tools. */
    CHECK_CONTAINS(get(path), "\"version\": 1");
    CHECK_CONTAINS(get(path), "\"startup_modules\"");
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    lora_registry_file_release(&r);
    lora_registry_file_release(&back);
    CHECK(back.n_adapters == 0 && back.adapters == NULL);
}

static void test_empty_round_trip(void)
{
    struct lora_registry r = {0}, back;
    char err[512] = "";
    const char *path = in_dir("empty.json");

    CHECK(lora_registry_file_write(path, &r, err, sizeof(err)) == 0);
    CHECK(lora_registry_file_read(path, &back, err, sizeof(err)) == 0);
    CHECK(back.n_adapters == 0 && back.n_startup == 0);
    lora_registry_file_release(&back);
}

static void test_missing_is_not_an_error(void)
{
    struct lora_registry r;
    char err[512] = "";
    CHECK(lora_registry_file_read(in_dir("absent.json"), &r, err, sizeof(err)) == 1);
    CHECK(r.n_adapters == 0);
}

/* Each broken file: -1, and the message names the path and what is wrong. */
static void expect_error(const char *text, const char *want)
{
    struct lora_registry r;
    char err[1024] = "";
    const char *path = in_dir("broken.json");

    put(path, text);
    CHECK(lora_registry_file_read(path, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, want);
    CHECK(r.n_adapters == 0 && r.adapters == NULL);
}

static void test_corrupt(void)
{
    expect_error("", "invalid JSON");
    expect_error("{\"version\": 1, \"adapters\": [", "invalid JSON");
    expect_error("[]", "top level must be a JSON object");
    expect_error("{\"adapters\": []}", "\"version\" must be 1");
    expect_error("{\"version\": 2, \"adapters\": []}", "\"version\" must be 1");
    expect_error("{\"version\": 1}", "\"adapters\" must be an array");
    expect_error("{\"version\": 1, \"adapters\": [{\"path\": \"/a\", \"pinned\": false}]}",
                 "adapters[0].name");
    expect_error("{\"version\": 1, \"adapters\": [{\"name\": \"\", \"path\": \"/a\", "
                 "\"pinned\": false}]}",
                 "adapters[0].name");
    expect_error("{\"version\": 1, \"adapters\": [{\"name\": \"a\", \"path\": 3, "
                 "\"pinned\": false}]}",
                 "adapters[0].path");
    expect_error("{\"version\": 1, \"adapters\": [{\"name\": \"a\", \"path\": \"/a\"}]}",
                 "adapters[0].pinned");
    expect_error("{\"version\": 1, \"adapters\": [{\"name\": \"a\", \"path\": \"/a\", "
                 "\"pinned\": false}, {\"name\": \"a\", \"path\": \"/b\", \"pinned\": true}]}",
                 "adapters[1]: adapter 'a' is listed twice");
    expect_error("{\"version\": 1, \"adapters\": [], \"startup_modules\": [1]}",
                 "startup_modules[0]");
    expect_error("{\"version\": 1, \"version\": 1, \"adapters\": []}", "invalid JSON");
}

static void test_unreadable(void)
{
    struct lora_registry r;
    char err[1024] = "";
    const char *path = in_dir("a-directory.json");

    CHECK(mkdir(path, 0700) == 0);
    CHECK(lora_registry_file_read(path, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, "unable to read: is a directory");
    /* A path through a regular file cannot be opened: not "missing", an error. */
    const char *file = in_dir("plain");
    put(file, "x");
    char through[300];
    snprintf(through, sizeof(through), "%s/registry.json", file);
    CHECK(lora_registry_file_read(through, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, through);
    CHECK_CONTAINS(err, "unable to open: Not a directory");
}

static int count_entries(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strstr(de->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_atomic_replace(void)
{
    struct lora_registry a = {0}, b = {0}, back;
    char err[512] = "";
    const char *path = in_dir("atomic.json");

    lora_registry_file_add(&a, "first", "/p/first", false);
    lora_registry_file_add(&b, "second", "/p/second", true);
    CHECK(lora_registry_file_write(path, &a, err, sizeof(err)) == 0);
    struct stat before, after;
    CHECK(stat(path, &before) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK(lora_registry_file_write(path, &b, err, sizeof(err)) == 0);
    CHECK(stat(path, &after) == 0);
    /* A new file took the old one's name: a reader that opened the old one reads it whole. */
    CHECK(before.st_ino != after.st_ino);
    char old[4096] = "";
    ssize_t n = fd >= 0 ? read(fd, old, sizeof(old) - 1) : -1;
    if (n > 0)
        old[n] = 0;
    CHECK_CONTAINS(old, "\"first\"");
    CHECK(strstr(old, "second") == NULL);
    if (fd >= 0)
        close(fd);
    CHECK(lora_registry_file_read(path, &back, err, sizeof(err)) == 0);
    CHECK(back.n_adapters == 1 && strcmp(back.adapters[0].name, "second") == 0 &&
          back.adapters[0].pinned);
    CHECK(count_entries() == 0);
    lora_registry_file_release(&back);

    /* A write that cannot complete leaves the old file as it was, and no temporary file. */
    const char *blocked = in_dir("blocked.json");
    CHECK(lora_registry_file_write(blocked, &a, err, sizeof(err)) == 0);
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", blocked, (long)getpid());
    CHECK(mkdir(tmp, 0700) == 0); /* the temporary file's name is taken by a directory */
    CHECK(lora_registry_file_write(blocked, &b, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, blocked);
    CHECK_CONTAINS(err, "temporary file");
    rmdir(tmp);
    CHECK(lora_registry_file_read(blocked, &back, err, sizeof(err)) == 0);
    CHECK(back.n_adapters == 1 && strcmp(back.adapters[0].name, "first") == 0);
    lora_registry_file_release(&back);
    lora_registry_file_release(&a);
    lora_registry_file_release(&b);
}

static void test_write_error_names_path(void)
{
    struct lora_registry r = {0};
    char err[512] = "", path[300];
    snprintf(path, sizeof(path), "%s/no/such/dir/registry.json", dir);
    CHECK(lora_registry_file_write(path, &r, err, sizeof(err)) == -1);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, "No such file or directory");
}

/* Mutants of a valid file (bytes changed, cut short): each is read back or refused with its
 * path, never a crash; whatever is read back keeps the module's rules. */
static void test_mutants(void)
{
    static const char valid[] = "{\"version\": 1, \"adapters\": [{\"name\": \"a\", \"path\": "
                                "\"/p/a\", \"pinned\": true}, {\"name\": \"b\", \"path\": "
                                "\"/p/b\", \"pinned\": false}], \"startup_modules\": [\"a\"]}";
    static const char alphabet[] = "{}[]\":,01 truefalsenl\\ab/";
    const char *path = in_dir("mutant.json");
    uint64_t x = 0x9e3779b97f4a7c15u;
    int n_read = 0, n_refused = 0;

    for (int i = 0; i < 3000; i++) {
        char text[sizeof(valid)];
        memcpy(text, valid, sizeof(valid));
        size_t len = sizeof(valid) - 1;
        for (int k = 0; k < 1 + i % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            text[x % len] = alphabet[(x >> 32) % (sizeof(alphabet) - 1)];
        }
        if (i % 5 == 0)
            len = (size_t)(x >> 40) % len;
        text[len] = 0;
        put(path, text);
        struct lora_registry r;
        char err[1024] = "";
        int rc = lora_registry_file_read(path, &r, err, sizeof(err));
        if (rc == 0) {
            n_read++;
            for (int a = 0; a < r.n_adapters; a++) {
                CHECK(strlen(r.adapters[a].name) >= 1 && strlen(r.adapters[a].path) >= 1);
                CHECK(lora_registry_file_find(&r, r.adapters[a].name) == a);
            }
            lora_registry_file_release(&r);
        } else {
            n_refused++;
            CHECK(rc == -1);
            CHECK_CONTAINS(err, path);
        }
    }
    printf("# 3000 mutants: %d read, %d refused\n", n_read, n_refused);
    CHECK(n_read > 0 && n_refused > 0);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/test_registry_file.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_round_trip);
    RUN(test_empty_round_trip);
    RUN(test_missing_is_not_an_error);
    RUN(test_corrupt);
    RUN(test_unreadable);
    RUN(test_atomic_replace);
    RUN(test_write_error_names_path);
    RUN(test_mutants);
    lora_fs_remove_tree(dir);
    return check_done();
}
