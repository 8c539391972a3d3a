/* lora_module: one value of --lora-modules, in either spelling vLLM accepts.
 *
 *   NAME=PATH
 *   {"name": "NAME", "path": "PATH", "base_model_name": "BASE"}   (base_model_name optional)
 *
 * The JSON form is vLLM's (its LoRAParserAction): other keys are ignored, as vLLM's
 * LoRAModulePath ignores nothing it does not know of either. Names are 1 to
 * LORA_MODULE_NAME_MAX bytes, paths 1 to LORA_MODULE_PATH_MAX. Nothing is resolved or opened.
 * Errors are "--lora-modules 'SPEC' must be ..." in the caller's buffer.
 */
#ifndef LORA_LORA_MODULE_H
#define LORA_LORA_MODULE_H

#include <stddef.h>

#define LORA_MODULE_NAME_MAX 255
#define LORA_MODULE_PATH_MAX 4095

struct lora_module {
    char name[LORA_MODULE_NAME_MAX + 1];
    char path[LORA_MODULE_PATH_MAX + 1];
    char base[LORA_MODULE_NAME_MAX + 1]; /* base_model_name, "" when not given */
};

/* Parses spec into m. Returns 0, or -1 with err. */
int lora_module_parse(const char *spec, struct lora_module *m, char *err, size_t err_len);

#endif
