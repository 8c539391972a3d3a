#!/usr/bin/env python3
"""Converts a model directory written by `lora-worker make-model` (config.json + safetensors,
llama, mistral or qwen2, tied or not) to GGUF v3, and PEFT LoRA adapters to llama.cpp's LoRA GGUF.

    gguf_write.py model MODEL_DIR OUT.gguf [--type f32|bf16|f16|q8_0]
    gguf_write.py lora  MODEL_DIR ADAPTER_DIR OUT.gguf [--type f32|bf16|f16|q8_0]

Follows llama.cpp's gguf specification (docs/gguf.md) and its converters
(convert_hf_to_gguf.py, convert_lora_to_gguf.py, gguf-py/gguf/constants.py and quants.py):

* Tensors: token_embd, output_norm, output (absent when tied: llama.cpp then reuses token_embd),
  blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}
  and for qwen2 blk.N.attn_{q,k,v}.bias. Dimensions are written in ggml order (innermost first),
  so a Hugging Face weight (out, in) is ne = [in, out] with the same bytes.
* Llama (and Mistral, which llama.cpp runs as llama) rotates adjacent pairs (rope "norm") where
  Hugging Face rotates the two halves of each head: the rows of q_proj and k_proj (and of the
  adapters' lora_B for them) are permuted per head as convert_hf_to_gguf.py's permute() does.
  Qwen2 uses the "neox" rope in llama.cpp, the same as Hugging Face: no permutation.
* Types: the 2-D weights in the requested type; 1-D tensors (norms, biases) stay F32, as the
  converters do. Q8_0: blocks of 32 values along a row, each an f16 scale d = max|x| / 127 and
  32 int8 q = roundf(x / d) (ggml's quantize_row_q8_0_ref; roundf rounds halves away from zero).
  BF16 rounds to nearest even (ggml_compute_fp32_to_bf16). A row whose length is not a multiple
  of 32 falls back to F16 for Q8_0.
* Tokenizer: a "gpt2" (byte-level BPE) vocabulary of exactly vocab_size unique tokens: the model
  directory's tokenizer.json tokens and merges where they exist, then "<unused_N>" fillers; the
  engine and these benchmarks pass token ids, so the text side only has to load.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)

# ggml tensor types
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
QK8_0 = 32
TYPE_NAMES = {"f32": GGML_F32, "f16": GGML_F16, "bf16": GGML_BF16, "q8_0": GGML_Q8_0}
# general.file_type (llama_ftype)
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}

# token types (llama_token_type)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5

HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


# ---- quantization ------------------------------------------------------------------------

def np_roundf(x):
    """C's roundf: halves away from zero (np.round rounds halves to even)."""
    a = np.abs(x)
    f = np.floor(a)
    return np.sign(x) * (f + np.floor(2 * (a - f)))


def to_bf16(x):
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16), n)
    n = (n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16
    return n.astype(np.uint16)


def q8_0(x):
    """(rows, cols) float32, cols % 32 == 0 -> bytes of rows * cols/32 blocks of 34 bytes."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK8_0)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, 0, 1 / d)
    qs = np_roundf(blocks * inv).astype(np.int8)
    out = np.empty((blocks.shape[0], 2 + QK8_0), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = qs.view(np.uint8)
    return out


def dequant_q8_0(raw, shape):
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 2 + QK8_0)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    return (b[:, 2:].copy().view(np.int8).astype(np.float32) * d).reshape(shape)


def type_size(ggml_type, ne0, numel):
    if ggml_type == GGML_F32:
        return 4 * numel
    if ggml_type in (GGML_F16, GGML_BF16):
        return 2 * numel
    if ggml_type == GGML_Q8_0:
        return numel // QK8_0 * (2 + QK8_0)
    raise ValueError(ggml_type)


CHUNK_ELEMS = 1 << 22


def encode_chunks(x, ggml_type, transform=None):
    """Encodes x (a 1-D or (rows, cols) array, possibly memory-mapped or stored as bfloat16 by
    a loader) in slices of rows, so that a large tensor never has more than a few float32 copies
    of one slice in memory. transform(rows, start) may change a slice first."""
    if x.ndim == 1:
        x = transform(x, 0) if transform else x
        yield encode(x, ggml_type)
        return
    step = max(1, CHUNK_ELEMS // max(1, x.shape[1]))
    for r in range(0, x.shape[0], step):
        part = x[r:r + step]
        yield encode(transform(part, r) if transform else part, ggml_type)


def encode(x, ggml_type):
    if ggml_type == GGML_F32:
        return np.ascontiguousarray(x, dtype=np.float32).tobytes()
    if ggml_type == GGML_F16:
        return np.ascontiguousarray(x, dtype=np.float16).tobytes()
    if ggml_type == GGML_BF16:
        return to_bf16(x).tobytes()
    if ggml_type == GGML_Q8_0:
        return q8_0(x).tobytes()
    raise ValueError(ggml_type)


def to_f32(st_dtype, x):
    if st_dtype == "BF16":
        return (np.asarray(x).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, dtype=np.float32)


# ---- the GGUF container ------------------------------------------------------------------

def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALAR = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
           T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
           T_FLOAT64: "<d"}
_NP = {T_INT32: "<i4", T_UINT32: "<u4", T_FLOAT32: "<f4"}


def _value(vtype, v):
    if vtype == T_STRING:
        return _str(v)
    return struct.pack(_SCALAR[vtype], v)


class GGUFWriter:
    """Metadata and tensor descriptions first, then the data streamed tensor by tensor: a
    tensor is produced (read, converted, encoded) only when its turn comes."""

    def __init__(self):
        self.kv = []
        self.tensors = []  # (name, ne, ggml_type, nbytes, produce)

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def add_array(self, key, etype, values):
        self.kv.append((key, T_ARRAY, (etype, values)))

    def add_tensor(self, name, np_shape, ggml_type, produce):
        ne = list(reversed(np_shape))
        numel = int(np.prod(np_shape))
        self.tensors.append((name, ne, ggml_type, type_size(ggml_type, ne[0], numel), produce))

    def _kv_bytes(self):
        out = [struct.pack("<Q", len(self.kv))]
        for key, vtype, value in self.kv:
            out.append(_str(key) + struct.pack("<I", vtype))
            if vtype != T_ARRAY:
                out.append(_value(vtype, value))
                continue
            etype, values = value
            out.append(struct.pack("<IQ", etype, len(values)))
            if etype in _NP:
                out.append(np.asarray(values, dtype=_NP[etype]).tobytes())
            else:
                out.append(b"".join(_value(etype, v) for v in values))
        return b"".join(out)

    def write(self, path):
        head = [GGUF_MAGIC, struct.pack("<IQ", GGUF_VERSION, len(self.tensors)), self._kv_bytes()]
        offset = 0
        offsets = []
        for name, ne, gtype, nbytes, _ in self.tensors:
            offsets.append(offset)
            head.append(_str(name) + struct.pack("<I", len(ne)) +
                        struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", gtype, offset))
            offset += (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        head = b"".join(head)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(b"\0" * (-len(head) % ALIGNMENT))
            for (name, ne, gtype, nbytes, produce), off in zip(self.tensors, offsets):
                n = 0
                for chunk in produce():
                    f.write(chunk)
                    n += len(chunk)
                if n != nbytes:
                    raise AssertionError(f"{name}: {n} bytes, expected {nbytes}")
                f.write(b"\0" * (-nbytes % ALIGNMENT))
        os.replace(tmp, path)


# ---- the model -----------------------------------------------------------------------------

def gguf_arch(cfg):
    # llama.cpp runs Mistral (without a sliding window) as llama, like convert_hf_to_gguf.py.
    return "qwen2" if cfg.arch == "qwen2" else "llama"


def permute_rows(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: per head, the two rotary halves become
    interleaved pairs. Applies to (rows, ...) arrays: q/k weights, biases and lora_B."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def rope_permute(cfg, proj, w):
    if gguf_arch(cfg) != "llama":
        return w
    if proj == "q_proj":
        return permute_rows(w, cfg.heads)
    if proj == "k_proj":
        return permute_rows(w, cfg.kv_heads)
    return w


def weight_type(requested, np_shape):
    if len(np_shape) == 1:
        return GGML_F32
    if requested == GGML_Q8_0 and np_shape[-1] % QK8_0 != 0:
        return GGML_F16
    return requested


def add_model_kv(w, cfg, name, file_type):
    arch = gguf_arch(cfg)
    w.add("general.architecture", T_STRING, arch)
    w.add("general.type", T_STRING, "model")
    w.add("general.name", T_STRING, name)
    w.add("general.file_type", T_UINT32, file_type)
    w.add("general.quantization_version", T_UINT32, 2)
    w.add(f"{arch}.vocab_size", T_UINT32, cfg.vocab)
    w.add(f"{arch}.context_length", T_UINT32, cfg.max_pos)
    w.add(f"{arch}.embedding_length", T_UINT32, cfg.hidden)
    w.add(f"{arch}.block_count", T_UINT32, cfg.layers)
    w.add(f"{arch}.feed_forward_length", T_UINT32, cfg.intermediate)
    w.add(f"{arch}.attention.head_count", T_UINT32, cfg.heads)
    w.add(f"{arch}.attention.head_count_kv", T_UINT32, cfg.kv_heads)
    w.add(f"{arch}.rope.freq_base", T_FLOAT32, cfg.theta)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", T_FLOAT32, cfg.eps)
    if arch == "llama":
        w.add(f"{arch}.rope.dimension_count", T_UINT32, cfg.head_dim)
    if cfg.head_dim != cfg.hidden // cfg.heads:
        if arch != "llama":
            raise ValueError("llama.cpp's qwen2 needs head_dim == hidden / heads")
        w.add(f"{arch}.attention.key_length", T_UINT32, cfg.head_dim)
        w.add(f"{arch}.attention.value_length", T_UINT32, cfg.head_dim)


def add_tokenizer_kv(w, model_dir, cfg):
    tokens, merges, control = [], [], set()
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        vocab = dict(tj.get("model", {}).get("vocab", {}))
        for t in tj.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
            if t.get("special"):
                control.add(t["id"])
        tokens = [None] * cfg.vocab
        for text, i in vocab.items():
            if 0 <= i < cfg.vocab:
                tokens[i] = text
        for m in tj.get("model", {}).get("merges", []):
            merges.append(m if isinstance(m, str) else " ".join(m))
    else:
        tokens = [None] * cfg.vocab
    seen = set(t for t in tokens if t is not None)
    types = []
    for i in range(cfg.vocab):
        if tokens[i] is None:
            filler = f"<unused_{i}>"
            while filler in seen:
                filler += "_"
            tokens[i] = filler
            seen.add(filler)
            types.append(TOKEN_UNUSED)
        else:
            types.append(TOKEN_CONTROL if i in control else TOKEN_NORMAL)
    w.add("tokenizer.ggml.model", T_STRING, "gpt2")
    w.add("tokenizer.ggml.pre", T_STRING, "default")
    w.add_array("tokenizer.ggml.tokens", T_STRING, tokens)
    w.add_array("tokenizer.ggml.token_type", T_INT32, types)
    w.add_array("tokenizer.ggml.merges", T_STRING, merges)
    if cfg.bos is not None:
        w.add("tokenizer.ggml.bos_token_id", T_UINT32, cfg.bos)
    if cfg.eos is not None:
        w.add("tokenizer.ggml.eos_token_id", T_UINT32, cfg.eos)
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, False)


def convert_model(model_dir, out, type_name):
    cfg = hf_model.Config(model_dir)
    st = hf_model.Tensors(model_dir)
    gtype = TYPE_NAMES[type_name]
    w = GGUFWriter()
    add_model_kv(w, cfg, os.path.basename(os.path.normpath(model_dir)), FILE_TYPES[type_name])
    add_tokenizer_kv(w, model_dir, cfg)

    def tensor(gguf_name, hf_name, proj=None):
        if hf_name not in st:
            raise ValueError(f"{model_dir}: missing tensor {hf_name}")
        shape = st.shape(hf_name)
        t = weight_type(gtype, shape)

        def produce(hf_name=hf_name, proj=proj, t=t):
            if proj and gguf_arch(cfg) == "llama":  # q/k: small enough to permute whole
                return [encode(rope_permute(cfg, proj, st.f32(hf_name)), t)]
            return encode_chunks(st.raw(hf_name)[1], t, lambda part, r: to_f32(st.dtype(hf_name), part))
        w.add_tensor(gguf_name, shape, t, produce)

    tensor("token_embd.weight", "model.embed_tokens.weight")
    for l in range(cfg.layers):
        pre = f"model.layers.{l}."
        tensor(f"blk.{l}.attn_norm.weight", pre + "input_layernorm.weight")
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            g = HF_TO_GGUF["self_attn." + proj]
            tensor(f"blk.{l}.{g}.weight", pre + f"self_attn.{proj}.weight", proj)
            if pre + f"self_attn.{proj}.bias" in st:
                tensor(f"blk.{l}.{g}.bias", pre + f"self_attn.{proj}.bias", proj)
        tensor(f"blk.{l}.ffn_norm.weight", pre + "post_attention_layernorm.weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            tensor(f"blk.{l}.{HF_TO_GGUF['mlp.' + proj]}.weight", pre + f"mlp.{proj}.weight")
    tensor("output_norm.weight", "model.norm.weight")
    if not cfg.tied:
        tensor("output.weight", "lm_head.weight")
    w.write(out)
    return len(w.tensors)


def convert_lora(model_dir, adapter_dir, out, type_name):
    """llama.cpp's LoRA GGUF (convert_lora_to_gguf.py): general.type "adapter", adapter.type
    "lora", adapter.lora.alpha; per base weight W, W.lora_a as (r, in) and W.lora_b as
    (out, r) in numpy order. llama.cpp scales by alpha / r: rsLoRA's alpha / sqrt(r) is written
    as the alpha that gives the same scale."""
    cfg = hf_model.Config(model_dir)
    ad = hf_model.Adapter(adapter_dir)
    gtype = TYPE_NAMES[type_name]
    w = GGUFWriter()
    arch = gguf_arch(cfg)
    w.add("general.architecture", T_STRING, arch)
    w.add("general.type", T_STRING, "adapter")
    w.add("general.name", T_STRING, os.path.basename(os.path.normpath(adapter_dir)))
    w.add("adapter.type", T_STRING, "lora")
    w.add("adapter.lora.alpha", T_FLOAT32, ad.scale * ad.rank)
    for (layer, proj) in sorted(ad.pairs, key=lambda k: (k[0], hf_model.PROJS.index(k[1]))):
        a, b = ad.pairs[(layer, proj)]
        g = HF_TO_GGUF[hf_model.proj_parent(proj) + "." + proj]
        b = rope_permute(cfg, proj, b)
        for suffix, x in (("lora_a", a), ("lora_b", b)):
            t = weight_type(gtype, x.shape)
            w.add_tensor(f"blk.{layer}.{g}.weight.{suffix}", x.shape, t,
                         lambda x=x, t=t: [encode(x, t)])
    w.write(out)
    return len(w.tensors)


# ---- a reader, for the self-check ------------------------------------------------------------

def read_gguf(path):
    """Returns (kv dict, {name: (ne, type, bytes)}). Enough of the format to check our files."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        (n,) = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == T_STRING:
            return string()
        if t == T_ARRAY:
            et, n = take("<IQ")
            return [value(et) for _ in range(n)]
        return take(_SCALAR[t])[0]

    assert buf[:4] == GGUF_MAGIC
    pos = 4
    version, n_t, n_kv = take("<IQQ")
    assert version == GGUF_VERSION
    kv = {}
    for _ in range(n_kv):
        k = string()
        (t,) = take("<I")
        kv[k] = value(t)
    infos = []
    for _ in range(n_t):
        name = string()
        (nd,) = take("<I")
        ne = take(f"<{nd}Q")
        t, off = take("<IQ")
        infos.append((name, ne, t, off))
    align = kv.get("general.alignment", ALIGNMENT)
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, off in infos:
        n = type_size(t, ne[0], int(np.prod(ne)))
        tensors[name] = (ne, t, buf[start + off:start + off + n])
    return kv, tensors


def decode(ne, t, raw):
    shape = tuple(reversed(ne))
    if t == GGML_F32:
        return np.frombuffer(raw, dtype="<f4").reshape(shape)
    if t == GGML_F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if t == GGML_BF16:
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if t == GGML_Q8_0:
        return dequant_q8_0(raw, shape)
    raise ValueError(t)


def self_check():
    """Round trips and known values; no model needed."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, :32] = 0
    back = dequant_q8_0(q8_0(x).tobytes(), x.shape)
    err = np.abs(back - x).max(axis=1)
    assert back[0, :32].max() == 0 and (err < np.abs(x).max() / 127).all(), err
    # roundf: halves away from zero; d = 1 exactly when max|x| = 127
    y = np.array([[127, 0.5, -0.5, 1.5, -2.5] + [0] * 27], dtype=np.float32)
    q = q8_0(y)[0, 2:].view(np.int8)
    assert list(q[:5]) == [127, 1, -1, 2, -3], q[:5]
    b = to_bf16(np.array([1.0, 1.00390625, 1.01171875, -3.5, np.inf], dtype=np.float32))
    assert list(b) == [0x3F80, 0x3F80, 0x3F82, 0xC060, 0x7F80], [hex(v) for v in b]
    # the rope permutation is a permutation of rows, inverse of the HF "rotate_half" layout
    w = np.arange(8 * 3).reshape(8, 3)
    p = permute_rows(w, 2)
    assert sorted(p[:, 0]) == sorted(w[:, 0]) and list(p[:4, 0]) == [0, 6, 3, 9], p[:, 0]
    print("gguf_write: self-check ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="model directory -> GGUF")
    m.add_argument("model_dir")
    m.add_argument("out")
    m.add_argument("--type", choices=sorted(TYPE_NAMES), default="f32")
    lo = sub.add_parser("lora", help="PEFT adapter directory -> llama.cpp LoRA GGUF")
    lo.add_argument("model_dir")
    lo.add_argument("adapter_dir")
    lo.add_argument("out")
    lo.add_argument("--type", choices=sorted(TYPE_NAMES), default="f32")
    sub.add_parser("self-check", help="test the encoders")
    a = ap.parse_args()
    if a.cmd == "self-check":
        self_check()
    elif a.cmd == "model":
        n = convert_model(a.model_dir, a.out, a.type)
        print(f"gguf_write: {a.out}: {n} tensors, {a.type}", file=sys.stderr)
    else:
        n = convert_lora(a.model_dir, a.adapter_dir, a.out, a.type)
        print(f"gguf_write: {a.out}: {n} tensors, {a.type}", file=sys.stderr)


if __name__ == "__main__":
    main()
