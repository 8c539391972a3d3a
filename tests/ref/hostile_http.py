#!/usr/bin/python3
"""Malformed and hostile HTTP requests against lora-frontend: each must get its status and a
message naming what is wrong, and the server must keep serving. Prints TAP.

    hostile_http.py PORT
"""

import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import check, done  # noqa: E402

PORT = int(sys.argv[1])


def raw(data, timeout=10, read=True):
    """Sends bytes, returns (status, body text)."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    s.sendall(data)
    if not read:
        return s
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            if b"Content-Length:" in head:
                n = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
                if len(body) >= n:
                    break
    except socket.timeout:
        pass
    s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.") else 0
    return status, body.decode(errors="replace")


def request(method, path, body=b"", headers=()):
    h = ["%s %s HTTP/1.1" % (method, path), "Host: x", "Connection: close",
         "Content-Length: %d" % len(body)] + list(headers)
    return raw(("\r\n".join(h) + "\r\n\r\n").encode() + body)


def expect(method, path, body, status, words, headers=()):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    st, text = request(method, path, body, ["Content-Type: application/json"] + list(headers))
    assert st == status, (st, text[:300])
    if words:
        err = json.loads(text)["error"]
        assert words in err["message"], (words, err)
        assert err["code"] == status and err["type"], err


C = "/v1/completions"
H = "/v1/chat/completions"
P = {"prompt": "hi", "max_tokens": 2}
M = [{"role": "user", "content": "hi"}]

CASES = [
    ("bad JSON", C, "{not json", 400, "invalid JSON"),
    ("truncated JSON", C, '{"prompt": "hi"', 400, "invalid JSON"),
    ("JSON array body", C, "[1,2]", 400, "JSON object"),
    ("JSON string body", C, '"x"', 400, "JSON object"),
    ("empty body", C, "", 400, "JSON body"),
    ("duplicate keys", C, '{"prompt":"a","prompt":"b"}', 400, "duplicate"),
    ("invalid UTF-8", C, b'{"prompt":"\xff\xfe"}', 400, "invalid JSON"),
    ("prompt missing", C, {"max_tokens": 2}, 400, "'prompt' is required"),
    ("prompt empty string", C, {"prompt": ""}, 400, "must not be empty"),
    ("prompt empty list", C, {"prompt": []}, 400, "not empty"),
    ("prompt number", C, {"prompt": 5}, 400, "'prompt' must be"),
    ("prompt list of mixed", C, {"prompt": ["a", 5]}, 400, "prompt[1]"),
    ("prompt token out of range", C, {"prompt": [1, 99999]}, 400, "token ids"),
    ("prompt negative token", C, {"prompt": [-1]}, 400, "token ids"),
    ("prompt too long", C, {"prompt": [1] * 5000, "max_tokens": 1}, 400, "maximum context"),
    ("max_tokens string", C, dict(P, max_tokens="5"), 400, "'max_tokens' must be an integer"),
    ("max_tokens zero", C, dict(P, max_tokens=0), 400, "'max_tokens' must be between"),
    ("max_tokens negative", C, dict(P, max_tokens=-3), 400, "'max_tokens'"),
    ("max_tokens huge", C, dict(P, max_tokens=10**12), 400, "'max_tokens'"),
    ("max_tokens float", C, dict(P, max_tokens=2.5), 400, "'max_tokens' must be an integer"),
    ("temperature negative", C, dict(P, temperature=-1), 400, "'temperature'"),
    ("temperature string", C, dict(P, temperature="hot"), 400, "'temperature' must be a number"),
    ("top_p zero", C, dict(P, top_p=0), 400, "'top_p'"),
    ("top_p above one", C, dict(P, top_p=1.5), 400, "'top_p'"),
    ("top_k below -1", C, dict(P, top_k=-2), 400, "'top_k'"),
    ("n zero", C, dict(P, n=0), 400, "'n'"),
    ("n huge", C, dict(P, n=100000), 400, "'n'"),
    ("logprobs too many", C, dict(P, logprobs=1000), 400, "'logprobs'"),
    ("stop wrong type", C, dict(P, stop=5), 400, "'stop'"),
    ("stop list of numbers", C, dict(P, stop=[1]), 400, "'stop'"),
    ("stop too many", C, dict(P, stop=["a"] * 100), 400, "'stop'"),
    ("stream not bool", C, dict(P, stream="yes"), 400, "'stream'"),
    ("echo not bool", C, dict(P, echo=1), 400, "'echo'"),
    ("seed string", C, dict(P, seed="x"), 400, "'seed'"),
    ("min_tokens above max_tokens", C, dict(P, min_tokens=5), 400, "'min_tokens'"),
    ("presence_penalty unsupported", C, dict(P, presence_penalty=0.5), 400, "not supported"),
    ("best_of unsupported", C, dict(P, best_of=3), 400, "'best_of'"),
    ("stream_options without stream", C, dict(P, stream_options={"include_usage": True}), 400,
     "'stream_options'"),
    ("model empty", C, dict(P, model=""), 400, "'model'"),
    ("model number", C, dict(P, model=3), 400, "'model'"),
    ("unknown model", C, dict(P, model="no-such-adapter"), 404, "not found"),
    ("unknown model streamed", C, dict(P, model="no-such-adapter", stream=True), 404,
     "not found"),
    ("messages missing", H, {"max_tokens": 2}, 400, "'messages'"),
    ("messages empty", H, {"messages": []}, 400, "'messages'"),
    ("message without role", H, {"messages": [{"content": "x"}]}, 400, "'role'"),
    ("message unknown role", H, {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "wizard"),
    ("message content number", H, {"messages": [{"role": "user", "content": 5}]}, 400,
     "content"),
    ("message image part", H, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text part"),
    ("top_logprobs without logprobs", H, {"messages": M, "top_logprobs": 2}, 400,
     "'top_logprobs'"),
    ("load without name", "/v1/load_lora_adapter", {"lora_path": "a0"}, 400, "'lora_name'"),
    ("load without path", "/v1/load_lora_adapter", {"lora_name": "z"}, 400, "'lora_path'"),
    ("load name with comma", "/v1/load_lora_adapter", {"lora_name": "a,b", "lora_path": "a0"},
     400, "comma"),
    ("unload unknown", "/v1/unload_lora_adapter", {"lora_name": "nobody"}, 404, "not found"),
    ("tokenize nothing", "/tokenize", {}, 400, "'prompt'"),
    ("detokenize bad ids", "/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
    ("detokenize unknown id", "/detokenize", {"tokens": [99999]}, 400, ""),
]


def make(path, body, status, words):
    return lambda: expect("POST", path, body, status, words)


for case in CASES:
    check(case[0], make(*case[1:]))

check("unknown fields are ignored, as vLLM does",
      lambda: expect("POST", C, dict(P, x_unknown={"a": [1]}, another=3), 200, None))
check("unknown endpoint is 404", lambda: expect("GET", "/v2/nothing", b"", 404, "no such endpoint"))
check("wrong method is 405", lambda: expect("GET", C, b"", 405, "not allowed"))


def oversized():
    body = b'{"prompt":"' + b"a" * (17 << 20) + b'"}'
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (C, len(body))).encode())
    head = s.recv(65536)
    s.close()
    assert b" 413 " in head.split(b"\r\n")[0], head[:200]


def oversized_chunked():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" % C).encode())
    chunk = b"a" * (1 << 20)
    got = b""
    try:
        for _ in range(20):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server closed after answering
    try:
        got = s.recv(65536)
    except OSError:
        pass
    s.close()
    assert b" 413 " in got.split(b"\r\n")[0], got[:200]


def slow_body():
    """A body that never completes: the connection times out, others are served meanwhile."""
    s = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
            read=False)
    expect("GET", "/v1/models", b"", 200, None)
    s.close()


def truncated_body():
    s = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
            read=False)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(10)
    try:
        s.recv(100)
    except OSError:
        pass
    s.close()
    expect("GET", "/v1/models", b"", 200, None)


def garbage_request_line():
    st, _ = raw(b"\x00\x01\x02 garbage\r\n\r\n")
    assert st in (0, 400), st
    expect("GET", "/v1/models", b"", 200, None)


def many_connections():
    socks = [socket.create_connection(("127.0.0.1", PORT), timeout=10) for _ in range(200)]
    expect("GET", "/v1/models", b"", 200, None)
    for s in socks:
        s.close()
    errors = []

    def one():
        try:
            expect("POST", C, P, 200, None)
        except Exception as e:  # collected below
            errors.append(e)

    ts = [threading.Thread(target=one) for _ in range(32)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors[:3]


def keep_alive():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    for _ in range(3):
        s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"}" not in data:
            data += s.recv(4096)
        assert b" 200 " in data, data
    s.close()


check("oversized body by Content-Length is 413", oversized)
check("oversized chunked body is 413", oversized_chunked)
check("a slow body does not block other clients", slow_body)
check("a truncated body is dropped, the server goes on", truncated_body)
check("a garbage request line is refused", garbage_request_line)
check("200 idle connections and 32 concurrent requests", many_connections)
check("keep-alive serves several requests on one connection", keep_alive)
check("still healthy after all of it", lambda: expect("GET", "/health", b"", 200, None))
time.sleep(0)
sys.exit(done())
