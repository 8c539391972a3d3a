#!/usr/bin/env python3
"""A plain PyTorch forward pass of a Llama / Qwen2 model directory (config.json + safetensors,
as `lora-worker make-model` writes it), eager, on the CPU, with a KV cache: greedy decoding of
given token ids, decode tokens/s at a batch size, and prefill tokens/s.

    torch_decode.py --model DIR --prompt-ids 1,2,3 --tokens 32 [--batch 1,32] [--threads 2]
                    [--dtype bfloat16|float32] [--prefill 256]

Prints one JSON object: {tokens, decode_tok_s, prefill_tok_s, runs: [one per batch size]}
(tokens and decode_tok_s of the first batch size at the top level). Several prompts
(--prompt-ids 1,2;3,4) add prompt_tokens, each prompt's greedy tokens at batch 1; the first
prompt is the timed one. The layers follow
transformers' eager Llama/Qwen2 code, so bfloat16 here is what "the model in PyTorch, bf16"
means: RMSNorm in float32 and cast back, rotary tables in float32 cast to the model's dtype,
softmax in float32, everything else in the model's dtype. float32 is for checking the greedy
tokens against lora-worker's. The weights are read by hf_model.py (numpy, no safetensors
package). Batch B decodes B copies of the prompt; all sequences have the same length, so no
padding or mask beyond the causal one. Prefill evaluates N tokens (ids (7 i + 11) mod 256) in one
sequence.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


class Model:
    def __init__(self, directory, dtype):
        cfg = hf_model.Config(directory)
        st = hf_model.Tensors(directory)
        self.cfg, self.dtype = cfg, dtype

        def w(name):
            if dtype == torch.bfloat16 and st.dtype(name) == "BF16":  # as stored, no float32 copy
                return torch.from_numpy(np.array(st.raw(name)[1]).view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(np.ascontiguousarray(st.f32(name))).to(dtype)

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if cfg.tied else w("lm_head.weight")
        self.layers = []
        for l in range(cfg.layers):
            p = f"model.layers.{l}."
            L = {"in_norm": w(p + "input_layernorm.weight"),
                 "post_norm": w(p + "post_attention_layernorm.weight")}
            for proj in hf_model.PROJS:
                L[proj] = w(p + f"{hf_model.proj_parent(proj)}.{proj}.weight")
                bias = p + f"{hf_model.proj_parent(proj)}.{proj}.bias"
                L[proj + ".bias"] = w(bias) if bias in st else None
            self.layers.append(L)
        d = cfg.head_dim
        inv = 1.0 / (cfg.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.inv_freq = inv

    def rms(self, x, weight):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        return weight * h.to(x.dtype)

    def rope(self, positions):
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def new_cache(self, batch, length):
        c = self.cfg
        shape = (batch, c.kv_heads, length, c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                for _ in range(c.layers)]

    @torch.no_grad()
    def forward(self, ids, start, cache, last_only=True):
        """ids (B, T) at positions start..start+T-1; fills the cache; returns logits (B, V) of
        the last position (float32)."""
        c = self.cfg
        B, T = ids.shape
        nh, nkv, d = c.heads, c.kv_heads, c.head_dim
        x = self.embed[ids]
        cos, sin = self.rope(torch.arange(start, start + T))
        end = start + T
        mask = None
        if T > 1:
            mask = torch.full((T, end), float("-inf"), dtype=self.dtype)
            mask = torch.triu(mask, diagonal=start + 1)
        for L, (kc, vc) in zip(self.layers, cache):
            h = self.rms(x, L["in_norm"])
            q = torch.nn.functional.linear(h, L["q_proj"], L["q_proj.bias"])
            k = torch.nn.functional.linear(h, L["k_proj"], L["k_proj.bias"])
            v = torch.nn.functional.linear(h, L["v_proj"], L["v_proj.bias"])
            q = q.view(B, T, nh, d).transpose(1, 2)
            k = k.view(B, T, nkv, d).transpose(1, 2)
            v = v.view(B, T, nkv, d).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            kc[:, :, start:end] = k
            vc[:, :, start:end] = v
            keys = kc[:, :, :end].repeat_interleave(nh // nkv, dim=1)
            vals = vc[:, :, :end].repeat_interleave(nh // nkv, dim=1)
            att = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(d)
            if mask is not None:
                att = att + mask
            att = torch.softmax(att, dim=-1, dtype=torch.float32).to(self.dtype)
            o = torch.matmul(att, vals).transpose(1, 2).reshape(B, T, nh * d)
            x = x + torch.nn.functional.linear(o, L["o_proj"], L["o_proj.bias"])
            h = self.rms(x, L["post_norm"])
            g = torch.nn.functional.linear(h, L["gate_proj"])
            u = torch.nn.functional.linear(h, L["up_proj"])
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(g) * u, L["down_proj"])
        x = self.rms(x[:, -1:] if last_only else x, self.norm)
        return torch.nn.functional.linear(x, self.lm_head)[:, -1].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--batch", default="1", help="batch size, or several: 1,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--prefill", type=int, default=0, help="also time a prefill of N tokens")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts = [[int(s) for s in p.split(",")] for p in a.prompt_ids.split(";")]
    prompt = prompts[0]
    t = time.perf_counter()
    m = Model(a.model, DTYPES[a.dtype])
    load_s = time.perf_counter() - t

    def generate(batch, n, prompt=prompt):
        cache = m.new_cache(batch, len(prompt) + n)
        ids = torch.tensor([prompt] * batch)
        t0 = time.perf_counter()
        nxt = m.forward(ids, 0, cache).argmax(-1)
        t1 = time.perf_counter()
        out = [nxt]
        pos = len(prompt)
        for _ in range(n - 1):
            nxt = m.forward(nxt[:, None], pos, cache).argmax(-1)
            out.append(nxt)
            pos += 1
        t2 = time.perf_counter()
        return torch.stack(out, 1).tolist(), t1 - t0, t2 - t1

    runs = []
    for batch in [int(b) for b in a.batch.split(",")]:
        generate(batch, 2)  # warm-up: first calls allocate and pick kernels
        seqs, prompt_s, decode_s = generate(batch, a.tokens)
        runs.append({"batch": batch, "tokens": seqs[0], "sequences": seqs if batch > 1 else None,
                     "decode_tok_s": batch * (a.tokens - 1) / decode_s if a.tokens > 1 else None,
                     "decode_s": decode_s, "decoded": batch * (a.tokens - 1),
                     "prompt_s": prompt_s})
    res = {"engine": "pytorch", "version": torch.__version__, "dtype": a.dtype,
           "threads": a.threads, "load_s": load_s, **runs[0], "runs": runs}
    if len(prompts) > 1:  # the other prompts at batch 1, untimed (agreement checks)
        res["prompt_tokens"] = [generate(1, a.tokens, p)[0][0] for p in prompts]
    if a.prefill:
        ids = torch.tensor([[(7 * i + 11) % 256 for i in range(a.prefill)]])
        m.forward(ids[:, :8], 0, m.new_cache(1, 8))
        cache = m.new_cache(1, a.prefill)
        t = time.perf_counter()
        m.forward(ids, 0, cache)
        res["prefill_tokens"] = a.prefill
        res["prefill_tok_s"] = a.prefill / (time.perf_counter() - t)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
