/* run_dir: whether a run directory is safe to use.
 *
 * A run directory holds the ipc sockets of an engine, its adapter registry file and lora-stack's
 * pid files. It is safe when the caller (the effective user) owns it and neither its group nor
 * others may write to it: otherwise another user could put a socket of theirs in place of the
 * engine's, a registry file the engine would load adapters from, or a supervisor.pid that
 * `lora-stack down` would signal. A symbolic link as the last component is followed only when
 * the caller owns the link as well.
 *
 * A path that does not exist is not judged (binding or connecting there fails later with its own
 * message). Stateless and thread-safe; creates nothing.
 */
#ifndef LORA_RUN_DIR_H
#define LORA_RUN_DIR_H

#include <stddef.h>

/* Returns 0 when path is a safe run directory or does not exist; -1 with the reason, naming
 * the path, in err: "run directory 'P' is owned by uid U, not by uid E (the caller)", "... is
 * writable by group or others (mode 0777)", "... is a symbolic link owned by uid U", "... is
 * not a directory", or "unable to examine run directory 'P': REASON". */
int lora_run_dir_check(const char *path, char *err, size_t err_len);

#endif
