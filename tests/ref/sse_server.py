#!/usr/bin/env python3
"""A tiny OpenAI-compatible completions server that is not lora-stack, for lora-bench's tests.

It streams /v1/completions as server-sent events the way OpenAI-compatible servers do (one
chunk per token, then a usage chunk when stream_options.include_usage asks for it, then
[DONE]), lists its models on /v1/models, and counts what it served on /metrics (vLLM's
vllm:generation_tokens_total and vllm:prompt_tokens_total, nothing of lora-stack's). The
options turn on the behaviours a client must cope with:

  --port N                 0: any free port; the ready line on stderr names it
  --models A,B,...         the model names it serves (default tiny,a1,a2); others get 404
  --refuse-stream-options  400 for a request that has stream_options (as older servers do)
  --ignore-usage           accept stream_options but never send a usage chunk
  --tokens-per-chunk K     K tokens in each chunk (default 1)
  --cut-every N            every Nth request's connection closes after half its tokens
  --no-done-every N        every Nth request's stream ends cleanly after half its tokens,
                           without [DONE]
  --error-every N          every Nth request sends an error event after its first token
  --busy-every N           every Nth request is refused with 503 before any byte of a stream
  --delay-ms D             D ms between tokens (default 1)
  --comments               an SSE comment (": ping") before every event
  --crlf                   lines end with CRLF

Only the standard library: http.server with a thread per connection.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"requests": 0, "generation_tokens": 0, "prompt_tokens": 0}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--models", default="tiny,a1,a2")
    p.add_argument("--refuse-stream-options", action="store_true")
    p.add_argument("--ignore-usage", action="store_true")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--cut-every", type=int, default=0)
    p.add_argument("--no-done-every", type=int, default=0)
    p.add_argument("--error-every", type=int, default=0)
    p.add_argument("--busy-every", type=int, default=0)
    p.add_argument("--delay-ms", type=float, default=1.0)
    p.add_argument("--comments", action="store_true")
    p.add_argument("--crlf", action="store_true")
    args = p.parse_args()
    models = args.models.split(",")
    nl = "\r\n" if args.crlf else "\n"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def reply(self, status, obj):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, status, message):
            self.reply(status, {"error": {"message": message, "type": "BadRequestError",
                                          "param": None, "code": status}})

        def do_GET(self):
            if self.path == "/v1/models":
                self.reply(200, {"object": "list",
                                 "data": [{"id": m, "object": "model", "root": m} for m in models]})
            elif self.path == "/metrics":
                with LOCK:
                    text = ("# TYPE vllm:generation_tokens_total counter\n"
                            "vllm:generation_tokens_total{model_name=\"tiny\"} %d.0\n"
                            "# TYPE vllm:prompt_tokens_total counter\n"
                            "vllm:prompt_tokens_total{model_name=\"tiny\"} %d.0\n"
                            % (STATE["generation_tokens"], STATE["prompt_tokens"])).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
            else:
                self.error(404, "no such path")

        def chunk(self, data):
            """One piece of the chunked body."""
            raw = data.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

        def event(self, obj):
            text = obj if isinstance(obj, str) else json.dumps(obj)
            pre = ": ping" + nl + nl if args.comments else ""
            self.chunk(pre + "data: " + text + nl + nl)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/completions":
                return self.error(404, "no such path")
            try:
                req = json.loads(body)
            except ValueError:
                return self.error(400, "the body is not JSON")
            if req.get("model") not in models:
                return self.error(404, "The model `%s` does not exist." % req.get("model"))
            if "stream_options" in req and args.refuse_stream_options:
                return self.error(400, "stream_options: not supported by this server")
            prompt = req.get("prompt")
            if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
                return self.error(400, "prompt must be a list of token ids here")
            n = int(req.get("max_tokens", 16))
            usage = bool((req.get("stream_options") or {}).get("include_usage")) \
                and not args.ignore_usage
            with LOCK:
                STATE["requests"] += 1
                number = STATE["requests"]
            if args.busy_every and number % args.busy_every == 0:
                return self.error(503, "the engine is busy")
            cut = args.cut_every and number % args.cut_every == 0
            short = args.no_done_every and number % args.no_done_every == 0
            fail = args.error_every and number % args.error_every == 0
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            head = {"id": "cmpl-%d" % number, "object": "text_completion",
                    "created": int(time.time()), "model": req["model"]}
            sent = 0
            while sent < n:
                if cut and sent >= n // 2:
                    # Gone mid-stream: the connection closes without the last chunk.
                    with LOCK:
                        STATE["generation_tokens"] += sent
                        STATE["prompt_tokens"] += len(prompt)
                    self.close_connection = True
                    return
                if short and sent >= n // 2:
                    # A well-formed end of the body, and no [DONE].
                    self.chunk("")
                    with LOCK:
                        STATE["generation_tokens"] += sent
                        STATE["prompt_tokens"] += len(prompt)
                    return
                k = min(args.tokens_per_chunk, n - sent)
                sent += k
                text = "".join("t%d " % (sent - k + i) for i in range(k))
                self.event(dict(head, choices=[{"index": 0, "text": text, "logprobs": None,
                                                "finish_reason": "length" if sent == n else None}]))
                if fail and sent == k:
                    self.event({"error": {"message": "the engine failed the request",
                                          "type": "ServiceUnavailableError", "code": 503}})
                    break
                time.sleep(args.delay_ms / 1000)
            if usage and not fail:
                self.event(dict(head, choices=[], usage={
                    "prompt_tokens": len(prompt), "completion_tokens": sent,
                    "total_tokens": len(prompt) + sent}))
            self.event("[DONE]")
            self.chunk("")  # the chunked body's end: the zero-length chunk
            with LOCK:
                STATE["generation_tokens"] += sent
                STATE["prompt_tokens"] += len(prompt)

    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    print("sse_server: ready: http://127.0.0.1:%d" % srv.server_address[1], file=sys.stderr,
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
