/* lora-bench: energy counters, where the machine has them; see bench.h.
 *
 * NVML: libnvidia-ml.so.1 is opened at run time (dlopen), so the program needs no NVIDIA
 * library to build or run; every GPU whose nvmlDeviceGetTotalEnergyConsumption answers is
 * read (millijoules since the driver loaded). RAPL: the package domains under
 * /sys/class/powercap (intel-rapl:N, the names AMD's driver uses too; their subzones are
 * parts of the package and are not added again), energy_uj wrapping at max_energy_range_uj.
 * A snapshot lists each counter's reading; a delta adds the counters' differences, a counter
 * that went back being taken as one wrap.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_GPUS 64
#define MAX_RAPL 16

typedef int (*nvml_void_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *);
typedef int (*nvml_handle_fn)(unsigned int, void **);
typedef int (*nvml_energy_fn)(void *, unsigned long long *);

struct energy {
    void *lib;
    nvml_void_fn shutdown;
    nvml_energy_fn read_energy;
    void *gpus[MAX_GPUS];
    int n_gpus;
    char rapl[MAX_RAPL][512]; /* directories */
    double rapl_range_j[MAX_RAPL];
    int n_rapl;
    char why_not[512];
};

static bool read_ull(const char *path, unsigned long long *v)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fscanf(f, "%llu", v) == 1;
    fclose(f);
    return ok;
}

static void open_nvml(struct energy *e)
{
    e->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!e->lib)
        return;
    nvml_void_fn init = (nvml_void_fn)dlsym(e->lib, "nvmlInit_v2");
    nvml_count_fn count = (nvml_count_fn)dlsym(e->lib, "nvmlDeviceGetCount_v2");
    nvml_handle_fn handle = (nvml_handle_fn)dlsym(e->lib, "nvmlDeviceGetHandleByIndex_v2");
    e->shutdown = (nvml_void_fn)dlsym(e->lib, "nvmlShutdown");
    e->read_energy = (nvml_energy_fn)dlsym(e->lib, "nvmlDeviceGetTotalEnergyConsumption");
    unsigned int n = 0;
    if (!init || !count || !handle || !e->read_energy || init() != 0) {
        dlclose(e->lib);
        e->lib = NULL;
        return;
    }
    if (count(&n) != 0)
        n = 0;
    for (unsigned int i = 0; i < n && e->n_gpus < MAX_GPUS; i++) {
        void *h = NULL;
        unsigned long long mj;
        if (handle(i, &h) == 0 && e->read_energy(h, &mj) == 0)
            e->gpus[e->n_gpus++] = h;
    }
}

static void open_rapl(struct energy *e, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d)) && e->n_rapl < MAX_RAPL;) {
        const char *colon = strchr(de->d_name, ':');
        /* intel-rapl:0 is a package; intel-rapl:0:0 a part of it. */
        if (!colon || strchr(colon + 1, ':'))
            continue;
        char path[1024];
        unsigned long long v, range = 0;
        snprintf(e->rapl[e->n_rapl], sizeof(e->rapl[0]), "%s/%s", dir, de->d_name);
        snprintf(path, sizeof(path), "%s/energy_uj", e->rapl[e->n_rapl]);
        if (!read_ull(path, &v))
            continue; /* absent, or readable by root only */
        snprintf(path, sizeof(path), "%s/max_energy_range_uj", e->rapl[e->n_rapl]);
        read_ull(path, &range);
        e->rapl_range_j[e->n_rapl] = (double)range * 1e-6;
        e->n_rapl++;
    }
    closedir(d);
}

struct energy *energy_open(bool nvml, const char *powercap_dir)
{
    struct energy *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    if (nvml)
        open_nvml(e);
    open_rapl(e, powercap_dir ? powercap_dir : "/sys/class/powercap");
    if (!e->n_gpus && !e->n_rapl)
        snprintf(e->why_not, sizeof(e->why_not),
                 "not measured: %s, and no readable RAPL energy_uj under %s",
                 !nvml    ? "NVML not asked for"
                 : e->lib ? "NVML reports no GPU energy counter"
                          : "no libnvidia-ml.so.1",
                 powercap_dir ? powercap_dir : "/sys/class/powercap");
    return e;
}

void energy_close(struct energy **pe)
{
    struct energy *e = pe ? *pe : NULL;
    if (!e)
        return;
    if (e->lib) {
        if (e->shutdown)
            e->shutdown();
        dlclose(e->lib);
    }
    free(e);
    *pe = NULL;
}

bool energy_is_measured(const struct energy *e)
{
    return e && (e->n_gpus || e->n_rapl);
}

json_t *energy_describe(const struct energy *e)
{
    json_t *s = json_array();
    char name[600];
    for (int i = 0; e && i < e->n_gpus; i++) {
        snprintf(name, sizeof(name), "nvml:gpu%d", i);
        json_array_append_new(s, json_string(name));
    }
    for (int i = 0; e && i < e->n_rapl; i++) {
        snprintf(name, sizeof(name), "rapl:%s", e->rapl[i]);
        json_array_append_new(s, json_string(name));
    }
    return json_pack("{s:b, s:o, s:s}", "measured", energy_is_measured(e), "sources", s, "note",
                     energy_is_measured(e) ? ""
                     : e                   ? e->why_not
                                           : "not measured");
}

json_t *energy_snapshot(struct energy *e)
{
    if (!energy_is_measured(e))
        return NULL;
    json_t *c = json_array();
    for (int i = 0; i < e->n_gpus; i++) {
        unsigned long long mj = 0;
        bool ok = e->read_energy(e->gpus[i], &mj) == 0;
        json_array_append_new(c, ok ? json_pack("{s:f, s:f}", "j", (double)mj * 1e-3, "range", 0.0)
                                    : json_null());
    }
    for (int i = 0; i < e->n_rapl; i++) {
        char path[1024];
        unsigned long long uj = 0;
        snprintf(path, sizeof(path), "%s/energy_uj", e->rapl[i]);
        bool ok = read_ull(path, &uj);
        json_array_append_new(
            c, ok ? json_pack("{s:f, s:f}", "j", (double)uj * 1e-6, "range", e->rapl_range_j[i])
                  : json_null());
    }
    return json_pack("{s:o}", "counters", c);
}

double energy_delta(const json_t *before, const json_t *after)
{
    json_t *b = json_object_get(before, "counters"), *a = json_object_get(after, "counters");
    double sum = 0;

    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b))
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_array_get(b, i), *y = json_array_get(a, i);
        if (!json_is_object(x) || !json_is_object(y))
            return -1; /* a counter that could not be read */
        double d =
            json_real_value(json_object_get(y, "j")) - json_real_value(json_object_get(x, "j"));
        double range = json_real_value(json_object_get(y, "range"));
        if (d < 0 && range > 0)
            d += range;
        if (d < 0)
            return -1;
        sum += d;
    }
    return sum;
}
