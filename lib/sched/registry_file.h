/* registry_file: the engine's adapter registry on disk, so that runtime loads, unloads and pins
 * survive a restart of any program of the stack, the engine included.
 *
 * The file is JSON (an operator can read it with jq, and it is small):
 *   {"version": 1,
 *    "adapters": [{"name": "law", "path": "/abs/law", "pinned": false}, ...],
 *    "startup_modules": ["sql", ...]}
 * "adapters" lists the registered adapters in the order they were registered. "startup_modules"
 * names every start-up adapter (--lora-modules) the registry has already taken in, so that one
 * unloaded at run time is not loaded again by the next start while a new one is still added.
 *
 * Invariants a caller can rely on:
 * - lora_registry_file_write replaces the file atomically: a temporary file in the same
 *   directory is written, fsynced and renamed over the old one, then the directory is fsynced.
 *   A reader sees the old file or the new one, never a mix; a failed write leaves the old file.
 * - lora_registry_file_read never repairs: a file that is not valid JSON, has another version,
 *   or breaks a rule (names of 1 to LORA_REGISTRY_NAME_MAX bytes, non-empty paths, no name twice)
 *   is an error "PATH: what is wrong", and so is a file that cannot be read.
 * - Errors go to the caller's (err, err_len); nothing is logged; nothing exits.
 */
#ifndef LORA_REGISTRY_FILE_H
#define LORA_REGISTRY_FILE_H

#include <stdbool.h>
#include <stddef.h>

#define LORA_REGISTRY_VERSION  1
#define LORA_REGISTRY_NAME_MAX 255
#define LORA_REGISTRY_PATH_MAX 4095
#define LORA_REGISTRY_MAX      4096 /* adapters, and start-up names, in one file */

struct lora_registry_entry {
    char *name; /* owned by the registry */
    char *path;
    bool pinned;
};

struct lora_registry {
    struct lora_registry_entry *adapters; /* [n_adapters], registration order */
    int n_adapters;
    char **startup; /* [n_startup] start-up adapter names already taken in */
    int n_startup;
};

/* Reads path into r (which the caller releases). Returns 0, 1 when path does not exist (r is
 * then empty), or -1 with err "PATH: reason". */
int lora_registry_file_read(const char *path, struct lora_registry *r, char *err, size_t err_len);

/* Writes r to path atomically (see above). Returns 0, or -1 with err "PATH: reason" and errno. */
int lora_registry_file_write(const char *path, const struct lora_registry *r, char *err,
                             size_t err_len);

/* Appends an entry or a start-up name (copies the strings). -1 with ENOMEM or ENOSPC. */
int lora_registry_file_add(struct lora_registry *r, const char *name, const char *path, bool pinned);
int lora_registry_file_add_startup(struct lora_registry *r, const char *name);

/* Index of the entry, or of the start-up name, called name; -1 when there is none. */
int lora_registry_file_find(const struct lora_registry *r, const char *name);
bool lora_registry_file_has_startup(const struct lora_registry *r, const char *name);

/* Frees what r owns and empties it. */
void lora_registry_file_release(struct lora_registry *r);

#endif
