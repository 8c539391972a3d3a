#!/usr/bin/python3
"""Independent float64 reference for lora-stack: a Hugging Face Llama-family model with PEFT LoRA.

The tests check the C runtime against this file, so it is written for clarity, not speed: it
parses safetensors itself, converts every weight to float64 and recomputes the whole sequence
for every generated token (no KV cache). Only the standard library and numpy are used.

Commands (each prints to stdout; errors go to stderr with exit status 1):
  generate --model DIR [--lora NAME=DIR]... (--batch FILE | --prompt-ids 1,2,3 --max-tokens K
           [--lora-name NAME]) [--logprobs N]
      One JSON line per request: {"prompt_logprobs": [null, ...], "tokens": [...],
      "top_logprobs": [[[id, logprob], ...], ...]}. Greedy decoding, no EOS stop.
  merge --model DIR --lora DIR --out DIR [--dtype f32|f64]
      Writes the model with W + scale * B @ A folded into every adapted projection.
  compare A.jsonl B.jsonl [--tol 1e-4]
      Exit 0 when the two generate outputs agree within tol, 1 otherwise.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys
from dataclasses import dataclass

import numpy as np


class RefError(Exception):
    """A malformed input: the message says which file or request and what is wrong."""


# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length N, N bytes of JSON, then the data section.
# ---------------------------------------------------------------------------------------------

# On-disk element types this reference reads and writes. BF16 is read as raw uint16 and widened
# by hand below; F64 only serves the exact (float64) merge of the self-check.
STORAGE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
           "F64": np.dtype("<f8")}


def read_header(path):
    """Returns (entries, data_start): the header without "__metadata__", and the byte offset
    where the data section starts. Checks that every entry's bytes lie inside the file."""
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise RefError(f"{path}: shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", raw_len)
        data_start = 8 + header_len
        file_size = os.fstat(f.fileno()).st_size
        if data_start > file_size:
            raise RefError(f"{path}: header length {header_len} runs past the end of the file")
        header = json.loads(f.read(header_len).decode("utf-8"))
    header.pop("__metadata__", None)
    for name, entry in header.items():
        check_entry(path, name, entry, file_size - data_start)
    return header, data_start


def check_entry(path, name, entry, data_size):
    """Raises unless entry is a known dtype whose offsets span exactly its shape's bytes."""
    dtype = entry.get("dtype")
    if dtype not in STORAGE:
        raise RefError(f"{path}: tensor {name}: unsupported dtype {dtype}")
    begin, end = entry["data_offsets"]
    numel = math.prod(entry["shape"])
    if not 0 <= begin <= end <= data_size or end - begin != numel * STORAGE[dtype].itemsize:
        raise RefError(f"{path}: tensor {name}: bad data_offsets {entry['data_offsets']}")


def widen(raw, dtype):
    """Converts stored values to float64. BF16 is the top half of a float32: shift it up."""
    if dtype == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float64)


def read_safetensors(path):
    """Returns {name: float64 array} for every tensor of the file, in header order."""
    header, data_start = read_header(path)
    tensors = {}
    for name, entry in header.items():
        storage = STORAGE[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = (end - begin) // storage.itemsize
        raw = np.fromfile(path, dtype=storage, count=count, offset=data_start + begin)
        tensors[name] = widen(raw, entry["dtype"]).reshape(entry["shape"])
    return tensors


def narrow(values, dtype):
    """Returns the bytes of values stored as dtype; BF16 rounds float32 to nearest even."""
    if dtype != "BF16":
        return np.ascontiguousarray(values, dtype=STORAGE[dtype]).tobytes()
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path, tensors, dtype):
    """Writes {name: array} to path as dtype, in the given order, with the data contiguous and
    the JSON header padded with spaces to a multiple of 8 bytes."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, values in tensors.items():
        blob = narrow(values, dtype)
        header[name] = {"dtype": dtype, "shape": list(np.shape(values)),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---------------------------------------------------------------------------------------------
# Model configuration, weights and adapters.
# ---------------------------------------------------------------------------------------------

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

# The seven projections of a layer, in data-flow order, and the module that holds each.
PROJ_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
               "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


@dataclass
class Config:
    """The hyper-parameters of config.json that the forward pass uses."""
    arch: str
    hidden: int
    inter: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    theta: float
    vocab: int
    tied: bool
    window: int  # longest sequence this reference computes exactly; 0 = unlimited

    @classmethod
    def from_json(cls, cfg):
        """Builds a Config from the parsed config.json, applying Hugging Face's defaults."""
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise RefError(f"config.json: unsupported architecture {arch}")
        if cfg.get("rope_scaling"):
            raise RefError("config.json: rope_scaling is not supported by the reference")
        heads = cfg["num_attention_heads"]
        config = cls(arch=arch, hidden=cfg["hidden_size"], inter=cfg["intermediate_size"],
                     n_layers=cfg["num_hidden_layers"], n_heads=heads,
                     n_kv_heads=cfg.get("num_key_value_heads") or heads,
                     head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                     eps=cfg["rms_norm_eps"], theta=cfg.get("rope_theta", 10000.0),
                     vocab=cfg["vocab_size"], tied=cfg.get("tie_word_embeddings", False),
                     window=sliding_window(arch, cfg))
        if config.n_heads % config.n_kv_heads or config.head_dim % 2:
            raise RefError("config.json: heads must divide by KV heads and head_dim be even")
        return config

    def proj_shape(self, proj):
        """[out, in] of a projection's weight, as Hugging Face stores it."""
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"q_proj": (q_width, self.hidden), "k_proj": (kv_width, self.hidden),
                "v_proj": (kv_width, self.hidden), "o_proj": (self.hidden, q_width),
                "gate_proj": (self.inter, self.hidden), "up_proj": (self.inter, self.hidden),
                "down_proj": (self.hidden, self.inter)}[proj]


def sliding_window(arch, cfg):
    """Mistral (and Qwen2 with use_sliding_window) limit attention to a window; within it the
    plain causal attention computed here is exact, so the window bounds the sequence length."""
    if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
        return 0
    return cfg.get("sliding_window") or 0


def weight_name(layer, proj, kind="weight"):
    """The Hugging Face name of a projection's weight (or "bias") in one layer."""
    return f"model.layers.{layer}.{PROJ_PARENT[proj]}.{proj}.{kind}"


def expected_shapes(config):
    """{name: shape} of every tensor the model must have, in checkpoint order."""
    h = config.hidden
    shapes = {"model.embed_tokens.weight": (config.vocab, h)}
    for i in range(config.n_layers):
        shapes[f"model.layers.{i}.input_layernorm.weight"] = (h,)
        for proj in PROJ_PARENT:
            if proj == "gate_proj":
                shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = (h,)
            shapes[weight_name(i, proj)] = config.proj_shape(proj)
            if config.arch == "Qwen2ForCausalLM" and proj in ("q_proj", "k_proj", "v_proj"):
                shapes[weight_name(i, proj, "bias")] = config.proj_shape(proj)[:1]
    shapes["model.norm.weight"] = (h,)
    if not config.tied:
        shapes["lm_head.weight"] = (config.vocab, h)
    return shapes


@dataclass
class Model:
    config: Config
    weights: dict  # name -> float64 array, every tensor of the checkpoint
    # Weights whose matmuls first pass their input rows through quantize_rows (precision_check's
    # model of int8 arithmetic); empty for the plain reference.
    quantized_inputs: frozenset = frozenset()
    quantize_rows: object = None

    def lm_head_name(self):
        return "model.embed_tokens.weight" if self.config.tied else "lm_head.weight"

    def times(self, x, name):
        """x @ weights[name].T, the rows of x quantized first where the model says so."""
        if name in self.quantized_inputs:
            x = self.quantize_rows(x)
        return x @ self.weights[name].T


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def weight_files(model_dir):
    """The safetensors files of a model: model.safetensors, else the shards of the index."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return [single]
    index = read_json(os.path.join(model_dir, "model.safetensors.index.json"))
    return [os.path.join(model_dir, f) for f in sorted(set(index["weight_map"].values()))]


def load_model(model_dir):
    """Reads config.json and the weights, checking every expected tensor's shape."""
    config = Config.from_json(read_json(os.path.join(model_dir, "config.json")))
    weights = {}
    for path in weight_files(model_dir):
        weights.update(read_safetensors(path))
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise RefError(f"{model_dir}: missing tensor {name}")
        if weights[name].shape != shape:
            raise RefError(f"{model_dir}: tensor {name} has shape {list(weights[name].shape)}, "
                           f"expected {list(shape)}")
    return Model(config, weights)


@dataclass
class Adapter:
    scale: float
    pairs: dict  # (layer, proj) -> (A [r, in], B [out, r]) in float64


# base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight and its lora_B partner.
ADAPTER_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\."
                         r"(\w+_proj)\.lora_([AB])\.weight")


def load_adapter(adapter_dir, config):
    """Reads a PEFT LoRA adapter. The tensors in the file decide which projections are adapted
    (as when PEFT loads it); every one must be a complete A/B pair of the right shapes."""
    meta = read_json(os.path.join(adapter_dir, "adapter_config.json"))
    rank, alpha = meta["r"], meta["lora_alpha"]
    scale = alpha / math.sqrt(rank) if meta.get("use_rslora", False) else alpha / rank
    halves = {}
    path = os.path.join(adapter_dir, "adapter_model.safetensors")
    for name, values in read_safetensors(path).items():
        match = ADAPTER_KEY.fullmatch(name)
        if not match or PROJ_PARENT.get(match[3]) != match[2] or int(match[1]) >= config.n_layers:
            raise RefError(f"{path}: unexpected tensor {name}")
        halves[(int(match[1]), match[3], match[4])] = values
    pairs = {}
    for layer, proj, half in halves:
        if half == "A":
            pairs[(layer, proj)] = adapter_pair(path, halves, layer, proj, rank, config)
    if len(halves) != 2 * len(pairs):
        raise RefError(f"{path}: a lora_B tensor has no lora_A partner")
    return Adapter(scale, pairs)


def adapter_pair(path, halves, layer, proj, rank, config):
    """Returns (A, B) of one projection after checking both shapes against the model."""
    out_dim, in_dim = config.proj_shape(proj)
    a, b = halves[(layer, proj, "A")], halves.get((layer, proj, "B"))
    if b is None or a.shape != (rank, in_dim) or b.shape != (out_dim, rank):
        raise RefError(f"{path}: layer {layer} {proj}: lora_A/lora_B missing or misshapen "
                       f"(want A [{rank}, {in_dim}], B [{out_dim}, {rank}])")
    return a, b


# ---------------------------------------------------------------------------------------------
# The forward pass, in float64, following Hugging Face's LlamaModel.
# ---------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    # x * sigmoid(x), with the sigmoid written through tanh so that it never overflows.
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def rope_tables(n, head_dim, theta):
    """cos and sin [n, head_dim] for positions 0..n-1; each frequency appears twice, as
    concatenate([angles, angles]), matching rotate_half's pairing of i with i + head_dim/2."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(n)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, cos, sin):
    """Rotates x [n, heads, head_dim] by the angles of its positions."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention(q, k, v):
    """Causal grouped-query attention. q [n, heads, d]; k, v [n, kv_heads, d]; query head h reads
    KV head h // (heads / kv_heads). Returns [n, heads, d]."""
    n, heads, d = q.shape
    group = heads // k.shape[1]
    k = np.repeat(k, group, axis=1).transpose(1, 2, 0)  # [heads, d, n]
    v = np.repeat(v, group, axis=1).transpose(1, 0, 2)  # [heads, n, d]
    scores = q.transpose(1, 0, 2) @ k / math.sqrt(d)  # [heads, n, n]
    scores[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    return (softmax(scores) @ v).transpose(1, 0, 2)


def project(model, adapter, layer, proj, x):
    """x @ W.T (+ bias when the checkpoint has one) + scale * (x @ A.T) @ B.T when adapted."""
    y = model.times(x, weight_name(layer, proj))
    bias = model.weights.get(weight_name(layer, proj, "bias"))
    if bias is not None:
        y = y + bias
    if adapter is not None and (layer, proj) in adapter.pairs:
        a, b = adapter.pairs[(layer, proj)]
        y = y + adapter.scale * ((x @ a.T) @ b.T)
    return y


def attention_block(model, adapter, layer, x, cos, sin):
    """The self-attention of one layer on its normed input x [n, hidden]."""
    c = model.config
    n = x.shape[0]
    q = project(model, adapter, layer, "q_proj", x).reshape(n, c.n_heads, c.head_dim)
    k = project(model, adapter, layer, "k_proj", x).reshape(n, c.n_kv_heads, c.head_dim)
    v = project(model, adapter, layer, "v_proj", x).reshape(n, c.n_kv_heads, c.head_dim)
    out = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    return project(model, adapter, layer, "o_proj", out.reshape(n, c.n_heads * c.head_dim))


def mlp_block(model, adapter, layer, x):
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    gate = project(model, adapter, layer, "gate_proj", x)
    up = project(model, adapter, layer, "up_proj", x)
    return project(model, adapter, layer, "down_proj", silu(gate) * up)


def forward(model, ids, adapter=None):
    """Logits [len(ids), vocab] of the whole sequence, positions 0..n-1."""
    c, w = model.config, model.weights
    if c.window and len(ids) > c.window:
        raise RefError(f"sequence of {len(ids)} tokens exceeds the sliding window {c.window}")
    cos, sin = rope_tables(len(ids), c.head_dim, c.theta)
    h = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(c.n_layers):
        x = rms_norm(h, w[f"model.layers.{i}.input_layernorm.weight"], c.eps)
        h = h + attention_block(model, adapter, i, x, cos, sin)
        x = rms_norm(h, w[f"model.layers.{i}.post_attention_layernorm.weight"], c.eps)
        h = h + mlp_block(model, adapter, i, x)
    return model.times(rms_norm(h, w["model.norm.weight"], c.eps), model.lm_head_name())


# ---------------------------------------------------------------------------------------------
# Greedy generation.
# ---------------------------------------------------------------------------------------------

def top_logprobs(logprobs, n):
    """The n most likely [id, logprob] pairs, by descending logprob, ties to the lower id."""
    order = np.lexsort((np.arange(len(logprobs)), -logprobs))[:n]
    return [[int(i), float(logprobs[i])] for i in order]


def generate(model, prompt_ids, max_tokens, adapter=None, n_top=0):
    """Greedy decoding for max_tokens steps (no EOS stop), recomputing the whole sequence at
    every step. Returns the JSON-ready result of one request."""
    if not prompt_ids or not all(0 <= t < model.config.vocab for t in prompt_ids):
        raise RefError(f"prompt_ids must be a non-empty list of ids below {model.config.vocab}")
    ids = list(prompt_ids)
    prompt = log_softmax(forward(model, ids, adapter))
    result = {"prompt_logprobs": [None] + [float(prompt[i - 1, ids[i]])
                                           for i in range(1, len(ids))],
              "tokens": [], "top_logprobs": []}
    last = prompt[-1]
    for step in range(max_tokens):
        if step > 0:
            last = log_softmax(forward(model, ids, adapter)[-1])
        token = int(np.argmax(last))  # the first maximum: ties go to the lowest id
        result["tokens"].append(token)
        result["top_logprobs"].append(top_logprobs(last, n_top))
        ids.append(token)
    return result


# ---------------------------------------------------------------------------------------------
# Offline merge: W + scale * B @ A.
# ---------------------------------------------------------------------------------------------

# Files of a model directory that hold weights: merge writes its own, so it does not copy them.
WEIGHT_SUFFIXES = (".safetensors", ".index.json", ".bin", ".pt", ".pth", ".gguf")


def merged_weights(model, adapter):
    """Every tensor of the model, with the adapter folded into the projections it targets."""
    weights = dict(model.weights)
    for (layer, proj), (a, b) in adapter.pairs.items():
        name = weight_name(layer, proj)
        weights[name] = weights[name] + adapter.scale * (b @ a)
    return weights


def merge_dir(model_dir, adapter_dir, out_dir, dtype="F32"):
    """Writes out_dir: the model's non-weight files copied as they are, and a single
    model.safetensors holding the merged weights as dtype."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise RefError(f"{out_dir}: output directory is not empty")
    model = load_model(model_dir)
    adapter = load_adapter(adapter_dir, model.config)
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(model_dir)):
        src = os.path.join(model_dir, name)
        if os.path.isfile(src) and not name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(src, os.path.join(out_dir, name))
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      merged_weights(model, adapter), dtype)


# ---------------------------------------------------------------------------------------------
# Comparing two generate outputs.
# ---------------------------------------------------------------------------------------------

class Comparison:
    """Collects the largest logprob difference seen and every mismatch found."""

    def __init__(self, tol):
        self.tol = tol
        self.max_diff = 0.0
        self.failures = []

    def fail(self, where, what):
        self.failures.append(f"{where}: {what}")

    def close(self, a, b, where):
        """Checks two logprobs (either may be None, which only matches None)."""
        if a is None or b is None:
            if a is not b:
                self.fail(where, f"{a} vs {b}")
            return
        diff = abs(a - b)
        self.max_diff = max(self.max_diff, diff)
        if not diff <= self.tol:
            self.fail(where, f"{a!r} vs {b!r} differ by {diff:.3g} > tol {self.tol:g}")


def compare_top(cmp, where, top_a, top_b):
    """Compares the top-N lists of one step by id, so that near-tied entries may come in either
    order. Sorted lists whose entries match by id within tol also match position by position."""
    if len(top_a) != len(top_b):
        cmp.fail(where, f"{len(top_a)} entries vs {len(top_b)}")
        return
    lp_b = {int(token): lp for token, lp in top_b}
    ids_a = {int(token) for token, _ in top_a}
    for pos, (token, lp) in enumerate(top_a):
        if int(token) in lp_b:
            cmp.close(lp, lp_b[int(token)], f"{where}[{pos}] id {token}")
        else:
            check_cut(cmp, f"{where}[{pos}]", token, lp, top_b, "A")
    for pos, (token, lp) in enumerate(top_b):
        if int(token) not in ids_a:
            check_cut(cmp, f"{where}[{pos}]", token, lp, top_a, "B")


def check_cut(cmp, where, token, lp, other, side):
    """An id listed on one side only is accepted when it ties (within tol) with the last entry
    of the other list: the cut after N entries fell between near-equal logprobs."""
    if abs(lp - other[-1][1]) > cmp.tol:
        cmp.fail(where, f"id {token} ({lp!r}) is only in {side}")


def compare_field(cmp, where, field, a, b, steps=None):
    """Compares prompt_logprobs or top_logprobs (only the first steps entries, when given);
    a field that is missing or null in both is skipped."""
    xa, xb = a.get(field), b.get(field)
    if (xa is None) != (xb is None):
        cmp.fail(f"{where}: {field}", f"present in {'A' if xb is None else 'B'} only")
    elif xa is not None and len(xa) != len(xb):
        cmp.fail(f"{where}: {field}", f"length {len(xa)} vs {len(xb)}")
    elif xa is not None:
        for pos, (x, y) in enumerate(zip(xa[:steps], xb[:steps])):
            if field == "prompt_logprobs":
                cmp.close(x, y, f"{where}: {field}[{pos}]")
            else:
                compare_top(cmp, f"{where}: {field}[{pos}]", x, y)


def compare_request(cmp, index, a, b):
    """Compares one request's outputs: tokens exactly, logprobs within tol. Once the tokens
    diverge the contexts differ, so top_logprobs are compared up to the first divergent step."""
    where = f"request {index}"
    ta, tb = a.get("tokens"), b.get("tokens")
    if ta is None or tb is None:
        cmp.fail(where, "no tokens field")
        return
    steps = len(ta)
    if ta != tb:
        steps = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        cmp.fail(f"{where}: tokens[{steps}]",
                 f"A has {ta[steps:steps + 1]}, B has {tb[steps:steps + 1]}")
    compare_field(cmp, where, "prompt_logprobs", a, b)
    compare_field(cmp, where, "top_logprobs", a, b, steps + 1)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def compare_files(path_a, path_b, tol):
    """Returns the Comparison of two generate outputs, request by request."""
    cmp = Comparison(tol)
    a, b = read_jsonl(path_a), read_jsonl(path_b)
    if len(a) != len(b):
        cmp.fail("file", f"A has {len(a)} requests, B has {len(b)}")
    for index, (x, y) in enumerate(zip(a, b)):
        compare_request(cmp, index, x, y)
    return cmp, len(a)


# ---------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------

def read_requests(args):
    """The requests of --batch FILE, or the single one of --prompt-ids/--max-tokens."""
    if args.batch:
        requests = read_jsonl(args.batch)
    elif args.prompt_ids is not None and args.max_tokens is not None:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        requests = [{"prompt_ids": ids, "max_tokens": args.max_tokens, "lora": args.lora_name}]
    else:
        raise RefError("give --batch FILE, or --prompt-ids and --max-tokens")
    for index, req in enumerate(requests):
        if not isinstance(req.get("prompt_ids"), list) or not isinstance(req.get("max_tokens"),
                                                                          int):
            raise RefError(f"request {index}: needs prompt_ids (list) and max_tokens (int)")
    return requests


def cmd_generate(args):
    model = load_model(args.model)
    adapters = {}
    for spec in args.lora:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise RefError(f"--lora {spec}: expected NAME=DIR")
        adapters[name] = load_adapter(path, model.config)
    for index, req in enumerate(read_requests(args)):
        name = req.get("lora")
        if name is not None and name not in adapters:
            raise RefError(f"request {index}: unknown lora {name!r}")
        result = generate(model, req["prompt_ids"], req["max_tokens"],
                          adapters.get(name), args.logprobs)
        print(json.dumps(result), flush=True)
    return 0


def cmd_merge(args):
    merge_dir(args.model, args.lora, args.out, args.dtype.upper())
    return 0


def cmd_compare(args):
    cmp, n_requests = compare_files(args.a, args.b, args.tol)
    for line in cmp.failures[:20]:
        print(f"MISMATCH {line}")
    if len(cmp.failures) > 20:
        print(f"... and {len(cmp.failures) - 20} more mismatches")
    verdict = "OK" if not cmp.failures else f"FAILED ({len(cmp.failures)} mismatches)"
    print(f"compare: {n_requests} requests, max |logprob diff| {cmp.max_diff:.3g}, "
          f"tol {args.tol:g}: {verdict}")
    return 0 if not cmp.failures else 1


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy generation with logprobs, one JSON line each")
    g.add_argument("--model", required=True)
    g.add_argument("--lora", action="append", default=[], metavar="NAME=DIR")
    g.add_argument("--batch", help="JSONL of {prompt_ids, max_tokens, lora}")
    g.add_argument("--prompt-ids", help="single request: comma-separated ids")
    g.add_argument("--max-tokens", type=int, help="single request: tokens to generate")
    g.add_argument("--lora-name", help="single request: the --lora NAME to apply")
    g.add_argument("--logprobs", type=int, default=0, help="top-N logprobs per step")
    g.set_defaults(run=cmd_generate)
    m = sub.add_parser("merge", help="write the model with an adapter merged in")
    m.add_argument("--model", required=True)
    m.add_argument("--lora", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--dtype", choices=("f32", "f64"), default="f32")
    m.set_defaults(run=cmd_merge)
    c = sub.add_parser("compare", help="compare two generate outputs")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--tol", type=float, default=1e-4)
    c.set_defaults(run=cmd_compare)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (RefError, OSError, ValueError, KeyError) as e:
        print(f"hf_reference: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
