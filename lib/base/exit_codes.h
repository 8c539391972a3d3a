/* exit_codes: the exit statuses every program of the toolkit shares (docs/design.md,
 * "Programs"); the manual pages list them per program. */
#ifndef LORA_EXIT_CODES_H
#define LORA_EXIT_CODES_H

#define EXIT_NO        1   /* a check answered no (lora-inspect health, ...) */
#define EXIT_BAD_INPUT 1   /* a file or request given to a one-shot command was refused */
#define EXIT_USAGE     100 /* bad command line, options or configuration */
#define EXIT_SYSTEM    111 /* the system failed us: memory, sockets, files, a peer gone */

#endif
