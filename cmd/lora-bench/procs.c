/* lora-bench: the CPU time of the stack's processes, per program, from /proc; see bench.h.
 *
 * A process is named by /proc/PID/comm (lora-worker, lora-engine, ...) and identified by its
 * pid and start time together, so a pid reused by another process between two snapshots is
 * not mistaken for the same one. CPU time is utime + stime of /proc/PID/stat, all threads,
 * in clock ticks (usually 10 ms).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errbuf.h"
#include "bench.h"

/* comm, CPU seconds and start time (ticks since boot) of pid; false when it is gone. */
static bool read_proc(long pid, char *comm, size_t comm_len, double *cpu_s, double *start)
{
    char path[64], buf[4096];
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    if (!(f = fopen(path, "r")))
        return false;
    if (!fgets(comm, (int)comm_len, f))
        comm[0] = 0;
    fclose(f);
    comm[strcspn(comm, "\n")] = 0;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if (!(f = fopen(path, "r")))
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* The name may hold spaces and parentheses: the fields start after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return false;
    unsigned long long utime = 0, stime = 0, starttime = 0;
    int field = 2; /* the ')' ends field 2 */
    for (char *save, *t = strtok_r(p + 1, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 14)
            utime = strtoull(t, NULL, 10);
        else if (field == 15)
            stime = strtoull(t, NULL, 10);
        else if (field == 22) {
            starttime = strtoull(t, NULL, 10);
            break;
        }
    }
    if (field < 22)
        return false;
    double hz = (double)sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(utime + stime) / hz;
    *start = (double)starttime;
    return true;
}

static void add_proc(json_t *list, long pid)
{
    char comm[64];
    double cpu, start;
    if (read_proc(pid, comm, sizeof(comm), &cpu, &start))
        json_array_append_new(list, json_pack("{s:I, s:s, s:f, s:f}", "pid", (json_int_t)pid,
                                              "program", comm, "cpu_s", cpu, "start", start));
}

json_t *procs_snapshot(const struct procs_spec *spec, char *err, size_t err_len)
{
    json_t *list = json_array();

    if (spec && spec->run_dir) {
        /* lora-stack up writes "NAME PID" lines: worker-0 123, engine 124, ... */
        char path[4096], line[256];
        snprintf(path, sizeof(path), "%s/pids", spec->run_dir);
        FILE *f = fopen(path, "r");
        if (!f) {
            lora_errf_path(err, err_len, path, "unable to read: %s", strerror(errno));
            json_decref(list);
            return NULL;
        }
        while (fgets(line, sizeof(line), f)) {
            char *sp = strrchr(line, ' ');
            long pid = sp ? strtol(sp + 1, NULL, 10) : 0;
            if (pid > 0)
                add_proc(list, pid);
        }
        fclose(f);
    }
    for (int i = 0; spec && i < spec->n_pids; i++)
        add_proc(list, spec->pids[i]);
    if (spec && (spec->run_dir || spec->n_pids))
        return list;
    DIR *d = opendir("/proc");
    if (!d) {
        lora_errf(err, err_len, "/proc: unable to read: %s", strerror(errno));
        json_decref(list);
        return NULL;
    }
    long self = (long)getpid();
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        long pid = strtol(e->d_name, NULL, 10);
        char comm[64];
        double cpu, start;
        if (pid == self || !read_proc(pid, comm, sizeof(comm), &cpu, &start))
            continue;
        if (strncmp(comm, "lora-", 5) == 0 && strcmp(comm, "lora-bench") != 0)
            json_array_append_new(list, json_pack("{s:I, s:s, s:f, s:f}", "pid", (json_int_t)pid,
                                                  "program", comm, "cpu_s", cpu, "start", start));
    }
    closedir(d);
    return list;
}

static const json_t *find(const json_t *list, const json_t *p)
{
    size_t i;
    json_t *q;
    json_array_foreach (list, i, q) {
        if (json_integer_value(json_object_get(q, "pid")) ==
                json_integer_value(json_object_get(p, "pid")) &&
            json_real_value(json_object_get(q, "start")) ==
                json_real_value(json_object_get(p, "start")))
            return q;
    }
    return NULL;
}

json_t *procs_delta(const json_t *before, const json_t *after)
{
    json_t *programs = json_object(), *procs = json_array(), *notes = json_array();
    double total = 0;
    size_t i;
    json_t *p;
    char note[256];

    json_array_foreach (after, i, p) {
        const json_t *q = find(before, p);
        const char *prog = json_string_value(json_object_get(p, "program"));
        double cpu = json_real_value(json_object_get(p, "cpu_s"));
        long long pid = json_integer_value(json_object_get(p, "pid"));
        if (q) {
            cpu -= json_real_value(json_object_get(q, "cpu_s"));
        } else {
            snprintf(note, sizeof(note),
                     "%s (pid %lld) started during the window: all its CPU time counts", prog, pid);
            json_array_append_new(notes, json_string(note));
        }
        json_object_set_new(programs, prog,
                            json_real(json_real_value(json_object_get(programs, prog)) + cpu));
        json_array_append_new(procs, json_pack("{s:I, s:s, s:f}", "pid", (json_int_t)pid, "program",
                                               prog, "cpu_s", cpu));
        total += cpu;
    }
    json_array_foreach (before, i, p) {
        if (find(after, p))
            continue;
        snprintf(note, sizeof(note), "%s (pid %lld) ended during the window: its CPU time is lost",
                 json_string_value(json_object_get(p, "program")),
                 (long long)json_integer_value(json_object_get(p, "pid")));
        json_array_append_new(notes, json_string(note));
    }
    return json_pack("{s:o, s:f, s:o, s:o}", "programs", programs, "total_s", total, "processes",
                     procs, "notes", notes);
}
