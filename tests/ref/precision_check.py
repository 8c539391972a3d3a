#!/usr/bin/python3
"""Accuracy of lora-worker at a reduced precision against the float64 reference.

Teacher-forced, position by position: the reference decodes each prompt greedily for --positions
tokens; then the worker is asked for the full next-token distribution after every prefix of
prompt + those tokens (one request per prefix, run together in one `generate --batch`), and so is
the reference. At each position:
  agree  the worker's most likely token is the reference's greedy token
  dlp    |worker's - reference's log-probability| of the reference's greedy token
  kl     KL(reference || worker) over the whole vocabulary
--round bf16|f16 first rounds the reference's matmul weights and embedding (not the norms) as
`--dtype bfloat16|float16` does to a float32 checkpoint; --round-lora the adapter's A and B as
`--lora-dtype` does. --quantize int8 computes the reference with `--quantization int8`'s
arithmetic instead: every matmul weight the worker quantizes (the projections and the LM head,
which a tied embedding's lookup then reads quantized too) and every row of activations those
matmuls read, in groups of 64 as the worker does, products exact in float64. Prints one summary
line and exits 1 when a bound given by --min-agree, --max-dlp or --max-kl is broken.

  precision_check.py --worker BIN --model DIR [--lora DIR] [--round bf16|f16] [--round-lora T]
                     [--quantize int8] [--positions N] [--min-agree F] [--max-dlp X]
                     [--max-kl X] -- WORKER FLAGS
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

PROMPTS = [[256, 5, 17, 99, 3], [7], [256, 40, 41, 42, 43, 44, 45, 46], [120, 121, 9, 200]]


def round_to(values, kind):
    """values rounded to bfloat16 or float16 (round to nearest even), back in float64."""
    if kind == "f16":
        return values.astype(np.float16).astype(np.float64)
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


I8_GROUP = 64  # backend.h's LORA_I8_GROUP


def quantized_int8(values):
    """values [..., cols] quantized in groups of I8_GROUP along the last axis with the float32
    operations of the worker's quantizer (scale = max |v| / 127, q = v / scale to nearest even,
    within +-127; a zero group stays zero), returned as q * scale in float64."""
    v = values.astype(np.float32)
    cols = v.shape[-1]
    pad = [(0, 0)] * (v.ndim - 1) + [(0, -cols % I8_GROUP)]
    groups = np.pad(v, pad).reshape(*v.shape[:-1], -1, I8_GROUP)
    scale = np.abs(groups).max(axis=-1, keepdims=True) / np.float32(127)
    q = np.clip(np.rint(groups / np.where(scale > 0, scale, np.float32(1))), -127, 127)
    out = q.astype(np.float64) * scale.astype(np.float64)
    return out.reshape(*v.shape[:-1], -1)[..., :cols]


def int8_model(model):
    names = [n for n in model.weights if n.endswith("proj.weight") or n == model.lm_head_name()]
    for name in names:
        model.weights[name] = quantized_int8(model.weights[name])
    model.quantized_inputs = frozenset(names)
    model.quantize_rows = quantized_int8
    return model


def rounded(model, kind):
    for name in list(model.weights):
        if name.endswith("proj.weight") or "embed_tokens" in name or name == "lm_head.weight":
            model.weights[name] = round_to(model.weights[name], kind)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--lora", help="adapter directory applied to every request")
    p.add_argument("--round", choices=("bf16", "f16"))
    p.add_argument("--round-lora", choices=("bf16", "f16"),
                   help="round the adapter's A and B as --lora-dtype bfloat16|float16 does")
    p.add_argument("--quantize", choices=("int8",),
                   help="the reference with --quantization int8's arithmetic")
    p.add_argument("--positions", type=int, default=48)
    p.add_argument("--min-agree", type=float)
    p.add_argument("--max-dlp", type=float)
    p.add_argument("--max-kl", type=float)
    p.add_argument("flags", nargs="*", help="after --: the worker's precision flags")
    a = p.parse_args()

    model = ref.load_model(a.model)
    if a.round:
        model = rounded(model, a.round)
    if a.quantize:
        model = int8_model(model)
    adapter = ref.load_adapter(a.lora, model.config) if a.lora else None
    if adapter and a.round_lora:
        adapter.pairs = {k: (round_to(pa, a.round_lora), round_to(pb, a.round_lora))
                         for k, (pa, pb) in adapter.pairs.items()}
    vocab = model.config.vocab

    prefixes, want = [], []
    for prompt in PROMPTS:
        ids = list(prompt)
        for _ in range(a.positions):
            lp = ref.log_softmax(ref.forward(model, ids, adapter)[-1])
            prefixes.append(list(ids))
            want.append(lp)
            ids.append(int(np.argmax(lp)))

    with tempfile.TemporaryDirectory() as tmp:
        batch = os.path.join(tmp, "batch.jsonl")
        with open(batch, "w") as f:
            for ids in prefixes:
                lora = "a" if a.lora else None
                f.write(json.dumps({"prompt_ids": ids, "max_tokens": 1, "lora": lora}) + "\n")
        cmd = [a.worker, "generate", "--model", a.model, "--batch", batch, "--json",
               "--ignore-eos", "--logprobs", str(vocab), *a.flags]
        if a.lora:
            cmd += ["--lora", f"a={a.lora}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"precision_check: worker failed ({out.returncode}): {out.stderr.strip()}")
    got = [json.loads(line) for line in out.stdout.splitlines()]
    if len(got) != len(want):
        sys.exit(f"precision_check: {len(got)} results for {len(want)} requests")

    agree, dlp, kl = 0, [], []
    for ref_lp, res in zip(want, got):
        lp = np.full(vocab, -np.inf)
        for token, value in res["top_logprobs"][0]:
            lp[token] = value
        greedy = int(np.argmax(ref_lp))
        agree += int(res["tokens"][0] == greedy)
        dlp.append(abs(lp[greedy] - ref_lp[greedy]))
        pr = np.exp(ref_lp)
        kl.append(float(np.sum(pr * (ref_lp - lp))))
    n = len(want)
    frac = agree / n
    print(f"precision_check: {' '.join(a.flags) or 'defaults'}: {n} positions, greedy agree "
          f"{agree}/{n} = {100 * frac:.2f}%, max |dlogprob| {max(dlp):.3g}, "
          f"mean KL {np.mean(kl):.3g}, max KL {max(kl):.3g}")
    bad = []
    if a.min_agree is not None and frac < a.min_agree:
        bad.append(f"agreement {frac:.4f} < {a.min_agree}")
    if a.max_dlp is not None and max(dlp) > a.max_dlp:
        bad.append(f"max |dlogprob| {max(dlp):.3g} > {a.max_dlp}")
    if a.max_kl is not None and np.mean(kl) > a.max_kl:
        bad.append(f"mean KL {np.mean(kl):.3g} > {a.max_kl}")
    if bad:
        print("precision_check: FAILED: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
