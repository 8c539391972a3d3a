#!/usr/bin/python3
"""Checks of vLLM's request fields on lora-frontend over HTTP against a running stack
(tests/e2e/vllm_fields.bats starts it). Prints TAP for the named check only.

    test_vllm_fields.py CHECK STATE_DIR

STATE_DIR holds what the bats set-up wrote: port_plain (a frontend with --generation-config
vllm), port_dir (--generation-config DIR, DIR/generation_config.json holding temperature 0,
top_k 5 and max_new_tokens 7), port_auto (the model's own file, max_new_tokens 5), run (the
engine's run directory, started with --generation-config DIR) and bin (the programs).
"""

import http.client
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import check, done  # noqa: E402

S = sys.argv[2]
BIN = open(os.path.join(S, "bin")).read().strip()
PROMPT = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


def port(name="plain"):
    return int(open(os.path.join(S, "port_" + name)).read())


def post(path, body, p="plain"):
    c = http.client.HTTPConnection("127.0.0.1", port(p), timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, json.loads(text)


def stream(path, body, p="plain"):
    """The parsed data events of a streamed response (status 200 asserted)."""
    c = http.client.HTTPConnection("127.0.0.1", port(p), timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    assert r.status == 200, (r.status, text)
    return [json.loads(line[6:]) for line in text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def completion(p="plain", **fields):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    body.update(fields)
    body = {k: v for k, v in body.items() if v is not None}
    status, r = post("/v1/completions", body, p)
    assert status == 200, (status, r)
    return r


def refused(path, body, param):
    status, r = post(path, body)
    assert status == 400, (status, r)
    assert r["error"]["param"] == param, r
    assert r["error"]["type"] == "BadRequestError", r
    assert param in r["error"]["message"], r


def chat_body(**fields):
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True}
    body.update(fields)
    return body


# ---- include_stop_str_in_output -------------------------------------------------------------

def include_stop_str():
    full = completion(max_tokens=16)["choices"][0]["text"]
    assert len(full) >= 6, full
    stop = full[3:5]  # a piece of the greedy text: it must end the answer
    at = full.index(stop)
    cut = completion(max_tokens=16, stop=[stop])["choices"][0]
    assert cut["text"] == full[:at] and cut["finish_reason"] == "stop", (cut, full)
    kept = completion(max_tokens=16, stop=[stop], include_stop_str_in_output=True)["choices"][0]
    assert kept["text"] == full[:at + len(stop)], (kept, full, stop)
    assert kept["finish_reason"] == "stop" and kept["stop_reason"] == stop, kept
    events = stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                        "ignore_eos": True, "stream": True, "stop": [stop],
                                        "include_stop_str_in_output": True})
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == kept["text"], (text, kept)
    refused("/v1/completions", {"prompt": PROMPT, "include_stop_str_in_output": "yes"},
            "include_stop_str_in_output")


# ---- allowed_token_ids ---------------------------------------------------------------------

def allowed_token_ids():
    allowed = [33, 44, 55, 66, 77]
    r = completion(max_tokens=16, temperature=1.0, seed=5, allowed_token_ids=allowed,
                   return_token_ids=True)["choices"][0]
    assert len(r["token_ids"]) == 16 and set(r["token_ids"]) <= set(allowed), r["token_ids"]
    # Unrestricted, the same seed goes elsewhere: the mask is what kept the tokens in the set.
    free = completion(max_tokens=16, temperature=1.0, seed=5, return_token_ids=True)
    assert not set(free["choices"][0]["token_ids"]) <= set(allowed), free
    # The mask is the request's own: run beside unrestricted neighbours, in shared steps, both
    # give what they give alone.
    got = {}

    def one(name, **kw):
        got[name] = completion(max_tokens=16, temperature=1.0, seed=5, return_token_ids=True,
                               **kw)["choices"][0]["token_ids"]
    threads = [threading.Thread(target=one, args=("masked%d" % i,),
                                kwargs={"allowed_token_ids": allowed}) for i in range(3)]
    threads += [threading.Thread(target=one, args=("free%d" % i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert got["masked%d" % i] == r["token_ids"], (got, r)
        assert got["free%d" % i] == free["choices"][0]["token_ids"], (got, free)
    # Greedy picks the most likely allowed token, and its log-probability is the model's raw
    # one (vLLM computes log-probabilities before the allowed-token mask).
    top = completion(max_tokens=1, logprobs=20, return_tokens_as_token_ids=True)
    ranked = sorted(top["choices"][0]["logprobs"]["top_logprobs"][0].items(),
                    key=lambda kv: -kv[1])
    ids = [int(k.split(":")[1]) for k, _ in ranked]
    pick = [ids[3], ids[5], ids[7]]
    one = completion(max_tokens=1, logprobs=1, allowed_token_ids=pick[::-1],
                     return_tokens_as_token_ids=True, return_token_ids=True)["choices"][0]
    assert one["token_ids"] == [ids[3]], (one, ids)
    assert abs(one["logprobs"]["token_logprobs"][0] - ranked[3][1]) < 1e-4, (one, ranked[3])
    # Chat and streaming take it too.
    status, c = post("/v1/chat/completions",
                     chat_body(temperature=1.0, seed=3, allowed_token_ids=allowed,
                               return_token_ids=True))
    assert status == 200 and set(c["choices"][0]["token_ids"]) <= set(allowed), c
    events = stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0,
                                        "seed": 9, "ignore_eos": True, "stream": True,
                                        "allowed_token_ids": allowed, "return_token_ids": True})
    ids = [t for e in events for ch in e["choices"] for t in ch.get("token_ids", [])]
    assert len(ids) == 8 and set(ids) <= set(allowed), ids
    for bad in ([], [258], [-1], ["7"], 5, list(range(1025))):
        refused("/v1/completions", {"prompt": PROMPT, "allowed_token_ids": bad},
                "allowed_token_ids")


# ---- truncate_prompt_tokens ----------------------------------------------------------------

def truncate_prompt_tokens():
    cut = completion(truncate_prompt_tokens=4)
    short = completion(prompt=PROMPT[-4:])
    assert cut["usage"]["prompt_tokens"] == 4, cut["usage"]
    assert cut["choices"][0]["text"] == short["choices"][0]["text"], (cut, short)
    assert completion(prompt=PROMPT)["choices"][0]["text"] != short["choices"][0]["text"]
    # Echo shows the prompt that ran.
    echo = completion(truncate_prompt_tokens=4, echo=True, max_tokens=1, return_token_ids=True)
    assert echo["choices"][0]["prompt_token_ids"] == PROMPT[-4:], echo
    # Longer than the prompt, or -1 (the whole context): nothing cut.
    for n in (50, -1):
        assert completion(truncate_prompt_tokens=n)["usage"]["prompt_tokens"] == len(PROMPT)
    status, c = post("/v1/chat/completions", chat_body(truncate_prompt_tokens=3))
    assert status == 200 and c["usage"]["prompt_tokens"] == 3, c
    for bad in (0, -2, 1 << 20, "4"):
        refused("/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": bad},
                "truncate_prompt_tokens")


# ---- prompt_logprobs -----------------------------------------------------------------------

def prompt_logprobs():
    r = completion(max_tokens=2, prompt_logprobs=0)["choices"][0]
    plp = r["prompt_logprobs"]
    assert len(plp) == len(PROMPT) and plp[0] is None, plp
    # The same values as echo with logprobs gives, keyed by the prompt token's id.
    echo = completion(max_tokens=2, echo=True, logprobs=0)["choices"][0]["logprobs"]
    for i in range(1, len(PROMPT)):
        assert list(plp[i].keys()) == [str(PROMPT[i])], plp[i]
        entry = plp[i][str(PROMPT[i])]
        assert set(entry) == {"logprob", "rank", "decoded_token"}, entry
        assert abs(entry["logprob"] - echo["token_logprobs"][i]) < 1e-5, (entry, echo)
        assert entry["decoded_token"] == echo["tokens"][i], (entry, echo["tokens"][i])
        assert isinstance(entry["rank"], int) and entry["rank"] >= 1, entry
    # The rank is the token's place in the model's distribution at that position: make the
    # second prompt token the third most likely after the first.
    top = completion(prompt=PROMPT[:1], max_tokens=1, logprobs=5,
                     return_tokens_as_token_ids=True)["choices"][0]["logprobs"]["top_logprobs"][0]
    ranked = sorted(top.items(), key=lambda kv: -kv[1])
    third = int(ranked[2][0].split(":")[1])
    two = completion(prompt=[PROMPT[0], third], max_tokens=1, prompt_logprobs=0)
    entry = two["choices"][0]["prompt_logprobs"][1][str(third)]
    assert entry["rank"] == 3 and abs(entry["logprob"] - ranked[2][1]) < 1e-4, (entry, ranked)
    # Without the field: null, as vLLM answers.
    assert completion(max_tokens=1)["choices"][0]["prompt_logprobs"] is None
    # Chat: beside the choices, one entry per prompt token.
    status, c = post("/v1/chat/completions", chat_body(prompt_logprobs=0))
    assert status == 200, c
    assert len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"], c
    assert c["prompt_logprobs"][0] is None and all(c["prompt_logprobs"][1:]), c
    status, c = post("/v1/chat/completions", chat_body())
    assert status == 200 and c["prompt_logprobs"] is None, c
    # With N: the N most likely tokens of each position too, ranks 1 to N, the same as a
    # generation step from that prefix reports.
    r = completion(max_tokens=1, prompt_logprobs=3)["choices"][0]["prompt_logprobs"]
    for i in (1, 4):
        step = completion(prompt=PROMPT[:i], max_tokens=1, logprobs=3,
                          return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
        want = sorted(((int(k.split(":")[1]), v) for k, v in step["top_logprobs"][0].items()),
                      key=lambda kv: -kv[1])[:3]
        pos = r[i]
        assert list(pos)[0] == str(PROMPT[i]), pos  # the prompt token first
        tops = sorted(((int(k), e) for k, e in pos.items() if e["rank"] <= 3),
                      key=lambda kv: kv[1]["rank"])
        if pos[str(PROMPT[i])]["rank"] > 3:
            assert len(pos) == 4, pos
        assert [t for t, _ in tops] == [t for t, _ in want], (pos, want)
        assert [e["rank"] for _, e in tops] == [1, 2, 3], pos
        for (_, e), (_, lp) in zip(tops, want):
            assert abs(e["logprob"] - lp) < 1e-4, (e, lp)
    # echo with logprobs shows the prompt positions' alternatives too, as vLLM does.
    lp = completion(max_tokens=1, echo=True, logprobs=2,
                    return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    assert lp["top_logprobs"][0] is None, lp
    for tops in lp["top_logprobs"][1:len(PROMPT)]:
        assert 2 <= len(tops) <= 3, tops
    refused("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 0, "stream": True},
            "prompt_logprobs")
    for bad in (-1, 21, "0", 2.5):
        refused("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": bad},
                "prompt_logprobs")


# ---- return_tokens_as_token_ids ------------------------------------------------------------

def return_tokens_as_token_ids():
    r = completion(max_tokens=4, logprobs=2, echo=True, return_tokens_as_token_ids=True,
                   return_token_ids=True)["choices"][0]
    lp = r["logprobs"]
    want = ["token_id:%d" % t for t in PROMPT + r["token_ids"]]
    assert lp["tokens"] == want, (lp["tokens"], want)
    for tops in lp["top_logprobs"][len(PROMPT):]:
        assert tops and all(k.startswith("token_id:") for k in tops), tops
    plain = completion(max_tokens=4, logprobs=2)["choices"][0]["logprobs"]
    assert plain["tokens"] != lp["tokens"][len(PROMPT):], plain
    status, c = post("/v1/chat/completions",
                     chat_body(logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True,
                               return_token_ids=True))
    assert status == 200, c
    content = c["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == \
        ["token_id:%d" % t for t in c["choices"][0]["token_ids"]], content
    for e in content:
        assert e["bytes"] == list(e["token"].encode()), e
        assert all(t["token"].startswith("token_id:") for t in e["top_logprobs"]), e
    events = stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0,
                                        "ignore_eos": True, "stream": True, "logprobs": 0,
                                        "return_tokens_as_token_ids": True})
    toks = [t for e in events for ch in e["choices"] if ch["logprobs"]
            for t in ch["logprobs"]["tokens"]]
    assert len(toks) == 3 and all(t.startswith("token_id:") for t in toks), toks


# ---- response_format and the refused fields ------------------------------------------------

def response_format_text():
    a = completion()["choices"][0]["text"]
    assert completion(response_format={"type": "text"})["choices"][0]["text"] == a
    status, c = post("/v1/chat/completions", chat_body(response_format={"type": "text"}))
    assert status == 200, c
    for bad in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": "structural_tag"}, "text", {"kind": "text"}):
        refused("/v1/completions", {"prompt": PROMPT, "response_format": bad},
                "response_format")
        refused("/v1/chat/completions", chat_body(response_format=bad), "response_format")


def refused_fields():
    cases = [
        ("suffix", "tail"), ("suffix", ""), ("use_beam_search", True),
        ("structured_outputs", {"regex": "a+"}), ("guided_grammar", "root ::= \"a\""),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("lora", [{"id": 0, "scale": 1.0}]), ("bad_words", ["the"]),
        ("logits_processors", ["my.Processor"]), ("kv_transfer_params", {"do_remote_decode": 1}),
        ("prompt_embeds", "AAAA"), ("spaces_between_special_tokens", False), ("priority", 1),
    ]
    for key, value in cases:
        refused("/v1/completions", {"prompt": PROMPT, key: value}, key)
        refused("/v1/completions", {"prompt": PROMPT, key: value, "stream": True}, key)
        refused("/v1/chat/completions", chat_body(**{key: value}), key)
        refused("/v1/chat/completions", chat_body(stream=True, **{key: value}), key)
    for choice in ("required", {"type": "function", "function": {"name": "f"}}, "sometimes"):
        refused("/v1/chat/completions", chat_body(tool_choice=choice), "tool_choice")
    # What would change the conversation's rendering or the reply's shape in chat.
    for key, value in (("chat_template", "{{ messages }}"),
                       ("chat_template_kwargs", {"enable_thinking": False}),
                       ("documents", [{"title": "t", "text": "x"}]),
                       ("continue_final_message", True), ("echo", True)):
        refused("/v1/chat/completions", chat_body(**{key: value}), key)
    # The neutral values pass: no tools means "none" and "auto" answer in plain text.
    a = post("/v1/chat/completions", chat_body())[1]["choices"][0]["message"]["content"]
    for choice in ("none", "auto", None):
        status, c = post("/v1/chat/completions", chat_body(tool_choice=choice))
        assert status == 200 and c["choices"][0]["message"]["content"] == a, c
    status, c = post("/v1/chat/completions", chat_body(tool_choice="required", tools=[]))
    assert status == 200 and c["choices"][0]["message"]["content"] == a, c
    assert completion(use_beam_search=False, suffix=None, lora=None, bad_words=[], priority=0,
                      spaces_between_special_tokens=True, logits_processors=None,
                      chat_template="not a chat field here")["choices"]
    status, c = post("/v1/chat/completions",
                     chat_body(chat_template_kwargs={}, continue_final_message=False, echo=False,
                               documents=None))
    assert status == 200 and c["choices"][0]["message"]["content"] == a, c


# ---- generation config ---------------------------------------------------------------------

def generation_config_defaults():
    # DIR's file: temperature 0 (greedy), top_k 5, max_new_tokens 7.
    body = {"prompt": PROMPT, "ignore_eos": True, "return_token_ids": True}
    status, r = post("/v1/completions", body, "dir")
    assert status == 200, r
    greedy = completion(max_tokens=7, return_token_ids=True)["choices"][0]["token_ids"]
    assert r["choices"][0]["token_ids"] == greedy, (r, greedy)
    # max_new_tokens caps a request that asks for more, as vLLM takes the smaller.
    status, r = post("/v1/completions", dict(body, max_tokens=12), "dir")
    assert status == 200 and r["usage"]["completion_tokens"] == 7, r
    status, r = post("/v1/completions", dict(body, max_tokens=3), "dir")
    assert status == 200 and r["usage"]["completion_tokens"] == 3, r
    # A field the request sets wins over the default: sampled, seeded as on the plain frontend.
    seeded = dict(body, temperature=1.0, top_k=0, seed=11, max_tokens=7)
    status, r = post("/v1/completions", seeded, "dir")
    assert r["choices"][0]["token_ids"] == \
        completion(**seeded)["choices"][0]["token_ids"], r
    # The default top_k 5 applies when only temperature is set: every token is among the five
    # most likely of its step.
    status, r = post("/v1/completions", dict(body, temperature=5.0, seed=4, logprobs=5),
                     "dir")
    lp = r["choices"][0]["logprobs"]
    for tok, tops in zip(lp["tokens"], lp["top_logprobs"]):
        assert len(tops) <= 6 and tok in tops, (tok, tops)
        assert sorted(tops.values(), reverse=True).index(tops[tok]) < 5, (tok, tops)
    # The model's own file (auto): max_new_tokens 5; top_k 50 and temperature 1.0 in it are the
    # Hugging Face defaults, which vLLM does not take as defaults.
    status, r = post("/v1/completions", body, "auto")
    assert status == 200 and r["usage"]["completion_tokens"] == 5, r
    # vllm: the file ignored, the completions default of 16 tokens.
    assert completion(max_tokens=None)["usage"]["completion_tokens"] == 16


def generation_config_shown():
    out = subprocess.run([os.path.join(BIN, "lora-inspect"), "config", "--run-dir",
                          os.path.join(S, "run"), "--json"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out
    rec = json.loads(out.stdout.splitlines()[0])
    assert rec["generation_config"] == os.path.join(S, "gc", "generation_config.json"), rec
    assert rec["default_temperature"] == 0 and rec["default_top_k"] == 5, rec
    assert rec["default_max_tokens"] == 7 and rec["default_top_p"] is None, rec


CHECKS = {
    "include_stop_str": include_stop_str,
    "allowed_token_ids": allowed_token_ids,
    "truncate_prompt_tokens": truncate_prompt_tokens,
    "prompt_logprobs": prompt_logprobs,
    "return_tokens_as_token_ids": return_tokens_as_token_ids,
    "response_format_text": response_format_text,
    "refused_fields": refused_fields,
    "generation_config_defaults": generation_config_defaults,
    "generation_config_shown": generation_config_shown,
}

if __name__ == "__main__":
    check(sys.argv[1], CHECKS[sys.argv[1]])
    sys.exit(done())
