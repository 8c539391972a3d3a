#!/usr/bin/python3
"""Writes a stream of engine and frontend message bodies (concatenated msgpack maps, as
`lora-inspect events --msgpack` writes them) for `lora-metrics --stdin`, encoded independently
of lib/wire/msg.h, field by field as man/lora-stack-protocol.7 documents them.

  metrics_stream.py [--engine N] [--model NAME] [--finished K] [--phase full|unload]

full (the default): one engine of two ranks (max_loras 2), registry sql, chat, code and idle;
both ranks hold sql and chat in slots and code in the CPU cache, chat pinned; rank 0 alone holds
"odd" in its cache (one disagreement); stats: sql 2 running and 1 waiting, code 3 waiting;
K FINISHED events of sql (stop, 5 prompt and 7 generated tokens each) and one of chat (length,
3 and 4); one request_stats per finished request; notifications of both ranks with a load and an
activate timing, rank 0 having dropped 2.
unload: what the same engine publishes after code is unloaded and odd evicted: a registry, both
ranks' states and stats without them.

Every family of man/lora-stack-metrics.7 has a series after the full stream.
"""

import argparse
import sys

import msgpack

T0 = 1767225600.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--engine", type=int, default=0)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--finished", type=int, default=3)
    p.add_argument("--phase", choices=("full", "unload"), default="full")
    a = p.parse_args()
    e = a.engine
    limits = {"max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 16, "block_size": 16,
              "num_kv_blocks": 512, "world_size": 2, "max_model_len": 256,
              "max_num_batched_tokens": 512, "max_num_seqs": 64, "vocab_size": 259}
    out = []
    if a.phase == "full":
        names = ["sql", "chat", "code", "idle"]
        states = [{"slots": ["sql", "chat"], "cpu": ["sql", "chat", "code", "odd"],
                   "pinned": ["chat"]},
                  {"slots": ["sql", "chat"], "cpu": ["sql", "chat", "code"],
                   "pinned": ["chat"]}]
        counts = [{"name": "sql", "running": 2, "waiting": 1},
                  {"name": "code", "running": 0, "waiting": 3}]
    else:
        names = ["sql", "chat", "idle"]
        states = [{"slots": ["sql", "chat"], "cpu": ["sql", "chat"], "pinned": ["chat"]}] * 2
        counts = [{"name": "sql", "running": 1, "waiting": 0}]
    out.append({"type": "ready", "version": 1, "engine_index": e, "model": a.model,
                "limits": limits})
    out.append({"type": "registry", "engine": e, "adapters": [
        {"name": n, "path": "/adapters/" + n, "id": i + 1} for i, n in enumerate(names)]})
    for rank, st in enumerate(states):
        out.append({"type": "residency_reply", "engine": e, "rank": rank, "state": st})
    if a.phase == "full":
        for rank, st in enumerate(states):
            out.append({"type": "notifications", "engine": e, "rank": rank,
                        "dropped": 2 if rank == 0 else 0, "items": [
                            {"kind": "lora_load", "seq": 1, "time": T0 + 0.5, "state": st,
                             "timings": [
                                 {"name": "sql", "transition": "load", "seconds": 0.02},
                                 {"name": "sql", "transition": "activate", "seconds": 0.003}]}]})
        finished = [("sql", "stop", 5, 7)] * a.finished + [("chat", "length", 3, 4)]
        for i, (lora, reason, n_prompt, n_gen) in enumerate(finished):
            rid = "req-%d" % i
            t = T0 + i
            for ev in ("QUEUED", "SCHEDULED"):
                out.append({"type": "event", "engine": e, "request_id": rid, "event": ev,
                            "time": t, "lora": lora, "num_prompt_tokens": n_prompt,
                            "num_generation_tokens": 0})
            out.append({"type": "event", "engine": e, "request_id": rid, "event": "FINISHED",
                        "time": t + 0.5, "lora": lora, "finish_reason": reason,
                        "num_prompt_tokens": n_prompt, "num_generation_tokens": n_gen})
            out.append({"type": "request_stats", "engine": e, "request_id": rid + "-0",
                        "lora": lora, "finish_reason": reason, "arrival_time": t,
                        "finished_time": t + 0.625, "first_token_time": t + 0.125,
                        "queued_time": t + 0.001, "scheduled_time": t + 0.01,
                        "engine_first_token_time": t + 0.1, "engine_finished_time": t + 0.5,
                        "num_prompt_tokens": n_prompt, "num_generation_tokens": n_gen,
                        "max_tokens": 16})
    out.append({"type": "stats", "engine": e, "time": T0 + 10, "running": 2, "waiting": 4,
                "kv_usage": 0.25, "num_preemptions": 1, "step_adapters": 2, "step_tokens": 40,
                "step_seconds": 0.01, "model_seconds": 0.008, "adapters": counts})
    for body in out:
        sys.stdout.buffer.write(msgpack.packb(body, use_bin_type=True))


if __name__ == "__main__":
    main()
