/* signal_pipe: see signal_pipe.h. */
#include "base/signal_pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define SIGNAL_MAX 16

static volatile sig_atomic_t sigpipe_write_fd = -1;
static int sigpipe_read_fd = -1;
static int sigpipe_signals[SIGNAL_MAX];
static struct sigaction sigpipe_old[SIGNAL_MAX];
static int sigpipe_n;

static void on_signal(int sig)
{
    int saved = errno;
    int fd = sigpipe_write_fd;
    unsigned char byte = (unsigned char)sig;

    if (fd >= 0) {
        ssize_t w = write(fd, &byte, 1); /* full pipe: the loop is already woken */
        (void)w;
    }
    errno = saved;
}

static void restore_handlers(int n)
{
    for (int i = 0; i < n; i++)
        sigaction(sigpipe_signals[i], &sigpipe_old[i], NULL);
}

int lora_signal_pipe_open(const int *signals, int n)
{
    struct sigaction sa;
    int fds[2], saved;

    if (!signals || n < 1 || n > SIGNAL_MAX) {
        errno = EINVAL;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (signals[i] < 1 || signals[i] >= NSIG || signals[i] > UCHAR_MAX) {
            errno = EINVAL;
            return -1;
        }
    }
    if (sigpipe_read_fd >= 0) {
        errno = EBUSY;
        return -1;
    }
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    sigpipe_read_fd = fds[0];
    sigpipe_write_fd = fds[1];

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (int i = 0; i < n; i++) {
        sigpipe_signals[i] = signals[i];
        if (sigaction(signals[i], &sa, &sigpipe_old[i]) < 0) {
            saved = errno;
            restore_handlers(i);
            sigpipe_write_fd = -1;
            close(fds[0]);
            close(fds[1]);
            sigpipe_read_fd = -1;
            errno = saved;
            return -1;
        }
    }
    sigpipe_n = n;
    return fds[0];
}

int lora_signal_pipe_drain(int fd)
{
    unsigned char buf[64];
    int last = 0;

    for (;;) {
        ssize_t got = read(fd, buf, sizeof(buf));

        if (got > 0) {
            last = buf[got - 1];
            continue;
        }
        if (got < 0 && errno == EINTR)
            continue;
        return last; /* EAGAIN: drained; 0: closed; other errors: nothing more to read */
    }
}

void lora_signal_pipe_close(int fd)
{
    int wfd = sigpipe_write_fd;

    if (fd < 0 || fd != sigpipe_read_fd)
        return;
    restore_handlers(sigpipe_n);
    sigpipe_write_fd = -1;
    sigpipe_n = 0;
    close(wfd);
    close(sigpipe_read_fd);
    sigpipe_read_fd = -1;
}
