/* signal_pipe: caught signals as bytes on a pipe, so that a program's poll loop wakes, drains
 * the pipe and exits cleanly instead of doing work in a handler (docs/style.md, "Sockets and
 * processes"). */
#ifndef LORA_SIGNAL_PIPE_H
#define LORA_SIGNAL_PIPE_H

/* Installs handlers (sigaction, SA_RESTART) for the n signals listed that write one byte, the
 * signal number, to a non-blocking pipe, and returns the pipe's read end (non-blocking,
 * close-on-exec) for lora_sock_poll(). One pipe per process: a second open fails with EBUSY until
 * lora_signal_pipe_close(). Returns -1 with errno on failure (nothing installed). If the pipe is
 * full, further signals are dropped: one pending byte is enough to wake the loop. */
int lora_signal_pipe_open(const int *signals, int n);

/* Reads every pending byte from the pipe. Returns the last signal number read, or 0 when none
 * was pending. Never blocks. */
int lora_signal_pipe_drain(int fd);

/* Restores the dispositions the signals had before lora_signal_pipe_open() and closes both ends
 * of the pipe. Does nothing unless fd is the open pipe's read end. */
void lora_signal_pipe_close(int fd);

#endif
