/* fuzz: what the libFuzzer targets of tests/fuzz/ share.
 *
 * Each fuzz_<target>.c defines LLVMFuzzerTestOneInput for one decoder of untrusted input. Most
 * loaders read a path, so an input is written to a file of a private directory under /dev/shm
 * (else the system's temporary directory; removed at exit) and the loader is called on that path. */
#ifndef LORA_FUZZ_H
#define LORA_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The private directory, created on the first call. Aborts when it cannot be made. */
const char *fuzz_dir(void);

/* Writes data[0..size) to NAME in fuzz_dir() and returns the path (a static buffer per call
 * site is not needed: the path is the caller's until the next call with the same name). */
const char *fuzz_write(const char *name, const void *data, size_t size);

/* A NUL-terminated copy of data (malloc'd, the caller's); aborts on out of memory. */
char *fuzz_strndup(const uint8_t *data, size_t size);

#endif
