/* Subcommands of lora-worker, one file each. Each returns the process exit code:
 * 0 ok, 1 bad input (model, adapter or request), 100 usage, 111 system failure. */
#ifndef LORA_WORKER_CMD_H
#define LORA_WORKER_CMD_H

#include "base/exit_codes.h"

int cmd_generate(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_make_adapter(int argc, char **argv);
int cmd_demo_model(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_device(int argc, char **argv);

#endif
