/* lora-engine: the engine core of lora-stack (docs/design.md, "Programs", "Wire protocol",
 * "Backend", "Residency"): options and start-up.
 *
 * Binds four sockets: frontends (ROUTER), workers (ROUTER), control (ROUTER) and publish (PUB).
 * Start-up: read the registry file (a corrupt one stops the engine here), wait for every worker
 * rank's hello (saying which ranks it still waits for), send each its setup, load the registry
 * file's adapters and then the --lora-modules it has not taken in yet on every rank, write the
 * file, gather every rank's notifications, then report ready (a line on stderr) and run the loop
 * (loop.c). A dead worker fails every request in flight and marks the engine unhealthy; with one
 * rank, a new worker process for the rank is set up with the rank's adapters and the engine
 * serves again (workers.c). A second worker for a rank a live worker holds is refused. Exit
 * codes: 0 on SIGTERM/SIGINT, 1 when the model, the registry file or an adapter of
 * --lora-modules is bad, 100 usage, 111 system failure.
 *
 * The files of the engine and the direction of their calls are in engine.h.
 * Calls: loop.c, adapters.c, frontends.c, workers.c, publish.c, registry.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters.h"
#include "base/cli.h"
#include "base/lora_module.h"
#include "base/run_dir.h"
#include "frontends.h"
#include "loop.h"
#include "publish.h"
#include "registry.h"
#include "runtime/model_config.h"
#include "workers.h"

static int open_sockets(struct engine *e, const char *run_dir, const char **eps, char *err,
                        size_t len)
{
    static const char *names[4] = {"frontend.sock", "worker.sock", "control.sock", "publish.sock"};
    static const int types[4] = {ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_PUB};
    struct lora_sock **socks[4] = {&e->front, &e->work, &e->ctl, &e->pub};
    char ep[4200];

    for (int i = 0; i < 4; i++) {
        if (eps[i])
            snprintf(ep, sizeof(ep), "%s", eps[i]);
        else if (run_dir)
            snprintf(ep, sizeof(ep), "ipc://%s/%s", run_dir, names[i]);
        else {
            snprintf(err, len, "give --run-dir or every endpoint");
            return -1;
        }
        *socks[i] = lora_sock_new(e->zctx, types[i], ep, true, NULL, err, len);
        if (!*socks[i])
            return -1;
    }
    return 0;
}

static int check_modules(const struct lora_cli_opt_list *mods, char *err, size_t len)
{
    struct lora_module m;
    for (int i = 0; i < mods->n; i++)
        if (lora_module_parse(mods->items[i], &m, err, len) < 0)
            return -1;
    return 0;
}

/* Checks the options against each other and the model before anything starts. */
static int check_options(const struct engine *e, const struct lora_model_config *cfg,
                         const char *run_dir, const char **eps, char *err, size_t len)
{
    if (cfg->n_heads % e->world || cfg->n_kv_heads % e->world ||
        cfg->intermediate_size % e->world) {
        snprintf(err, len,
                 "--tensor-parallel-size %d must divide the model's %d heads, %d KV heads and "
                 "intermediate size %d",
                 e->world, cfg->n_heads, cfg->n_kv_heads, cfg->intermediate_size);
        return -1;
    }
    for (int i = 0; i < 4 && !run_dir; i++) {
        if (!eps[i]) {
            snprintf(err, len, "give --run-dir, or all four --*-endpoint options");
            return -1;
        }
    }
    if (e->max_cpu_loras < e->max_loras) {
        snprintf(err, len, "--max-cpu-loras (%d) must be at least --max-loras (%d)",
                 e->max_cpu_loras, e->max_loras);
        return -1;
    }
    if (e->max_num_batched_tokens < e->max_num_seqs || e->max_requests < e->max_num_seqs) {
        snprintf(err, len,
                 "--max-num-batched-tokens and --max-requests must be at least --max-num-seqs");
        return -1;
    }
    if (e->max_model_len > cfg->max_position_embeddings) {
        snprintf(err, len, "--max-model-len %d exceeds the model's max_position_embeddings %d",
                 e->max_model_len, cfg->max_position_embeddings);
        return -1;
    }
    if (e->max_model_len < 2) {
        snprintf(err, len, "the context (--max-model-len %d) must hold 2 tokens", e->max_model_len);
        return -1;
    }
    return 0;
}

/* Appends "name" or "name (pinned)" to list, comma-separated, as long as it fits. */
static void list_add(char *list, size_t cap, const char *name, bool pinned)
{
    size_t n = strlen(list);
    if (n + strlen(name) + 16 < cap)
        snprintf(list + n, cap - n, "%s%s%s", n ? ", " : "", name, pinned ? " (pinned)" : "");
}

/* The start-up adapters: the registry file's, in their order and with their pins, then the
 * --lora-modules the file has not taken in yet. A file adapter that cannot be loaded (its
 * directory gone, say) is dropped with a warning so that the engine still starts; a start-up
 * module the file has taken in and that is no longer registered was unloaded at run time and
 * stays unloaded. A new start-up module that cannot be loaded fails start-up (exit 1). */
static int restore_adapters(struct engine *e, const struct lora_registry *file, bool had_file,
                            const struct lora_cli_opt_list *mods, char *err, size_t len)
{
    char done[2048] = "", why[800];
    int n_done = 0, n_failed = 0;

    for (int i = 0; i < file->n_adapters; i++) {
        const struct lora_registry_entry *a = &file->adapters[i];
        if (adapters_load(e, a->name, a->path, why, sizeof(why)) < 0) {
            if (e->stopping)
                return -1;
            fprintf(stderr,
                    "lora-engine: warning: registry '%s': adapter '%s' at '%s' cannot be "
                    "restored and is dropped from the registry: %s\n",
                    e->registry_path, a->name, a->path, why);
            n_failed++;
            continue;
        }
        bool pinned = a->pinned;
        if (pinned && adapters_pin(e, a->name, true, why, sizeof(why)) < 0) {
            fprintf(stderr,
                    "lora-engine: warning: registry '%s': adapter '%s' is restored "
                    "unpinned: %s\n",
                    e->registry_path, a->name, why);
            pinned = false;
        }
        list_add(done, sizeof(done), a->name, pinned);
        n_done++;
    }
    for (int i = 0; i < file->n_startup; i++)
        if (lora_registry_file_add_startup(&e->startup_seen, file->startup[i]) < 0)
            goto oom;
    for (int i = 0; i < mods->n; i++) {
        struct lora_module m;
        if (lora_module_parse(mods->items[i], &m, err, len) < 0)
            return -1;
        int k = lora_registry_file_find(file, m.name);
        if (k >= 0) {
            /* The file's entry wins: it holds what was loaded under that name. */
            if (strcmp(file->adapters[k].path, m.path) != 0)
                fprintf(stderr,
                        "lora-engine: note: start-up adapter '%s' keeps the registry's "
                        "path '%s', not '%s' (registry '%s')\n",
                        m.name, file->adapters[k].path, m.path, e->registry_path);
            continue;
        }
        if (lora_registry_file_has_startup(file, m.name)) {
            fprintf(stderr,
                    "lora-engine: note: start-up adapter '%s' stays unloaded: it was "
                    "unloaded at run time (registry '%s')\n",
                    m.name, e->registry_path);
            continue;
        }
        if (adapters_load(e, m.name, m.path, why, sizeof(why)) < 0) {
            snprintf(err, len, "adapter '%s': %.700s", m.name, why);
            return -1;
        }
        if (!lora_registry_file_has_startup(&e->startup_seen, m.name) &&
            lora_registry_file_add_startup(&e->startup_seen, m.name) < 0)
            goto oom;
    }
    if (had_file)
        fprintf(stderr, "lora-engine: restored: %d adapter%s from '%s'%s%s%s\n", n_done,
                n_done == 1 ? "" : "s", e->registry_path, n_done ? ": " : "", done,
                n_failed ? "; some could not be restored (see the warnings above)" : "");
    e->registry_live = true;
    registry_save(e);
    return 0;
oom:
    snprintf(err, len, "out of memory");
    return -1;
}

/* What does not depend on the KV cache, before the workers join. */
static int setup_state(struct engine *e, char *err, size_t len)
{
    e->reqs = calloc((size_t)e->max_requests, sizeof(*e->reqs));
    e->results = calloc((size_t)e->max_num_seqs, sizeof(*e->results));
    e->step_seqs = calloc((size_t)e->max_num_seqs, sizeof(*e->step_seqs));
    e->step_tokens = calloc((size_t)e->max_num_batched_tokens, sizeof(int32_t));
    e->workers_arena = lora_msg_arena_new();
    e->ops_arena = lora_msg_arena_new();
    e->frontends_arena = lora_msg_arena_new();
    e->control_arena = lora_msg_arena_new();
    e->step_arena = lora_msg_arena_new();
    if (!e->reqs || !e->results || !e->step_seqs || !e->step_tokens || !e->workers_arena ||
        !e->ops_arena || !e->frontends_arena || !e->control_arena || !e->step_arena) {
        snprintf(err, len, "out of memory");
        return -1;
    }
    return 0;
}

/* The scheduler and its block manager, once the ranks have said how many KV blocks they hold. */
static int setup_scheduler(struct engine *e, char *err, size_t len)
{
    struct lora_scheduler_config sc;

    lora_scheduler_config_default(&sc);
    sc.max_num_seqs = e->max_num_seqs;
    sc.max_num_batched_tokens = e->max_num_batched_tokens;
    sc.max_loras = e->max_loras;
    sc.block_size = e->block_size;
    sc.n_blocks = e->num_kv_blocks;
    sc.max_model_len = e->max_model_len;
    sc.max_requests = e->max_requests;
    sc.max_adapters = ENGINE_MAX_ADAPTERS;
    sc.async_activation = e->async_activate;
    e->sched = lora_scheduler_new(&sc, err, len);
    if (!e->sched || lora_scheduler_plan_init(e->sched, &e->plan) < 0)
        return -1;
    e->step_tables = calloc((size_t)e->num_kv_blocks + (size_t)e->max_num_seqs, sizeof(int32_t));
    if (!e->step_tables) {
        snprintf(err, len, "out of memory");
        return -1;
    }
    return 0;
}

static void teardown(struct engine *e)
{
    workers_stop(e);
    for (int i = 0; e->reqs && i < e->max_requests; i++)
        frontends_release_request(e, &e->reqs[i]);
    for (int r = 0; r < ENGINE_MAX_WORLD; r++)
        free(e->rank_state[r]);
    free(e->reqs);
    free(e->results);
    free(e->step_seqs);
    free(e->step_tokens);
    free(e->step_tables);
    lora_scheduler_plan_release(&e->plan);
    lora_scheduler_destroy(&e->sched);
    lora_msg_arena_destroy(&e->workers_arena);
    lora_msg_arena_destroy(&e->ops_arena);
    lora_msg_arena_destroy(&e->frontends_arena);
    lora_msg_arena_destroy(&e->control_arena);
    lora_msg_arena_destroy(&e->step_arena);
    publish_release();
    lora_registry_file_release(&e->startup_seen);
    for (int i = 0; i < e->n_startup_loads; i++)
        free((char *)e->startup_loads[i].name.s);
    free(e->startup_loads);
    lora_sock_destroy(&e->front);
    lora_sock_destroy(&e->work);
    lora_sock_destroy(&e->ctl);
    lora_sock_destroy(&e->pub);
    if (e->zctx)
        zmq_ctx_term(e->zctx);
    if (e->sig_fd >= 0)
        lora_signal_pipe_close(e->sig_fd);
}

int main(int argc, char **argv)
{
    struct engine e = {
        .sig_fd = -1,
        .healthy = true,
        .log_ctl = {.what = "malformed control messages"},
        .log_front = {.what = "malformed requests"},
        .log_hello = {.what = "refused or malformed worker hellos"},
    };
    const char *eps[4] = {NULL}, *run_dir = NULL, *registry = NULL;
    struct lora_registry file = {0};
    struct lora_cli_opt_list mods = {0};
    long tp = 1, idx = 0, max_loras = 4, max_cpu = 0, max_rank = 64, bs = 16, blocks = 0;
    long kv_bytes = 0, mbt = 512, mns = 64, mml = 0, idle = 100, startup = 120000;
    long maxreq = 1024;
    long publish_ms = 1000, seed = 0;
    const char *gen_source = "auto";
    double kv_fraction = 0, gpu_util = 0;
    bool help = false, version = false;
    const struct lora_cli_opt options[] = {
        {"model", LORA_OPT_STRING, &e.model, "DIR", "Hugging Face model directory"},
        {"run-dir", LORA_OPT_STRING, &run_dir, "DIR", "put the ipc sockets in DIR"},
        {"frontend-endpoint", LORA_OPT_STRING, &eps[0], "EP", "bind frontends here"},
        {"worker-endpoint", LORA_OPT_STRING, &eps[1], "EP", "bind workers here"},
        {"control-endpoint", LORA_OPT_STRING, &eps[2], "EP", "bind the control socket here"},
        {"publish-endpoint", LORA_OPT_STRING, &eps[3], "EP", "publish stats and events here"},
        {"tensor-parallel-size", LORA_OPT_INT, &tp, "N", "worker ranks (default 1)", 1,
         ENGINE_MAX_WORLD},
        {"engine-index", LORA_OPT_INT, &idx, "N", "the engine label (default 0)", 0, 1e6},
        {"max-loras", LORA_OPT_INT, &max_loras, "N", "adapter slots (default 4)", 1, 1024},
        {"max-cpu-loras", LORA_OPT_INT, &max_cpu, "N", "CPU adapter cache (default max-loras)", 0,
         65536},
        {"max-lora-rank", LORA_OPT_INT, &max_rank, "R", "highest adapter rank (default 64)", 1,
         4096},
        {"lora-modules", LORA_OPT_LIST, &mods, "NAME=PATH",
         "load before ready (repeatable; or vLLM's JSON {\"name\":..,\"path\":..})"},
        {"registry-file", LORA_OPT_STRING, &registry, "PATH",
         "keep the adapter registry here (default RUN_DIR/adapters.json; '' for none)"},
        {"block-size", LORA_OPT_INT, &bs, "N", "KV cache block size (default 16)", 1, 1024},
        {"gpu-memory-utilization", LORA_OPT_FLOAT, &gpu_util, "F",
         "as vLLM's: each GPU rank may use this share of its device's memory, and its KV cache "
         "gets what the weights, adapter slots and activations leave of it",
         0, 1},
        {"kv-cache-fraction", LORA_OPT_FLOAT, &kv_fraction, "F",
         "each rank sizes its KV cache as this fraction of the memory available to it", 0, 0.95},
        {"num-kv-blocks", LORA_OPT_INT, &blocks, "N",
         "at most N KV blocks per rank (default: as many as the budget holds)", 0, 1 << 24},
        {"kv-cache-bytes", LORA_OPT_INT, &kv_bytes, "N",
         "each rank's KV cache budget in bytes (default 268435456)", 1, 1e15},
        {"max-num-batched-tokens", LORA_OPT_INT, &mbt, "N", "token budget (default 512)", 1,
         1 << 20},
        {"max-num-seqs", LORA_OPT_INT, &mns, "N", "sequences per step (default 64)", 1, 4096},
        {"max-model-len", LORA_OPT_INT, &mml, "N", "context (default the model's, at most 4096)", 0,
         1 << 22},
        {"max-requests", LORA_OPT_INT, &maxreq, "N", "requests in the engine (default 1024)", 1,
         1 << 20},
        {"idle-notify-ms", LORA_OPT_INT, &idle, "MS", "gather notifications when idle (100)", 1,
         60000},
        {"publish-interval-ms", LORA_OPT_INT, &publish_ms, "MS",
         "publish the whole state this often (1000)", 10, 600000},
        {"seed", LORA_OPT_INT, &seed, "N",
         "as vLLM's: unseeded requests sample reproducibly from it (default 0)", 0, 9e15},
        {"startup-timeout-ms", LORA_OPT_INT, &startup, "MS", "wait for workers (default 120000)",
         100, 1e8},
        {"generation-config", LORA_OPT_STRING, &gen_source, "SRC",
         "default sampling parameters: auto (the model's generation_config.json), vllm (none) "
         "or a directory holding generation_config.json (default auto)"},
        {"help", LORA_OPT_FLAG, &help, NULL, "show this help"},
        {"version", LORA_OPT_FLAG, &version, NULL, "show the version"},
        {0},
    };
    char err[1024] = "";
    int rc = EXIT_SYSTEM;

    if (lora_cli_parse(options, "LORA_ENGINE", argc, argv, 1, err, sizeof(err)) < 0 ||
        (!help && !version && !e.model)) {
        fprintf(stderr, "lora-engine: fatal: %s\n", *err ? err : "--model DIR is required");
        return EXIT_USAGE;
    }
    if (help) {
        puts("usage: lora-engine --model DIR (--run-dir DIR | --*-endpoint EP...) [OPTIONS]\n");
        lora_cli_usage(stdout, options);
        return 0;
    }
    if (version) {
        puts("lora-engine " LORA_VERSION);
        return 0;
    }
    if (!lora_generation_config_is_source(gen_source)) {
        fprintf(stderr,
                "lora-engine: fatal: --generation-config '%s' must be auto, vllm or a "
                "directory\n",
                gen_source);
        return EXIT_USAGE;
    }
    struct lora_model_config cfg;
    char path[4200];
    snprintf(path, sizeof(path), "%s/config.json", e.model);
    if (lora_model_config_load(path, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-engine: fatal: %s\n", err);
        return 1;
    }
    if (lora_generation_config_load(gen_source, e.model, &e.gen, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-engine: fatal: --generation-config: %s\n", err);
        return 1;
    }
    e.world = (int)tp;
    e.engine_index = (int)idx;
    e.max_loras = (int)max_loras;
    e.max_cpu_loras = max_cpu ? (int)max_cpu : (int)max_loras;
    e.max_lora_rank = (int)max_rank;
    e.block_size = (int)bs;
    e.max_num_batched_tokens = (int)mbt;
    e.max_num_seqs = (int)mns;
    e.max_requests = (int)maxreq;
    e.idle_ms = (int)idle;
    e.seed = (uint64_t)seed;
    e.publish_interval_ms = (int)publish_ms;
    e.startup_timeout_ms = (int)startup;
    e.vocab_size = cfg.vocab_size;
    e.n_eos = cfg.n_eos;
    memcpy(e.eos_ids, cfg.eos_token_ids, sizeof(int) * (size_t)cfg.n_eos);
    e.max_model_len =
        mml ? (int)mml : (cfg.max_position_embeddings < 4096 ? cfg.max_position_embeddings : 4096);
    /* The budget each rank sizes its KV cache from (workers.c sends it in setup). */
    if (gpu_util > 0 && (kv_fraction > 0 || kv_bytes > 0)) {
        fprintf(stderr, "lora-engine: fatal: --gpu-memory-utilization is a KV cache budget of its "
                        "own: give it without --kv-cache-fraction and --kv-cache-bytes\n");
        return EXIT_USAGE;
    }
    e.gpu_memory_utilization = gpu_util;
    e.kv_cache_fraction = kv_fraction;
    e.kv_cache_bytes = gpu_util > 0 || kv_fraction > 0 ? 0
                       : kv_bytes > 0                  ? (uint64_t)kv_bytes
                                                       : 256u << 20;
    e.kv_blocks_cap = (int)blocks;
    if (check_options(&e, &cfg, run_dir, eps, err, sizeof(err)) < 0 ||
        check_modules(&mods, err, sizeof(err)) < 0 ||
        (run_dir && lora_run_dir_check(run_dir, err, sizeof(err)) < 0)) {
        fprintf(stderr, "lora-engine: fatal: %s\n", err);
        return EXIT_USAGE;
    }
    /* The registry file is read before anything starts: a corrupt one stops the engine at
     * once, with its path, rather than being replaced by the start-up adapters. */
    char registry_default[4200];
    if (!registry && run_dir) {
        snprintf(registry_default, sizeof(registry_default), "%s/adapters.json", run_dir);
        registry = registry_default;
    }
    e.registry_path = registry && *registry ? registry : NULL;
    int had_file = 0;
    if (e.registry_path) {
        had_file = lora_registry_file_read(e.registry_path, &file, err, sizeof(err));
        if (had_file < 0) {
            fprintf(stderr, "lora-engine: fatal: unable to restore the adapter registry: %s\n",
                    err);
            return 1;
        }
        had_file = !had_file; /* 0 read, 1 no file */
    }
    snprintf(e.shm, sizeof(e.shm), "/lora-engine-%ld-%d", (long)getpid(), e.engine_index);
    const int sigs[] = {SIGTERM, SIGINT};
    e.sig_fd = lora_signal_pipe_open(sigs, 2);
    e.zctx = zmq_ctx_new();
    if (e.sig_fd < 0 || !e.zctx || open_sockets(&e, run_dir, eps, err, sizeof(err)) < 0 ||
        setup_state(&e, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-engine: fatal: %s\n", *err ? err : strerror(errno));
        goto out;
    }
    int w = workers_wait_setup(&e, err, sizeof(err));
    if (w != 0) {
        if (w == 1) {
            rc = 0; /* stopped by a signal */
            goto out;
        }
        fprintf(stderr, "lora-engine: fatal: %s\n", err);
        rc = w == 2 ? 1 : EXIT_SYSTEM; /* 2: a rank refused the model */
        goto out;
    }
    if (setup_scheduler(&e, err, sizeof(err)) < 0) {
        fprintf(stderr, "lora-engine: fatal: %s\n", err);
        goto out;
    }
    if (restore_adapters(&e, &file, had_file, &mods, err, sizeof(err)) < 0) {
        if (e.stopping) {
            rc = 0;
            goto out;
        }
        fprintf(stderr, "lora-engine: fatal: %s\n", err);
        rc = 1;
        goto out;
    }
    workers_gather_notifications(&e);
    e.ready = true;
    e.last_publish_ms = lora_clock_mono_ms();
    publish_state(&e, true);
    fprintf(stderr, "lora-engine: ready: engine %d, %d rank%s, %d KV blocks of %d\n",
            e.engine_index, e.world, e.world == 1 ? "" : "s", e.num_kv_blocks, e.block_size);
    rc = loop_run(&e);
out:
    lora_registry_file_release(&file);
    teardown(&e);
    return rc;
}
