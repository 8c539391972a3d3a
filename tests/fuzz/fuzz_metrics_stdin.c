/* fuzz_metrics_stdin: the metrics state machine fed as lora-metrics --stdin feeds it: the input
 * is framed with lora_msg_scan, every complete body is applied (time moving one second a
 * message, so engines come and go with a 5 s timeout), and the exposition is rendered at the
 * end when the first byte's second bit asks for it (the render is most of an input's time and
 * its cost does not depend on the input's length), with the health line. */
#include "fuzz.h"
#include "metrics/metrics_render.h"
#include "metrics/metrics_state.h"
#include "wire/msg.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct lora_metrics_state_options o = {.inflight = size && (data[0] & 1), .engine_timeout_ms = 5000};
    struct lora_metrics_state *s = lora_metrics_state_new(&o);
    struct lora_msg_scan st = {0};
    static struct lora_exposition w; /* kept between inputs: its buffer's growth is not under test */
    char err[512], health[4096];
    uint64_t now_ms = 1000000;
    size_t off = 0, n;

    if (!s)
        abort();
    int id = lora_metrics_state_add_source(s, "stdin", LORA_SOURCE_STDIN);
    while (off < size) {
        enum lora_msg_scan_result rc = lora_msg_scan(&st, data + off, size - off, &n);
        if (rc != LORA_MSG_SCAN_DONE)
            break;
        st = (struct lora_msg_scan){0};
        lora_metrics_state_apply(s, id, data + off, n, now_ms, err, sizeof(err));
        off += n;
        now_ms += 1000;
    }
    lora_metrics_state_source_ended(s, id, "end of input");
    if (size && (data[0] & 2)) {
        lora_exposition_reset(&w);
        lora_metrics_render(s, &w, (double)now_ms / 1000, now_ms);
    }
    lora_metrics_state_health(s, now_ms, health, sizeof(health));
    lora_metrics_state_destroy(&s);
    return 0;
}
