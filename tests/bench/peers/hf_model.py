"""Reads a Hugging Face model directory as lora-worker make-model writes it (and as the runtime
loads it): config.json plus model.safetensors, or shards listed by model.safetensors.index.json;
and PEFT adapter directories (adapter_config.json plus adapter_model.safetensors).

numpy only: the safetensors package is not a Debian package. Tensors are memory-mapped and
converted to float32 one at a time, so a converter holds one tensor in memory, not the model.
"""
import json
import os
import struct

import numpy as np

ARCHS = ("llama", "mistral", "qwen2")

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


class SafetensorsFile:
    """One .safetensors file: header parsed, data memory-mapped on demand."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                raise ValueError(f"{path}: header of {n} bytes")
            header = json.loads(f.read(n))
        self.data_start = 8 + n
        header.pop("__metadata__", None)
        self.tensors = header
        self._map = None

    def _mm(self):
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def shape(self, name):
        return tuple(self.tensors[name]["shape"])

    def raw(self, name):
        """The tensor as stored (bfloat16 as uint16), without a copy."""
        t = self.tensors[name]
        dt = t["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{self.path}: {name}: dtype {dt} is not supported")
        a, b = t["data_offsets"]
        buf = self._mm()[self.data_start + a:self.data_start + b]
        return dt, buf.view(_ST_DTYPES[dt]).reshape(t["shape"])

    def f32(self, name):
        dt, x = self.raw(name)
        if dt == "BF16":
            return (x.astype(np.uint32) << 16).view(np.float32)
        return x.astype(np.float32)


class Tensors:
    """Every tensor of a model directory, across its shards."""

    def __init__(self, directory, single="model.safetensors", index="model.safetensors.index.json"):
        self.where = {}
        self.files = []
        idx = os.path.join(directory, index)
        if os.path.exists(idx):
            with open(idx) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
            paths = [os.path.join(directory, n) for n in names]
        else:
            paths = [os.path.join(directory, single)]
        for p in paths:
            sf = SafetensorsFile(p)
            self.files.append(sf)
            for name in sf.tensors:
                self.where[name] = sf

    def __contains__(self, name):
        return name in self.where

    def names(self):
        return list(self.where)

    def shape(self, name):
        return self.where[name].shape(name)

    def dtype(self, name):
        return self.where[name].tensors[name]["dtype"]

    def raw(self, name):
        return self.where[name].raw(name)

    def f32(self, name):
        return self.where[name].f32(name)


class Config:
    """The fields of config.json that the runtime reads."""

    def __init__(self, directory):
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        self.raw = c
        self.arch = c.get("model_type", "llama")
        if self.arch not in ARCHS:
            raise ValueError(f"model_type {self.arch!r} is not one of {ARCHS}")
        if c.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported")
        self.hidden = c["hidden_size"]
        self.intermediate = c["intermediate_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.vocab = c["vocab_size"]
        self.max_pos = c.get("max_position_embeddings", 4096)
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.theta = float(c.get("rope_theta", 10000.0))
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.bos = c.get("bos_token_id")
        eos = c.get("eos_token_id")
        self.eos = eos[0] if isinstance(eos, list) else eos
        self.torch_dtype = c.get("torch_dtype", "float32")


PROJS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def proj_parent(proj):
    return "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


class Adapter:
    """A PEFT LoRA adapter: per (layer, projection) the pair A (r, in), B (out, r) in float32
    and the scale alpha / r (alpha / sqrt(r) with use_rslora)."""

    def __init__(self, directory):
        with open(os.path.join(directory, "adapter_config.json")) as f:
            c = json.load(f)
        self.config = c
        self.rank = int(c["r"])
        self.alpha = float(c.get("lora_alpha", self.rank))
        self.rslora = bool(c.get("use_rslora", False))
        self.scale = self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)
        t = Tensors(directory, single="adapter_model.safetensors", index="-")
        self.pairs = {}
        for name in t.names():
            if ".lora_A." not in name:
                continue
            # base_model.model.model.layers.{l}.{parent}.{proj}.lora_A.weight
            parts = name.split(".")
            i = parts.index("layers")
            layer, proj = int(parts[i + 1]), parts[i + 3]
            if proj not in PROJS:
                raise ValueError(f"{directory}: unexpected adapter tensor {name}")
            self.pairs[(layer, proj)] = (t.f32(name), t.f32(name.replace(".lora_A.", ".lora_B.")))


def write_safetensors(path, arrays):
    """arrays: list of (name, numpy float32 array or a function returning one). Written in
    order, one array in memory at a time."""
    header, offset, shapes = {}, 0, []
    for name, a in arrays:
        shape = a.shape if hasattr(a, "shape") else a.shape_hint
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, a in arrays:
            x = a() if callable(a) else a
            f.write(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    os.replace(tmp, path)


class _Lazy:
    def __init__(self, st, name):
        self.st, self.name = st, name
        self.shape_hint = st.shape(name)

    def __call__(self):
        return self.st.f32(self.name)


def to_f32_dir(src, dst):
    """A copy of a model directory with every tensor in float32 (one model.safetensors), the
    same values: what the runtime maps in place today without converting at load."""
    import shutil
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".json") and not name.startswith("model.safetensors"):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(dst, "config.json")) as f:
        c = json.load(f)
    c["torch_dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    st = Tensors(src)
    write_safetensors(os.path.join(dst, "model.safetensors"), [(n, _Lazy(st, n)) for n in st.names()])


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 4 and sys.argv[1] == "to-f32":
        to_f32_dir(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: hf_model.py to-f32 SRC_DIR DST_DIR")
