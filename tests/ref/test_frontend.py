#!/usr/bin/python3
"""Checks of lora-frontend over HTTP against a running stack (tests/e2e/frontend.bats starts it).
Prints TAP for the named check only; each bats test runs one.

    test_frontend.py CHECK STATE_DIR

STATE_DIR holds what the bats set-up wrote: port1, port2, port_key (frontends), run (the engine's
run directory), bin (the programs), m (the model), loras/ (the --lora-root), expected/*.json
(`lora-worker generate --json` outputs).
"""

import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client import control  # noqa: E402
from tap import check, done  # noqa: E402

S = sys.argv[2]
BIN = open(os.path.join(S, "bin")).read().strip()
MODEL = os.path.join(S, "m")


def port(name="port1"):
    return int(open(os.path.join(S, name)).read())


def call(method, path, body=None, p=None, headers=None, raw=None, timeout=60):
    """(status, parsed JSON or text) of one request."""
    c = http.client.HTTPConnection("127.0.0.1", p or port(), timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def post(path, body, **kw):
    return call("POST", path, body, **kw)


def stream(path, body, p=None):
    """The parsed data events of a streamed response, and whether it ended with [DONE]."""
    c = http.client.HTTPConnection("127.0.0.1", p or port(), timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    assert r.getheader("Content-Type").startswith("text/event-stream")
    events, ended = [], False
    for line in r.read().decode().split("\n"):
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            ended = True
            continue
        events.append(json.loads(line[6:]))
    c.close()
    return events, ended


def generate(prompt_ids, max_tokens, lora=None, logprobs=0, ignore_eos=True):
    """lora-worker generate's answer for one request (the reference)."""
    batch = os.path.join(S, "batch-%d.jsonl" % os.getpid())
    with open(batch, "w") as f:
        f.write(json.dumps({"prompt_ids": prompt_ids, "max_tokens": max_tokens, "lora": lora}))
    args = [os.path.join(BIN, "lora-worker"), "generate", "--model", MODEL, "--json",
            "--batch", batch, "--max-lora-rank", "16"]
    if lora:
        args += ["--lora", "%s=%s" % (lora, os.path.join(S, "loras", lora))]
    if logprobs:
        args += ["--logprobs", str(logprobs)]
    if ignore_eos:
        args += ["--ignore-eos"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    os.unlink(batch)
    return json.loads(out.splitlines()[0])


def tokenize(text, **kw):
    st, r = post("/tokenize", {"prompt": text, "add_special_tokens": False}, **kw)
    assert st == 200, r
    return r["tokens"]


def eq(a, b, what=""):
    assert a == b, "%s: %r != %r" % (what, a, b)


# ---- checks ---------------------------------------------------------------------------------

def c_health_version_models():
    st, _ = call("GET", "/health")
    eq(st, 200, "health")
    st, v = call("GET", "/version")
    eq(st, 200)
    assert v["version"], v
    st, m = call("GET", "/v1/models")
    eq(st, 200)
    ids = {d["id"]: d for d in m["data"]}
    assert MODEL in ids and ids[MODEL]["parent"] is None, ids
    eq(ids["a0"]["parent"], MODEL, "a0 parent")
    eq(ids["a0"]["root"], os.path.realpath(os.path.join(S, "loras", "a0")), "a0 root")
    eq(m["object"], "list")


def c_completion_equals_generate():
    for lora in (None, "a0"):
        ids = tokenize("Hello, adapters")
        want = generate(ids, 12, lora)
        st, r = post("/v1/completions", {"model": lora or MODEL, "prompt": "Hello, adapters",
                                          "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True, "return_token_ids": True,
                                          "skip_special_tokens": False})
        eq(st, 200, r)
        ch = r["choices"][0]
        eq(ch["token_ids"], want["tokens"], "tokens (%s)" % lora)
        eq(ch["finish_reason"], "length")
        st, d = post("/detokenize", {"tokens": want["tokens"]})
        eq(ch["text"], d["prompt"], "text")
        eq(r["usage"], {"prompt_tokens": len(ids), "completion_tokens": 12,
                        "total_tokens": len(ids) + 12})
        eq(r["object"], "text_completion")
        assert r["id"].startswith("cmpl-"), r["id"]
    # Token-id prompts and lists of prompts.
    st, r = post("/v1/completions", {"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3,
                                     "ignore_eos": True, "temperature": 0,
                                     "return_token_ids": True})
    eq(st, 200, r)
    eq([c["token_ids"] for c in r["choices"]],
       [generate([5, 6, 7], 3)["tokens"], generate([8, 9], 3)["tokens"]])


def chat_ids(messages):
    st, r = post("/tokenize", {"messages": messages})
    assert st == 200, r
    return r["tokens"]


def c_chat_equals_generate():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    want = generate(chat_ids(msgs), 10, "a0")
    st, r = post("/v1/chat/completions", {"model": "a0", "messages": msgs, "max_tokens": 10,
                                          "temperature": 0, "ignore_eos": True,
                                          "return_token_ids": True,
                                          "skip_special_tokens": False})
    eq(st, 200, r)
    ch = r["choices"][0]
    eq(ch["token_ids"], want["tokens"])
    eq(ch["message"]["role"], "assistant")
    st, d = post("/detokenize", {"tokens": want["tokens"]})
    eq(ch["message"]["content"], d["prompt"])
    eq(r["object"], "chat.completion")


def c_stream_equals_whole():
    for path, body in (("/v1/completions", {"prompt": "Stream me", "max_tokens": 20}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "stream"}], "max_tokens": 20})):
        body = dict(body, temperature=0, ignore_eos=True, model="a0")
        st, whole = post(path, body)
        eq(st, 200, whole)
        events, ended = stream(path, dict(body, stream=True,
                                          stream_options={"include_usage": True}))
        assert ended, "no [DONE]"
        if "chat" in path:
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events
                           if e["choices"])
            want = whole["choices"][0]["message"]["content"]
            eq(events[0]["choices"][0]["delta"]["role"], "assistant")
        else:
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
            want = whole["choices"][0]["text"]
        eq(text, want, path)
        fins = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
        eq(fins[-1], "length")
        assert all(f is None for f in fins[:-1]), fins
        eq(events[-1]["choices"], [])
        eq(events[-1]["usage"], whole["usage"])
        # Each chunk carries new text (how many there are depends on how fast we read).
        pieces = [e["choices"][0]["delta"].get("content") if "chat" in path
                  else e["choices"][0]["text"] for e in events[1 if "chat" in path else 0:-2]]
        assert all(pieces), pieces


def c_logprobs_and_echo():
    ids = tokenize("logprobs")
    want = generate(ids, 6, "a0", logprobs=3)
    st, r = post("/v1/completions", {"model": "a0", "prompt": "logprobs", "max_tokens": 6,
                                     "temperature": 0, "ignore_eos": True, "logprobs": 3})
    eq(st, 200, r)
    lp = r["choices"][0]["logprobs"]
    eq(len(lp["token_logprobs"]), 6)
    for got, exp in zip(lp["token_logprobs"], want["top_logprobs"]):
        assert abs(got - exp[0][1]) < 1e-4, (got, exp)
    for tops, exp, got in zip(lp["top_logprobs"], want["top_logprobs"], lp["token_logprobs"]):
        # Byte tokens that are not UTF-8 alone all read U+FFFD, so names may collide.
        assert 1 <= len(tops) <= 4 and got in tops.values(), tops
        for v in tops.values():
            assert any(abs(v - e[1]) < 1e-4 for e in exp) or abs(v - got) < 1e-4, (tops, exp)
    eq(lp["text_offset"][0], 0)
    st, r = post("/v1/completions", {"model": "a0", "prompt": "logprobs", "max_tokens": 6,
                                     "temperature": 0, "ignore_eos": True, "logprobs": 1,
                                     "echo": True})
    eq(st, 200, r)
    ch = r["choices"][0]
    assert ch["text"].startswith("logprobs"), ch["text"]
    lp = ch["logprobs"]
    eq(len(lp["tokens"]), len(ids) + 6)
    assert lp["token_logprobs"][0] is None, lp["token_logprobs"][:2]
    for got, exp in zip(lp["token_logprobs"][1:len(ids)], want["prompt_logprobs"][1:]):
        assert abs(got - exp) < 1e-4, (got, exp)
    msgs = [{"role": "user", "content": "x"}]
    st, r = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "logprobs": True,
                                          "top_logprobs": 2, "temperature": 0,
                                          "ignore_eos": True})
    eq(st, 200, r)
    content = r["choices"][0]["logprobs"]["content"]
    eq(len(content), 4)
    eq(len(content[0]["top_logprobs"]), 2)
    assert content[0]["bytes"] == list(content[0]["token"].encode()), content[0]


def c_stop_strings():
    body = {"prompt": "stop here", "max_tokens": 30, "temperature": 0, "ignore_eos": True,
            "model": "a0"}
    st, r = post("/v1/completions", body)
    text = r["choices"][0]["text"]
    # A stop string that occurs in the greedy text: the answer ends right before it.
    stop = None
    for k in range(3, len(text) - 2):
        cand = text[k:k + 2]
        if cand.strip() and text.find(cand) == k and "\ufffd" not in cand:
            stop = cand
            break
    assert stop, "no usable stop string in %r" % text
    for streamed in (False, True):
        b = dict(body, stop=[stop, "never-there"])
        if streamed:
            events, _ = stream("/v1/completions", dict(b, stream=True))
            got = "".join(e["choices"][0]["text"] for e in events)
            fin = events[-1]["choices"][0]["finish_reason"]
        else:
            st, r2 = post("/v1/completions", b)
            got, fin = r2["choices"][0]["text"], r2["choices"][0]["finish_reason"]
            eq(r2["choices"][0]["stop_reason"], stop)
        eq(got, text[:text.find(stop)], "streamed=%s" % streamed)
        eq(fin, "stop")


def c_eos_ignore_eos_min_tokens():
    # The set-up made the model's EOS the greedy first token of this prompt.
    ids = json.load(open(os.path.join(S, "eos_prompt.json")))
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                     "return_token_ids": True})
    eq(st, 200, r)
    eq(r["choices"][0]["finish_reason"], "stop")
    eq(len(r["choices"][0]["token_ids"]), 1)
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                     "ignore_eos": True, "return_token_ids": True})
    eq(r["choices"][0]["finish_reason"], "length")
    eq(len(r["choices"][0]["token_ids"]), 8)
    eos = r["choices"][0]["token_ids"][0]  # greedy, ignoring EOS: EOS first
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                     "min_tokens": 5, "return_token_ids": True})
    got = r["choices"][0]["token_ids"]
    assert len(got) >= 5 and eos not in got[:5], (eos, r)  # masked, as vLLM does
    # The same for stop_token_ids.
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                     "ignore_eos": True, "stop_token_ids": [eos],
                                     "return_token_ids": True})
    eq(r["choices"][0]["token_ids"], [eos])
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                     "ignore_eos": True, "stop_token_ids": [eos],
                                     "min_tokens": 3, "return_token_ids": True})
    got = r["choices"][0]["token_ids"]
    assert len(got) >= 3 and eos not in got[:3], (eos, r)
    st, r = post("/v1/completions", {"prompt": ids, "max_tokens": 8, "min_tokens": 9})
    eq(st, 400, r)


def c_runtime_load_unload_reload():
    path = "a1"
    st, r = post("/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path})
    eq(st, 200, r)
    # Seen and served by the other frontend at once.
    st, m = call("GET", "/v1/models", p=port("port2"))
    assert "a1" in [d["id"] for d in m["data"]], m
    ids = tokenize("runtime", p=port("port2"))
    want = generate(ids, 5, "a1")
    body = {"model": "a1", "prompt": "runtime", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    st, r = post("/v1/completions", body, p=port("port2"))
    eq(st, 200, r)
    eq(r["choices"][0]["token_ids"], want["tokens"])
    st, r = post("/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path})
    eq(st, 400, r)
    assert "already loaded" in r["error"]["message"], r
    # Unload through the second frontend: gone from every rank before the answer.
    st, r = post("/v1/unload_lora_adapter", {"lora_name": "a1"}, p=port("port2"))
    eq(st, 200, r)
    res = control(os.path.join(S, "run"), "residency")["data"]
    for rank in res["ranks"]:
        assert "a1" not in rank["slots"] and "a1" not in rank["cpu"], rank
    st, r = post("/v1/completions", body)
    eq(st, 404, r)
    assert "a1" in r["error"]["message"], r
    for p in ("port1", "port2"):
        st, m = call("GET", "/v1/models", p=port(p))
        assert "a1" not in [d["id"] for d in m["data"]], m
    st, r = post("/v1/unload_lora_adapter", {"lora_name": "a1"})
    eq(st, 404, r)
    st, r = post("/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path})
    eq(st, 200, r)
    st, r = post("/v1/completions", body)
    eq(r["choices"][0]["token_ids"], want["tokens"])
    st, r = post("/v1/unload_lora_adapter", {"lora_name": "a1"})
    eq(st, 200, r)


def c_path_confinement():
    loras = os.path.join(S, "loras")
    cases = [
        ("../outside", 400, "'..'"),
        ("a0/../../outside", 400, "'..'"),
        (os.path.join(S, "outside"), 400, "outside the adapter root"),
        ("/etc", 400, "outside the adapter root"),
        ("link-out", 400, "leads outside the adapter root"),
        ("missing", 404, "no such adapter directory"),
        ("a-file", 400, "not a directory"),
        ("corrupt", 400, "corrupt"),
        ("other-base", 400, "other-base"),
        ("too-high-rank", 400, "rank"),
        (os.path.join(loras, "empty"), 400, "empty"),
    ]
    for path, status, words in cases:
        st, r = post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": path})
        eq(st, status, (path, r))
        assert words in r["error"]["message"], (path, words, r["error"]["message"])
        eq(r["error"]["code"], status)
    st, m = call("GET", "/v1/models")
    assert "bad" not in [d["id"] for d in m["data"]], m
    # Nothing else disturbed.
    st, r = post("/v1/completions", {"model": "a0", "prompt": "still", "max_tokens": 2})
    eq(st, 200, r)


def c_api_key():
    p = port("port_key")
    st, r = call("GET", "/v1/models", p=p)
    eq(st, 401, r)
    eq(r["error"]["type"], "AuthenticationError")
    st, r = call("GET", "/v1/models", p=p, headers={"Authorization": "Bearer nope"})
    eq(st, 401, r)
    st, r = call("GET", "/v1/models", p=p, headers={"Authorization": "Bearer s3cret"})
    eq(st, 200, r)
    st, _ = call("GET", "/health", p=p)
    eq(st, 200)


def c_concurrent_streams():
    body = {"prompt": "many at once", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "model": "a0"}
    st, whole = post("/v1/completions", body)
    want = whole["choices"][0]["text"]
    results = [None] * 64

    def one(i):
        try:
            ev, ended = stream("/v1/completions", dict(body, stream=True))
            results[i] = ("".join(e["choices"][0]["text"] for e in ev), ended)
        except Exception as e:  # reported below
            results[i] = (repr(e), False)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    for i, r in enumerate(results):
        eq(r, (want, True), "stream %d" % i)


def engine_running():
    d = control(os.path.join(S, "run"), "stats")["data"]
    return d.get("running", 0) + d.get("waiting", 0)


def c_disconnect_aborts():
    for streamed in (True, False):
        s = socket.create_connection(("127.0.0.1", port()))
        body = json.dumps({"prompt": "a long one", "max_tokens": 3000, "ignore_eos": True,
                           "stream": streamed})
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   "\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        deadline = time.time() + 10
        while engine_running() == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert engine_running() == 1, "the request never ran"
        if streamed:
            s.recv(100)
        s.close()
        deadline = time.time() + 5
        while engine_running() and time.time() < deadline:
            time.sleep(0.05)
        eq(engine_running(), 0, "still running after the client left (streamed=%s)" % streamed)


def c_stats_published():
    import msgpack
    import zmq
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"request")
    sub.connect("ipc://" + os.path.join(S, "run", "frontend-f1.sock"))
    time.sleep(0.3)
    st, r = post("/v1/completions", {"model": "a0", "prompt": "count me", "max_tokens": 7,
                                     "ignore_eos": True})
    eq(st, 200, r)
    assert sub.poll(5000), "no request stats"
    topic, magic, body = sub.recv_multipart()[:3]
    m = msgpack.unpackb(body, raw=False)
    eq((topic, magic), (b"request", b"LORA1"))
    eq(m["type"], "request_stats")
    eq(m["request_id"], r["id"] + "-0")
    eq((m["lora"], m["num_generation_tokens"], m["finish_reason"], m["max_tokens"]),
       ("a0", 7, "length", 7))
    eq(m["num_prompt_tokens"], r["usage"]["prompt_tokens"])
    assert m["arrival_time"] <= m["first_token_time"] <= m["finished_time"], m
    assert m["queued_time"] <= m["scheduled_time"] <= m["engine_first_token_time"] <= \
        m["engine_finished_time"], m
    sub.close()


CHECKS = {k[2:]: v for k, v in globals().items() if k.startswith("c_")}

if __name__ == "__main__":
    check(sys.argv[1], CHECKS[sys.argv[1]])
    sys.exit(done())
