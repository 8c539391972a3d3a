#include "bench.h"
int campaign_main(int argc, char **argv) { (void)argc; (void)argv; return 100; }
void campaign_usage(FILE *f) { (void)f; }
json_t *campaign_config_load(const char *path, bool quick, char *err, size_t err_len) {(void)path;(void)quick;(void)err;(void)err_len; return NULL;}
