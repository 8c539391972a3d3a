#!/usr/bin/python3
"""Self-check of the Python reference: internal consistency only, no C code involved.

Prints TAP (ok N - name / not ok N - name, then 1..N); exits 1 when a check fails.
Each check builds what it needs from tiny fixtures in a temporary directory.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_reference as ref  # noqa: E402
import make_fixture as fix  # noqa: E402

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119]


def max_logprob_diff(model_a, model_b, adapter_a=None, ids=PROMPT):
    """Largest |difference| between the log-softmax of two models over every position."""
    a = ref.log_softmax(ref.forward(model_a, ids, adapter_a))
    b = ref.log_softmax(ref.forward(model_b, ids))
    return float(np.max(np.abs(a - b)))


def merged_model(tmp, name, dtype):
    """A llama fixture, an all-projection rsLoRA adapter for it, and their merge as dtype."""
    model_dir, adapter_dir = os.path.join(tmp, "base"), os.path.join(tmp, "lora")
    fix.write_model(model_dir, seed=3)
    fix.write_adapter(model_dir, adapter_dir, rank=4, alpha=8, rslora=True, seed=4)
    out = os.path.join(tmp, name)
    ref.merge_dir(model_dir, adapter_dir, out, dtype)
    model = ref.load_model(model_dir)
    return model, ref.load_adapter(adapter_dir, model.config), ref.load_model(out)


def check_merge_exact(tmp):
    model, adapter, merged = merged_model(tmp, "merged64", "F64")
    effect = max_logprob_diff(model, model, adapter)
    assert effect > 1e-2, f"the adapter barely changes the output ({effect:.3g})"
    diff = max_logprob_diff(model, merged, adapter)
    assert diff < 1e-9, f"unmerged vs merged (float64) differ by {diff:.3g}"


def check_merge_f32(tmp):
    model, adapter, merged = merged_model(tmp, "merged32", "F32")
    assert os.path.exists(os.path.join(tmp, "merged32", "generation_config.json"))
    diff = max_logprob_diff(model, merged, adapter)
    assert diff < 1e-4, f"unmerged vs merged (float32 file) differ by {diff:.3g}"


def naive_attention(q, k, v):
    """Causal attention written as loops: query head h reads KV head h // (heads / kv_heads)."""
    n, heads, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros_like(q)
    for h in range(heads):
        kv = h // group
        for i in range(n):
            scores = [float(q[i, h] @ k[j, kv]) / math.sqrt(d) for j in range(i + 1)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            out[i, h] = sum(w / total * v[j, kv] for j, w in enumerate(weights))
    return out


def check_attention(kv_heads):
    rng = np.random.default_rng(kv_heads)
    q = rng.standard_normal((6, 4, 8))
    k, v = rng.standard_normal((2, 6, kv_heads, 8))
    diff = np.max(np.abs(ref.attention(q, k, v) - naive_attention(q, k, v)))
    assert diff < 1e-12, f"vectorised vs per-head attention differ by {diff:.3g}"


def raw_bf16(path):
    """{name: float32 array} read with its own header parse: each uint16 shifted up 16 bits."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        assert entry["dtype"] == "BF16", f"{name} is {entry['dtype']}"
        begin, end = entry["data_offsets"]
        bits = np.frombuffer(blob[8 + n + begin:8 + n + end], dtype="<u2").astype(np.uint32)
        out[name] = (bits << 16).view(np.float32).reshape(entry["shape"])
    return out


def check_bf16(tmp):
    opts = dict(arch="mistral", tied=True, head_dim=16, seed=5)
    fix.write_model(os.path.join(tmp, "bf16"), dtype="bf16", **opts)
    fix.write_model(os.path.join(tmp, "f32"), dtype="f32", **opts)
    loaded = ref.load_model(os.path.join(tmp, "bf16")).weights
    exact = ref.load_model(os.path.join(tmp, "f32")).weights
    for name, bits in raw_bf16(os.path.join(tmp, "bf16", "model.safetensors")).items():
        assert np.array_equal(loaded[name], bits.astype(np.float64)), f"{name} differs"
        # The fixture rounds the same draws: BF16 keeps 8 significant bits.
        assert np.all(np.abs(loaded[name] - exact[name]) <= 2.0 ** -8 * np.abs(exact[name]))


def check_shards(tmp):
    opts = dict(arch="qwen2", layers=3, seed=6)
    fix.write_model(os.path.join(tmp, "one"), **opts)
    fix.write_model(os.path.join(tmp, "three"), shards=3, **opts)
    one = ref.load_model(os.path.join(tmp, "one"))
    three = ref.load_model(os.path.join(tmp, "three"))
    assert len(ref.weight_files(os.path.join(tmp, "three"))) == 3
    assert one.weights.keys() == three.weights.keys()
    for name in one.weights:
        assert np.array_equal(one.weights[name], three.weights[name]), f"{name} differs"
    assert max_logprob_diff(one, three) == 0.0


def check_rope_identity():
    cos, sin = ref.rope_tables(1, 16, 10000.0)
    x = np.random.default_rng(7).standard_normal((1, 3, 16))
    assert np.array_equal(ref.apply_rope(x, cos, sin), x)


def check_rope_relative():
    """q.k after RoPE depends only on the distance between the two positions."""
    cos, sin = ref.rope_tables(40, 16, 10000.0)
    rng = np.random.default_rng(8)
    q, k = (np.repeat(rng.standard_normal((1, 1, 16)), 40, axis=0) for _ in range(2))
    rq, rk = ref.apply_rope(q, cos, sin)[:, 0], ref.apply_rope(k, cos, sin)[:, 0]
    for i, j in ((5, 2), (30, 27), (3, 0)):
        assert abs(rq[i] @ rk[j] - rq[5] @ rk[2]) < 1e-12, f"positions {i}, {j}"


def check_causal(tmp):
    """A prefix's logits equal the first rows of the full sequence's: no future leaks in."""
    fix.write_model(os.path.join(tmp, "causal"), kv_heads=4, seed=9)
    model = ref.load_model(os.path.join(tmp, "causal"))
    full = ref.forward(model, PROMPT)
    prefix = ref.forward(model, PROMPT[:4])
    assert np.max(np.abs(full[:4] - prefix)) < 1e-12


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(HERE, "hf_reference.py"), *args],
                          capture_output=True, text=True, check=False)


def generate_outputs(tmp):
    """Runs the generate CLI on two requests and returns its parsed output lines."""
    model_dir, adapter_dir = os.path.join(tmp, "cli"), os.path.join(tmp, "cli-lora")
    fix.write_model(model_dir, seed=10)
    fix.write_adapter(model_dir, adapter_dir, targets=["q_proj", "v_proj", "down_proj"], seed=11)
    batch = os.path.join(tmp, "batch.jsonl")
    with open(batch, "w", encoding="utf-8") as f:
        f.write(json.dumps({"prompt_ids": PROMPT, "max_tokens": 5, "lora": None}) + "\n")
        f.write(json.dumps({"prompt_ids": PROMPT[:3], "max_tokens": 4, "lora": "x"}) + "\n")
    proc = run_cli("generate", "--model", model_dir, "--lora", f"x={adapter_dir}",
                   "--batch", batch, "--logprobs", "4")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def compare_rc(tmp, name, a, b):
    """Writes a and b as JSONL and returns the exit status of the compare command."""
    paths = []
    for side, lines in (("a", a), ("b", b)):
        paths.append(os.path.join(tmp, f"{name}-{side}.jsonl"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return run_cli("compare", *paths, "--tol", "1e-4").returncode


def check_compare(tmp):
    out = generate_outputs(tmp)
    assert len(out) == 2 and len(out[1]["tokens"]) == 4 and len(out[1]["top_logprobs"][0]) == 4
    assert out[0]["tokens"][0] == out[0]["top_logprobs"][0][0][0], "greedy token is not the top"
    assert compare_rc(tmp, "same", out, out) == 0, "identical files do not compare equal"
    cases = {"prompt logprob +1e-3": ("prompt_logprobs", 2, None),
             "top logprob +1e-3": ("top_logprobs", 2, 1), "token changed": ("tokens", 1, None)}
    for label, (field, pos, entry) in cases.items():
        bad = json.loads(json.dumps(out))
        if field == "tokens":
            bad[1][field][pos] += 1
        elif entry is None:
            bad[1][field][pos] += 1e-3
        else:
            bad[1][field][pos][entry][1] += 1e-3
        assert compare_rc(tmp, "bad", out, bad) == 1, f"{label}: compare passed"


def check_compare_near_tie(tmp):
    """Two entries within tol may swap places, and the cut after N may differ between them."""
    line = {"prompt_logprobs": [None, -1.0], "tokens": [7],
            "top_logprobs": [[[7, -0.5], [3, -2.00001], [9, -2.00002]]]}
    swapped = json.loads(json.dumps(line))
    swapped["top_logprobs"][0][1:] = [[9, -2.00002], [3, -2.00001]]
    cut = json.loads(json.dumps(line))
    cut["top_logprobs"][0][2] = [4, -2.00003]
    assert compare_rc(tmp, "swap", [line], [swapped]) == 0, "near-tie swap rejected"
    assert compare_rc(tmp, "cut", [line], [cut]) == 0, "near-tie at the cut rejected"
    far = json.loads(json.dumps(line))
    far["top_logprobs"][0][2] = [4, -2.5]
    assert compare_rc(tmp, "far", [line], [far]) == 1, "a different id far from the cut passed"


CHECKS = [
    ("adapter applied unmerged equals the merged model (float64 file, < 1e-9)", check_merge_exact),
    ("adapter applied unmerged equals the merged model (float32 file, < 1e-4)", check_merge_f32),
    ("attention with kv_heads == heads equals a per-head loop", lambda _: check_attention(4)),
    ("grouped-query attention (4 heads, 2 KV heads) equals a per-head loop",
     lambda _: check_attention(2)),
    ("bf16 fixture loads to the values of shifting its raw bits", check_bf16),
    ("3-shard fixture equals the unsharded one of the same seed", check_shards),
    ("rotate-half RoPE at position 0 is the identity", lambda _: check_rope_identity()),
    ("RoPE dot products depend only on relative position", lambda _: check_rope_relative()),
    ("logits of a prefix equal the prefix rows of the full sequence", check_causal),
    ("compare passes identical outputs and fails perturbed ones", check_compare),
    ("compare tolerates near-tie swaps and cuts in top_logprobs", check_compare_near_tie),
]


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, check) in enumerate(CHECKS, 1):
            workdir = os.path.join(tmp, str(number))
            os.makedirs(workdir)
            try:
                check(workdir)
                print(f"ok {number} - {name}")
            except Exception:  # noqa: BLE001 - report any failure, then run the next check
                failed += 1
                print(f"not ok {number} - {name}")
                for line in traceback.format_exc().splitlines():
                    print(f"# {line}")
    print(f"1..{len(CHECKS)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
