#!/usr/bin/python3
"""Checks the C msgpack codec (lib/wire/msg.h) against an independent implementation,
python3-msgpack, in both directions. Driven by tests/e2e/wire.bats.

  wire_compat.py expect-emitted DIR      reads what `test_msg --emit DIR` wrote and checks
                                         every message's keys, types and values against the
                                         catalogue (man/lora-stack-protocol.7) and the C samples
  wire_compat.py write-valid DIR         writes every message type as this side encodes it, with
                                         unknown keys, float64 where float32 is usual and
                                         integers where a float is expected
  wire_compat.py compare-check DIR OUT   checks `test_msg --check DIR` output (file OUT)
                                         against what write-valid wrote
  wire_compat.py write-malformed DIR     writes malformed bodies and one valid one after them
  wire_compat.py check-malformed DIR OUT checks that C rejected each with the expected message
  wire_compat.py man-check DIR PAGE      checks that the man page names every type and field
                                         that `test_msg --emit DIR` wrote

Exit status 0 when everything matches, 1 with one line per mismatch on stderr.
"""

import base64
import json
import math
import os
import struct
import sys

import msgpack

U64_MAX = 2**64 - 1


def f32(x):
    """x rounded to float32, as the C side stores a float field."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def frame(values):
    return struct.pack("<%di" % len(values), *values)


# ---- (a) what the C samples in tests/unit/test_msg.c put on the wire ----------------------

LIMITS = {"max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": 64, "block_size": 16,
          "num_kv_blocks": 2048, "world_size": 2, "max_model_len": 4096,
          "max_num_batched_tokens": 8192, "max_num_seqs": 256, "vocab_size": 32000}
STATE = {"slots": ["sql", ""], "cpu": ["sql", "chat"], "pinned": ["chat"]}
NAN = float("nan")

# file base name -> (map, [frames as lists of int32])
EMITTED = {
    "hello": ({"type": "hello", "version": 1, "role": "worker", "rank": 3, "world_size": 4,
               "pid": 4242, "name": "worker-3 \u00e9"}, []),
    "hello.min": ({"type": "hello", "version": 1, "role": "frontend", "pid": 77}, []),
    "ready": ({"type": "ready", "version": 1, "engine_index": 2, "model": "/models/llama",
               "limits": LIMITS}, []),
    "heartbeat": ({"type": "heartbeat"}, []),
    "setup": ({"type": "setup", "model": "/models/llama", "rank": 1, "limits": LIMITS,
               "shm": "/lora-shm-1", "kv_cache_bytes": 268435456, "kv_cache_fraction": 0.5,
               "gpu_memory_utilization": 0.9}, []),
    "setup.min": ({"type": "setup", "model": "/models/llama", "rank": 0, "limits": LIMITS}, []),
    "setup_done": ({"type": "setup_done", "ok": False, "error": "out of memory", "rank": 1,
                    "weight_bytes": 123456789012, "kv_blocks": 4096,
                    "memory_total": 85899345920, "memory_free": 1073741824,
                    "async_activate": True}, []),
    "setup_done.min": ({"type": "setup_done", "ok": True, "rank": 0, "weight_bytes": 0}, []),
    "step": ({"type": "step", "step_id": U64_MAX, "seqs": [
        {"seq_id": 11, "n_tokens": 3, "pos": 0, "n_blocks": 1, "slot": 2, "all_logits": True,
         "sample": True, "temperature": f32(0.7), "top_p": f32(0.9), "top_k": 40,
         "seed": 9007199254740993, "n_generated": 0, "top_n": 2, "next_token": 5,
         "banned": [257, 2], "allowed": [3, 17, 255], "prompt_top_n": 2},
        {"seq_id": 12, "n_tokens": 1, "pos": 20, "n_blocks": 2, "slot": -1, "all_logits": False,
         "sample": True, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": 0,
         "n_generated": 5, "top_n": 0, "next_token": -1}],
        "n_tokens_total": 4, "n_block_entries": 3}, [[1, 2, 3, 99], [7, 8, 9]]),
    "step.min": ({"type": "step", "step_id": 1, "seqs": [], "n_tokens_total": 0,
                  "n_block_entries": 0}, [[], []]),
    "step_reply": ({"type": "step_reply", "step_id": 5, "rank": 0, "ok": False,
                    "error": "cuda: out of memory", "doorbell": True, "step_seconds": 0.0125,
                    "outs": [
                        {"seq_id": 11, "token": 42, "logprob": -0.25, "top_ids": [42, 7],
                         "top_logprobs": [-0.25, -1.5], "prompt_logprobs": [NAN, -2.0, -0.5],
                         "prompt_ranks": [0, 12, 1], "prompt_top_n": 2,
                         "prompt_top_ids": [0, 0, 9, 4, 5, 6],
                         "prompt_top_logprobs": [0.0, 0.0, -0.5, -1.0, -0.5, -2.5]},
                        {"seq_id": 12, "token": -1, "logprob": 0.0, "top_ids": [],
                         "top_logprobs": [], "prompt_logprobs": []}]}, []),
    "step_reply.min": ({"type": "step_reply", "step_id": 6, "rank": 1, "ok": True,
                        "doorbell": False, "step_seconds": 0.5, "outs": []}, []),
    "adapter_op": ({"type": "adapter_op", "op_id": 100, "op": "add", "name": "sql",
                    "path": "/adapters/sql", "slot": 1}, []),
    "adapter_op.min": ({"type": "adapter_op", "op_id": 101, "op": "remove", "name": "sql"}, []),
    "adapter_op_reply": ({"type": "adapter_op_reply", "op_id": 100, "rank": 1, "ok": False,
                          "error": "no such file", "seconds": 0.25, "pending": True}, []),
    "adapter_op_reply.min": ({"type": "adapter_op_reply", "op_id": 101, "rank": 0, "ok": True,
                              "seconds": 0.0}, []),
    "take_notifications": ({"type": "take_notifications"}, []),
    "notifications": ({"type": "notifications", "engine": 0, "rank": 1, "dropped": 3, "items": [
        {"kind": "lora_load", "seq": 17, "time": 1700000000.25, "state": STATE, "timings": [
            {"name": "sql", "transition": "load", "seconds": 0.5},
            {"name": "chat", "transition": "evict", "seconds": 0.001}]}]}, []),
    "notifications.min": ({"type": "notifications", "rank": 0, "dropped": 0, "items": []}, []),
    "residency": ({"type": "residency"}, []),
    "residency_reply": ({"type": "residency_reply", "engine": 2, "rank": 1, "state": STATE},
                        []),
    "residency_reply.min": ({"type": "residency_reply", "rank": 0,
                             "state": {"slots": [], "cpu": [], "pinned": []}}, []),
    "request": ({"type": "request", "request_id": "req-1", "lora": "sql", "n_prompt": 4,
                 "max_tokens": 16, "min_tokens": 2, "temperature": f32(0.8), "top_p": f32(0.95),
                 "top_k": 50, "seed": U64_MAX, "logprobs": 5, "prompt_logprobs": True,
                 "ignore_eos": True, "stop_token_ids": [2, 32000],
                 "allowed_token_ids": [7, 8, 31999], "prompt_top_n": 5},
                [[1, 15043, 3186, 2]]),
    "request.min": ({"type": "request", "request_id": "r", "n_prompt": 1, "max_tokens": 1,
                     "min_tokens": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                     "logprobs": 0, "prompt_logprobs": False, "ignore_eos": False,
                     "stop_token_ids": []}, [[5]]),
    "abort": ({"type": "abort", "request_id": "req-1"}, []),
    "output": ({"type": "output", "request_id": "req-1", "tokens": [42, 7],
                "logprobs": [-0.5, -1.25], "top_n": 2, "top_ids": [42, 9, 7, 3],
                "top_logprobs": [-0.5, -2.0, -1.25, -3.0], "prompt_logprobs": [NAN, -1.0, -2.0],
                "prompt_ranks": [0, 4, 1], "prompt_top_n": 1, "prompt_top_ids": [0, 3, 8],
                "prompt_top_logprobs": [0.0, -0.75, -2.0],
                "finished": True, "finish_reason": "length", "num_prompt_tokens": 4,
                "error": "boom", "error_code": "invalid", "queued_time": 1700000000.25,
                "scheduled_time": 1700000000.5, "first_token_time": 1700000000.75,
                "finished_time": 1700000001.125}, []),
    "output.min": ({"type": "output", "request_id": "req-2", "tokens": [5],
                    "logprobs": [-0.125], "finished": False, "num_prompt_tokens": 3}, []),
    "event": ({"type": "event", "engine": 1, "request_id": "req-1", "event": "FINISHED",
               "time": 1700000001.5, "lora": "sql", "finish_reason": "stop",
               "num_prompt_tokens": 4, "num_generation_tokens": 16}, []),
    "event.min": ({"type": "event", "engine": 0, "request_id": "req-2", "event": "QUEUED",
                   "time": 1700000000.0, "num_prompt_tokens": 3,
                   "num_generation_tokens": 0}, []),
    "stats": ({"type": "stats", "engine": 1, "time": 1700000002.75, "running": 3, "waiting": 2,
               "kv_usage": 0.4375, "num_preemptions": 7, "step_adapters": 2, "step_tokens": 96,
               "step_seconds": 0.03125, "model_seconds": 0.015625, "adapters": [
                   {"name": "sql", "running": 2, "waiting": 1},
                   {"name": "chat", "running": 1, "waiting": 1}]}, []),
    "stats.min": ({"type": "stats", "engine": 0, "time": 0.0, "running": 0, "waiting": 0,
                   "kv_usage": 0.0, "num_preemptions": 0, "step_adapters": 0, "step_tokens": 0,
                   "step_seconds": 0.0, "model_seconds": 0.0, "adapters": []}, []),
    "control": ({"type": "control", "id": 9, "op": "load", "name": "sql",
                 "path": "/adapters/sql"}, []),
    "control.min": ({"type": "control", "id": 10, "op": "health"}, []),
    "control_reply": ({"type": "control_reply", "id": 9, "ok": False, "error": "busy",
                       "data": {"adapters": ["sql"], "n": 1}}, []),
    "control_reply.min": ({"type": "control_reply", "id": 10, "ok": True}, []),
    "registry": ({"type": "registry", "engine": 0, "adapters": [
        {"name": "sql", "path": "/adapters/sql", "id": 1},
        {"name": "chat", "path": "/adapters/chat", "id": 2}]}, []),
    "registry.min": ({"type": "registry", "engine": 3, "adapters": []}, []),
    "shutdown": ({"type": "shutdown"}, []),
    "request_stats": ({"type": "request_stats", "engine": 2, "request_id": "cmpl-1-0",
                       "lora": "sql", "finish_reason": "length", "arrival_time": 1700000000.0,
                       "finished_time": 1700000002.0, "first_token_time": 1700000000.5,
                       "queued_time": 1700000000.125, "scheduled_time": 1700000000.25,
                       "engine_first_token_time": 1700000000.375,
                       "engine_finished_time": 1700000001.875, "num_prompt_tokens": 7,
                       "num_generation_tokens": 16, "max_tokens": 16,
                       "submit_seconds": 0.0009765625, "output_seconds": 0.00048828125}, []),
    "request_stats.min": ({"type": "request_stats", "engine": 0, "request_id": "cmpl-2-0",
                           "finish_reason": "error", "arrival_time": 1700000003.0,
                           "finished_time": 1700000003.5, "num_prompt_tokens": 1,
                           "num_generation_tokens": 0, "max_tokens": -1}, []),
}


def same(want, got, f32_keys=(), key=None):
    """Type-strict deep equality: bool is not int, int is not float; NaN equals NaN; values of
    the keys in f32_keys compare after rounding the wanted value to float32."""
    if isinstance(want, dict):
        return (isinstance(got, dict) and want.keys() == got.keys()
                and all(same(want[k], got[k], f32_keys, k) for k in want))
    if isinstance(want, list):
        return (isinstance(got, list) and len(want) == len(got)
                and all(same(w, g, f32_keys, key) for w, g in zip(want, got)))
    if type(want) is not type(got):
        return False
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return got == (f32(want) if key in f32_keys else want)
    return want == got


def fail(problems, name, what):
    problems.append("%s: %s" % (name, what))


def expect_emitted(d):
    problems = []
    names = sorted(f[:-len(".msgpack")] for f in os.listdir(d) if f.endswith(".msgpack"))
    if names != sorted(EMITTED):
        fail(problems, d, "files %s, expected %s" % (names, sorted(EMITTED)))
    for name, (want, frames) in sorted(EMITTED.items()):
        path = os.path.join(d, name + ".msgpack")
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            body = f.read()
        try:
            got = msgpack.unpackb(body, raw=False)
        except Exception as e:  # any decoding failure is a finding
            fail(problems, name, "python-msgpack cannot decode it: %s" % e)
            continue
        if not same(want, got):
            fail(problems, name, "got %r, expected %r" % (got, want))
        for i, values in enumerate(frames):
            fpath = os.path.join(d, "%s.bin%d" % (name, i))
            data = open(fpath, "rb").read() if os.path.exists(fpath) else None
            if data != frame(values):
                fail(problems, name, "frame %d is %r, expected %r" % (i, data, frame(values)))
        if os.path.exists(os.path.join(d, "%s.bin%d" % (name, len(frames)))):
            fail(problems, name, "an unexpected frame %d" % len(frames))
    return report(problems, "%d emitted messages match" % len(EMITTED))


# ---- (b) this side encodes, C decodes -----------------------------------------------------------

# Fields a decoder fills in when the key is absent (the struct's documented defaults).
DEFAULTS = {
    "hello": {"rank": -1, "world_size": 0, "name": None},
    "setup": {"shm": None, "kv_cache_bytes": 0, "kv_cache_fraction": 0.0,
              "gpu_memory_utilization": 0.0},
    "setup_done": {"error": None, "kv_blocks": 0, "memory_total": 0, "memory_free": 0,
                   "async_activate": False},
    "step_reply": {"error": None},
    "adapter_op": {"path": None, "slot": -1, "async": False},
    "adapter_op_reply": {"error": None, "pending": False},
    "notifications": {"engine": -1},
    "residency_reply": {"engine": -1},
    "request": {"lora": None, "seed": None},
    "output": {"top_n": 0, "top_ids": [], "top_logprobs": [], "prompt_logprobs": [],
               "finish_reason": None, "error": None, "error_code": None, "queued_time": 0.0,
               "scheduled_time": 0.0, "first_token_time": 0.0, "finished_time": 0.0},
    "event": {"lora": None, "finish_reason": None},
    "control": {"name": None, "path": None},
    "control_reply": {"error": None, "data": None},
    "request_stats": {"lora": None, "first_token_time": 0.0, "queued_time": 0.0,
                      "scheduled_time": 0.0, "engine_first_token_time": 0.0,
                      "engine_finished_time": 0.0, "submit_seconds": 0.0,
                      "output_seconds": 0.0},
}

# Fields the C structs hold as float32 (the rest of the numbers are float64 or integers).
F32_KEYS = {"temperature", "top_p", "logprob", "top_logprobs", "prompt_logprobs"}
F32_KEYS_OUTPUT = F32_KEYS | {"logprobs"}

# name -> (map, frames, pack as float32?). Unknown keys start with "x_", at any depth.
LIMITS_PY = {"max_loras": 2, "max_cpu_loras": 3, "max_lora_rank": 16, "block_size": 32,
             "num_kv_blocks": 100, "world_size": 1, "max_model_len": 2048,
             "max_num_batched_tokens": 512, "max_num_seqs": 8, "vocab_size": 320,
             "x_new_limit": 5}
WRITTEN = {
    "hello": ({"version": 1, "x_future": {"a": [1, 2.5]}, "type": "hello", "role": "inspect",
               "pid": 31337, "name": "inspect \u2603"}, [], False),
    "hello.worker": ({"type": "hello", "version": 2, "role": "worker", "rank": 0,
                      "world_size": 2, "pid": 2**40}, [], False),
    "ready": ({"type": "ready", "version": 1, "engine_index": 0, "model": "demo",
               "limits": LIMITS_PY, "x_more": None}, [], False),
    "heartbeat": ({"type": "heartbeat", "x_seq": 5}, [], False),
    "setup": ({"type": "setup", "model": "/m", "rank": 1, "limits": LIMITS_PY,
               "shm": "/s"}, [], False),
    "setup.kv": ({"type": "setup", "model": "/m", "rank": 0, "limits": LIMITS_PY,
                  "kv_cache_bytes": 2**33, "kv_cache_fraction": 1,
                  "gpu_memory_utilization": 0.25}, [], False),
    "setup_done": ({"type": "setup_done", "ok": True, "rank": 1, "weight_bytes": 2**63 + 5,
                    "kv_blocks": 77, "memory_total": 2**36, "memory_free": 2**35},
                   [], False),
    "step": ({"type": "step", "step_id": 77, "x_hint": "fast", "seqs": [
        {"seq_id": 2**64 - 2, "n_tokens": 2, "pos": 3, "n_blocks": 1, "slot": 0,
         "all_logits": False, "sample": True, "temperature": 0.3, "top_p": 1, "top_k": 0,
         "seed": 42, "n_generated": 1, "top_n": 3, "next_token": -1, "banned": [2, 32000],
         "x_extra": [1, {"y": 2}]},
        {"seq_id": 3, "n_tokens": 0, "pos": 0, "n_blocks": 0, "slot": -1, "all_logits": True,
         "sample": False, "temperature": 1.5, "top_p": 0.25, "top_k": 5, "seed": 0,
         "n_generated": 0, "top_n": 0, "next_token": 2**31 - 1}],
        "n_tokens_total": 2, "n_block_entries": 1}, [[10, -20], [5], [9, 9]], False),
    "step_reply": ({"type": "step_reply", "step_id": 77, "rank": 1, "ok": True,
                    "doorbell": True, "step_seconds": 0.001234, "outs": [
                        {"seq_id": 1, "token": 7, "logprob": -0.1, "top_ids": [7, 8],
                         "top_logprobs": [-0.1, -2.75], "prompt_logprobs": [float("-inf"), 0],
                         "x_t": 1}]}, [], False),
    "adapter_op": ({"type": "adapter_op", "op_id": 5, "op": "activate", "name": "a",
                    "slot": 3, "async": True}, [], False),
    "adapter_op_reply": ({"type": "adapter_op_reply", "op_id": 5, "rank": 0, "ok": True,
                          "seconds": 1, "pending": True}, [], False),
    "take_notifications": ({"type": "take_notifications"}, [], False),
    "notifications": ({"type": "notifications", "rank": 2, "dropped": 2**33, "items": [
        {"kind": "lora_load", "seq": 1, "time": 1700000123.456, "x_k": True,
         "state": {"slots": ["", "b"], "cpu": ["b"], "pinned": [], "x_s": 0},
         "timings": [{"name": "b", "transition": "activate", "seconds": 0.002},
                     {"name": "c", "transition": "remove", "seconds": 0}]}]}, [], True),
    "residency": ({"type": "residency"}, [], False),
    "residency_reply": ({"type": "residency_reply", "rank": 0,
                         "state": {"slots": ["a"], "cpu": ["a", "b"], "pinned": ["a"]}},
                        [], False),
    "request": ({"type": "request", "request_id": "cmpl-1", "n_prompt": 3, "max_tokens": 7,
                 "min_tokens": 0, "temperature": 0.6, "top_p": 0.9, "top_k": -1, "seed": 0,
                 "logprobs": 2, "prompt_logprobs": False, "ignore_eos": False,
                 "stop_token_ids": [], "x_user": "bob"}, [[100, 200, 300]], False),
    "request.lora": ({"type": "request", "request_id": "cmpl-2", "lora": "sql", "n_prompt": 0,
                      "max_tokens": 1, "min_tokens": 1, "temperature": 0, "top_p": 1.0,
                      "top_k": 1, "logprobs": 0, "prompt_logprobs": True, "ignore_eos": True,
                      "stop_token_ids": [-1, 2**31 - 1]}, [[]], True),
    "abort": ({"type": "abort", "request_id": "cmpl-1"}, [], False),
    "output": ({"type": "output", "request_id": "cmpl-1", "tokens": [1, 2, 3],
                "logprobs": [-1, -0.5, -0.25], "top_n": 1, "top_ids": [1, 2, 3],
                "top_logprobs": [-1.0, -0.5, -0.25], "prompt_logprobs": [NAN, -3.5],
                "finished": True, "finish_reason": "stop", "num_prompt_tokens": 2}, [], False),
    "output.error": ({"type": "output", "request_id": "cmpl-3", "tokens": [], "logprobs": [],
                      "finished": True, "finish_reason": "error", "num_prompt_tokens": 0,
                      "error": "worker died", "error_code": "unavailable",
                      "finished_time": 1700000002.5}, [], False),
    "event": ({"type": "event", "engine": 0, "request_id": "cmpl-1", "event": "SCHEDULED",
               "time": 1700000123.456789, "lora": "sql", "num_prompt_tokens": 3,
               "num_generation_tokens": 0}, [], False),
    "stats": ({"type": "stats", "engine": 2, "time": 1700000124.5, "running": 1, "waiting": 0,
               "kv_usage": 1, "num_preemptions": 0, "step_adapters": 1, "step_tokens": 4,
               "step_seconds": 0.1, "adapters": [{"name": "sql", "running": 1, "waiting": 0}]},
              [], True),
    "control": ({"type": "control", "id": 1, "op": "unpin", "name": "sql"}, [], False),
    "control_reply": ({"type": "control_reply", "id": 1, "ok": True, "data": [
        {"adapter": "sql", "rank": 0, "level": "gpu", "blob": b"\x00\x01"}, 5, None,
        {1: "int key"}]}, [], False),
    "registry": ({"type": "registry", "engine": 1, "adapters": [
        {"name": "a", "path": "/x/a", "id": 2**64 - 1, "x_owner": "me"}]}, [], False),
    "shutdown": ({"type": "shutdown"}, [], False),
    "request_stats": ({"type": "request_stats", "engine": 0, "request_id": "chatcmpl-9-1",
                       "finish_reason": "stop", "arrival_time": 1700000010.25,
                       "finished_time": 1700000011.0, "num_prompt_tokens": 12,
                       "num_generation_tokens": 3, "max_tokens": -1, "x_extra": 1}, [], False),
}


def strip_unknown(v):
    if isinstance(v, dict):
        return {k: strip_unknown(x) for k, x in v.items() if not str(k).startswith("x_")}
    if isinstance(v, list):
        return [strip_unknown(x) for x in v]
    return v


def as_c_dump(v, single):
    """A wire value as the C dump shows it: u64 above INT64_MAX as a decimal string, floats not
    finite as strings, floats rounded to float32 where the sender packed float32."""
    if isinstance(v, dict):
        return {k: as_c_dump(x, single) for k, x in v.items()}
    if isinstance(v, list):
        return [as_c_dump(x, single) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v) if v > 2**63 - 1 else v
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f32(v) if single else v


def to_float_fields(v, keys, key=None):
    """Integers sent where a float is expected come back from C as floats."""
    if isinstance(v, dict):
        return {k: to_float_fields(x, keys, k) for k, x in v.items()}
    if isinstance(v, list):
        return [to_float_fields(x, keys, key) for x in v]
    if key in keys and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


FLOAT_KEYS = {"temperature", "top_p", "logprob", "top_logprobs", "prompt_logprobs", "time",
              "seconds", "step_seconds", "kv_usage", "kv_cache_fraction"}


def expected_fields(msg, frames, single):
    t = msg["type"]
    data = msg.get("data") if t == "control_reply" else None
    fields = strip_unknown({k: v for k, v in msg.items() if k not in ("type", "data")})
    for k, v in DEFAULTS.get(t, {}).items():
        fields.setdefault(k, v)
    if t == "step":
        fields["tokens"], fields["block_tables"] = frames[0], frames[1]
    if t == "request":
        fields["prompt"] = frames[0]
    keys = FLOAT_KEYS | ({"logprobs"} if t == "output" else set())
    fields = as_c_dump(to_float_fields(fields, keys), single)
    if t == "control_reply":
        fields["data"] = jsonable(data)
    return fields


def jsonable(v):
    """A msgpack value as lora_msg_to_json renders it."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else json.dumps(jsonable(k), separators=(",", ":"))):
                jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v > 2**63 - 1:
        return float(v)
    return v


def pack(msg, single):
    return msgpack.packb(msg, use_bin_type=True, use_single_float=single)


def write_valid(d):
    os.makedirs(d, exist_ok=True)
    for name, (msg, frames, single) in WRITTEN.items():
        with open(os.path.join(d, name + ".msgpack"), "wb") as f:
            f.write(pack(msg, single))
        for i, values in enumerate(frames):
            with open(os.path.join(d, "%s.bin%d" % (name, i)), "wb") as f:
                f.write(frame(values))
    return 0


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare_check(d, out):
    problems = []
    lines = {r.get("file"): r for r in read_lines(out)}
    for name, (msg, frames, single) in sorted(WRITTEN.items()):
        r = lines.pop(name + ".msgpack", None)
        if r is None:
            fail(problems, name, "no line in the C output")
            continue
        if r.get("ok") is not True:
            fail(problems, name, "C rejected it: %s" % r.get("error"))
            continue
        if r.get("type") != msg["type"]:
            fail(problems, name, "C says type %r" % r.get("type"))
        f32_keys = F32_KEYS_OUTPUT if msg["type"] == "output" else F32_KEYS
        want = expected_fields(msg, frames, single)
        if not same(want, r.get("fields"), f32_keys):
            fail(problems, name, "C decoded %s, expected %s" % (json.dumps(r.get("fields")),
                                                                 json.dumps(want)))
        with open(os.path.join(d, name + ".msgpack"), "rb") as f:
            generic = jsonable(msgpack.unpackb(f.read(), raw=False, strict_map_key=False))
        if not same(generic, r.get("json")):
            fail(problems, name, "C's JSON view %s, expected %s" % (json.dumps(r.get("json")),
                                                                   json.dumps(generic)))
    for name in lines:
        fail(problems, name, "an unexpected line")
    return report(problems, "%d messages written here decode in C" % len(WRITTEN))


# ---- (c) malformed bodies ------------------------------------------------------------------------

def fixstr(s):
    b = s.encode()
    return bytes([0xa0 | len(b)]) + b


def malformed():
    """name -> (body, frames, what the C error must contain); sorted names, valid one last."""
    hello = {"type": "hello", "version": 1, "role": "worker", "rank": 0, "world_size": 1,
             "pid": 1}
    valid_hello = pack(hello, False)
    many_seqs = {"type": "step", "step_id": 1, "seqs": [{}] * 4097, "n_tokens_total": 0,
                 "n_block_entries": 0}
    return {
        "m01-truncated": (valid_hello[:len(valid_hello) // 2], [], "truncated"),
        "m02-wrong-type": (pack(dict(hello, pid="1"), False), [],
                           "hello: pid: expected an integer"),
        "m03-huge-array": (b"\x83" + fixstr("type") + fixstr("step") + fixstr("step_id") + b"\x01"
                           + fixstr("seqs") + b"\xdd\x80\x00\x00\x00\xc0\xc0", [], "truncated"),
        "m04-huge-map": (b"\xdf\x7f\xff\xff\xff" + fixstr("type") + fixstr("hello"), [],
                         "truncated"),
        "m05-huge-string": (b"\x81" + fixstr("type") + b"\xdb\xff\xff\xff\xf0hello", [],
                            "truncated"),
        "m06-unknown-type": (pack({"type": "bogus", "version": 1}, False), [],
                             "unknown type 'bogus'"),
        "m07-missing-type": (pack({"version": 1, "role": "worker"}, False), [],
                             "type: missing"),
        "m08-not-a-map": (pack([1, 2, 3], False), [], "not a map"),
        "m09-missing-key": (pack({"type": "abort"}, False), [], "abort: request_id: missing"),
        "m10-frame-size": (pack({"type": "request", "request_id": "r", "n_prompt": 3,
                                 "max_tokens": 1, "min_tokens": 0, "temperature": 0.0,
                                 "top_p": 1.0, "top_k": 0, "logprobs": 0,
                                 "prompt_logprobs": False, "ignore_eos": False,
                                 "stop_token_ids": []}, False), [[1, 2]],
                           "request: n_prompt: 3 values, but frame 0 holds 8 bytes"),
        "m11-trailing": (valid_hello + b"\xc0", [], "trailing bytes"),
        "m12-out-of-range": (pack(dict(hello, rank=2**31), False), [],
                             "hello: rank: 2147483648 is out of range"),
        "m13-too-many-seqs": (pack(many_seqs, False), [],
                              "step: seqs: 4097 elements, the limit is 4096"),
        "m14-empty": (b"", [], "body: empty"),
        "m15-bad-enum": (pack(dict(hello, role="robot"), False), [],
                         "hello: role: unknown value 'robot'"),
        "m16-nul-string": (pack({"type": "abort", "request_id": "a\0b"}, False), [],
                           "abort: request_id: string contains a NUL byte"),
        "m17-float-for-int": (pack(dict(hello, version=1.0), False), [],
                              "hello: version: expected an integer"),
        "m18-step-sums": (pack({"type": "step", "step_id": 1, "seqs": [], "n_tokens_total": 1,
                                "n_block_entries": 0}, False), [[4], []],
                          "step: n_tokens_total: 1, but the seqs' n_tokens add up to 0"),
        "m19-reserved-byte": (b"\x81" + fixstr("type") + b"\xc1", [], "reserved byte 0xc1"),
        "zz-valid": (valid_hello, [], None),
    }


def write_malformed(d):
    os.makedirs(d, exist_ok=True)
    for name, (body, frames, _) in malformed().items():
        with open(os.path.join(d, name + ".msgpack"), "wb") as f:
            f.write(body)
        for i, values in enumerate(frames):
            with open(os.path.join(d, "%s.bin%d" % (name, i)), "wb") as f:
                f.write(frame(values))
    return 0


def check_malformed(d, out):
    problems = []
    rows = read_lines(out)
    cases = malformed()
    if [r.get("file") for r in rows] != [n + ".msgpack" for n in sorted(cases)]:
        fail(problems, out, "lines for %s" % [r.get("file") for r in rows])
    for r in rows:
        name = r.get("file", "")[:-len(".msgpack")]
        if name not in cases:
            continue
        want = cases[name][2]
        if want is None:
            if r.get("ok") is not True or r["fields"]["role"] != "worker":
                fail(problems, name, "the valid message after the bad ones: %s" % r)
        elif r.get("ok") is not False:
            fail(problems, name, "C accepted it")
        elif want not in r.get("error", ""):
            fail(problems, name, "error %r does not say %r" % (r.get("error"), want))
    return report(problems, "%d malformed bodies rejected" % (len(cases) - 1))


def all_keys(v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(k)
            all_keys(x, out)
    elif isinstance(v, list):
        for x in v:
            all_keys(x, out)
    return out


def man_check(d, page):
    """Every type the C side emits has a section in the man page, every key it writes a
    mention in bold (.B/.BR), and every enum value too."""
    problems = []
    with open(page) as f:
        text = f.read()
    bold = set()
    for line in text.splitlines():
        if line.startswith((".B ", ".BR ")):
            bold.update(w.strip('",') for w in line.split()[1:])
    for name in sorted(f for f in os.listdir(d) if f.endswith(".msgpack")):
        with open(os.path.join(d, name), "rb") as f:
            msg = msgpack.unpackb(f.read(), raw=False)
        if ".SS %s " % msg["type"] not in text:
            fail(problems, name, "no section '.SS %s' in %s" % (msg["type"], page))
        for k in sorted(all_keys({k: v for k, v in msg.items() if k != "data"}, set())):
            if k not in bold:
                fail(problems, name, "field %r is not in bold in %s" % (k, page))
    enums = ["worker", "frontend", "inspect", "add", "activate", "remove", "pin", "unpin", "load",
             "evict", "QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED", "residency", "config",
             "health", "unload", "stats"]
    for e in enums:
        if e not in bold:
            fail(problems, page, "enum value %r is not in bold" % e)
    return report(problems, "the man page names every type, field and enum value")


def report(problems, summary):
    for p in problems:
        print("wire_compat: " + p, file=sys.stderr)
    if not problems:
        print(summary)
    return 1 if problems else 0


def main(argv):
    commands = {"expect-emitted": (expect_emitted, 1), "write-valid": (write_valid, 1),
                "compare-check": (compare_check, 2), "write-malformed": (write_malformed, 1),
                "check-malformed": (check_malformed, 2), "man-check": (man_check, 2)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 100
    fn, _ = commands[argv[1]]
    return fn(*argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
