#!/usr/bin/python3
"""Writes tiny random Hugging Face models and PEFT LoRA adapters, independently of the C code,
so that the C loaders can be tested against a second writer.

  make_fixture.py model --out DIR [--arch llama|qwen2|mistral] [--hidden 32] [--layers 2]
      [--heads 4] [--kv-heads 2] [--inter 64] [--vocab 300] [--tied] [--dtype f32|bf16|f16]
      [--shards N] [--seed S] [--head-dim D]
  make_fixture.py adapter --model DIR --out DIR [--rank 8] [--alpha 16] [--rslora]
      [--targets q_proj,v_proj,...] [--seed S] [--dtype f32|bf16|f16]

Weights come from numpy's default_rng(seed), drawn in checkpoint order in float64 and rounded
to the storage dtype, so a model depends only on its shape and seed: sharding or storing in
BF16 changes the files, not the draws.
"""

import argparse
import json
import os
import sys

import numpy as np

import hf_reference as ref

ARCH_NAMES = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM", "mistral"),
              "qwen2": ("Qwen2ForCausalLM", "qwen2")}
TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
BOS_ID, EOS_ID = 256, 257

# The LM head is drawn LOGIT_GAIN times wider than a plain projection, so that the logits have a
# standard deviation of about 4: greedy choices then win by clear margins, and a near-tie that
# float32 rounding in the C runtime could flip is rare.
LOGIT_GAIN = 4.0


def model_config(opts):
    """The config.json of a fixture model; head_dim is written only when given explicitly."""
    architecture, model_type = ARCH_NAMES[opts["arch"]]
    cfg = {"architectures": [architecture], "model_type": model_type,
           "hidden_size": opts["hidden"], "intermediate_size": opts["inter"],
           "num_hidden_layers": opts["layers"], "num_attention_heads": opts["heads"],
           "num_key_value_heads": opts["kv_heads"], "vocab_size": opts["vocab"],
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "hidden_act": "silu", "tie_word_embeddings": opts["tied"],
           "torch_dtype": TORCH_DTYPES[opts["dtype"]], "bos_token_id": BOS_ID,
           "eos_token_id": EOS_ID}
    if opts["head_dim"]:
        cfg["head_dim"] = opts["head_dim"]
    if opts["arch"] != "llama":
        cfg["sliding_window"] = None  # full causal attention, as the reference computes
    return cfg


def draw(rng, name, shape):
    """One random tensor: norm weights 1 + 0.1 N(0,1), biases 0.1 N(0,1), embeddings N(0,1),
    projections N(0,1) / sqrt(fan_in) (the LM head LOGIT_GAIN times that)."""
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if name.endswith(".bias"):
        return 0.1 * rng.standard_normal(shape)
    if name == "model.embed_tokens.weight":
        return rng.standard_normal(shape)
    gain = LOGIT_GAIN if name == "lm_head.weight" else 1.0
    return gain / np.sqrt(shape[1]) * rng.standard_normal(shape)


def check_model_opts(opts):
    """Rejects shapes that no loader should accept, before writing anything."""
    if opts["vocab"] < EOS_ID + 1:
        raise ref.RefError(f"--vocab must be at least {EOS_ID + 1} (bos {BOS_ID}, eos {EOS_ID})")
    if not opts["head_dim"] and opts["hidden"] % opts["heads"]:
        raise ref.RefError("--hidden must divide by --heads (or give --head-dim)")
    if opts["shards"] < 1:
        raise ref.RefError("--shards must be at least 1")


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def write_model(out, arch="llama", hidden=32, layers=2, heads=4, kv_heads=2, inter=64, vocab=300,
                tied=False, dtype="f32", shards=1, seed=0, head_dim=None):
    """Writes config.json, generation_config.json and the weights of a random model to out."""
    opts = dict(arch=arch, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                inter=inter, vocab=vocab, tied=tied, dtype=dtype, shards=shards, head_dim=head_dim)
    check_model_opts(opts)
    cfg = model_config(opts)
    shapes = ref.expected_shapes(ref.Config.from_json(cfg))
    if shards > len(shapes):
        raise ref.RefError(f"--shards {shards} exceeds the {len(shapes)} tensors")
    rng = np.random.default_rng(seed)
    tensors = {name: draw(rng, name, shape).astype(np.float32) for name, shape in shapes.items()}
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "config.json"), cfg)
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False})
    write_weights(out, tensors, dtype.upper(), shards)


def write_weights(out, tensors, dtype, shards):
    """model.safetensors, or model-0000i-of-0000N.safetensors and their index: the tensors in
    checkpoint order, split into shards contiguous groups of near-equal count."""
    if shards == 1:
        ref.write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
        return
    names = list(tensors)
    weight_map, total = {}, 0
    for i, group in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {names[j]: tensors[names[j]] for j in group}
        ref.write_safetensors(os.path.join(out, file), part, dtype)
        weight_map.update({name: file for name in part})
        total += sum(v.size * ref.STORAGE[dtype].itemsize for v in part.values())
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})


def write_adapter(model_dir, out, rank=8, alpha=16.0, rslora=False, targets=None, seed=0,
                  dtype="f32"):
    """Writes a random PEFT LoRA adapter for the model in model_dir (its config.json gives the
    shapes): adapter_config.json and adapter_model.safetensors."""
    config = ref.Config.from_json(ref.read_json(os.path.join(model_dir, "config.json")))
    targets = list(ref.PROJ_PARENT) if targets is None else targets
    unknown = set(targets) - set(ref.PROJ_PARENT)
    if unknown or not targets or rank < 1:
        raise ref.RefError(f"bad --targets {','.join(targets)} or --rank {rank}")
    targets = [p for p in ref.PROJ_PARENT if p in targets]  # data-flow order, no repeats
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config.n_layers):
        for proj in targets:
            out_dim, in_dim = config.proj_shape(proj)
            key = f"base_model.model.{ref.weight_name(layer, proj)[:-len('.weight')]}"
            a = rng.standard_normal((rank, in_dim)) / np.sqrt(in_dim)
            b = 0.5 / np.sqrt(rank) * rng.standard_normal((out_dim, rank))
            tensors[f"{key}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = b.astype(np.float32)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "adapter_config.json"), adapter_config(
        model_dir, rank, alpha, rslora, targets))
    ref.write_safetensors(os.path.join(out, "adapter_model.safetensors"), tensors, dtype.upper())


def adapter_config(model_dir, rank, alpha, rslora, targets):
    """PEFT's adapter_config.json; the base model is named by its directory's last component
    so that the file does not depend on where the fixture was written."""
    alpha = int(alpha) if float(alpha).is_integer() else alpha  # PEFT usually writes an int
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": targets, "use_rslora": rslora, "lora_dropout": 0.0,
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "base_model_name_or_path": os.path.basename(os.path.normpath(model_dir))}


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("model", help="write a random model directory")
    m.add_argument("--out", required=True)
    m.add_argument("--arch", choices=sorted(ARCH_NAMES), default="llama")
    for flag, default in (("hidden", 32), ("layers", 2), ("heads", 4), ("kv-heads", 2),
                          ("inter", 64), ("vocab", 300), ("shards", 1), ("seed", 0)):
        m.add_argument(f"--{flag}", type=int, default=default)
    m.add_argument("--head-dim", type=int, default=None)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="f32")
    a = sub.add_parser("adapter", help="write a random PEFT LoRA adapter for a model")
    a.add_argument("--model", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--rank", type=int, default=8)
    a.add_argument("--alpha", type=float, default=16.0)
    a.add_argument("--rslora", action="store_true")
    a.add_argument("--targets", default=",".join(ref.PROJ_PARENT),
                   help="comma-separated projections (default: all seven)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="f32")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        if args.command == "model":
            write_model(args.out, args.arch, args.hidden, args.layers, args.heads, args.kv_heads,
                        args.inter, args.vocab, args.tied, args.dtype, args.shards, args.seed,
                        args.head_dim)
        else:
            write_adapter(args.model, args.out, args.rank, args.alpha, args.rslora,
                          [t.strip() for t in args.targets.split(",") if t.strip()],
                          args.seed, args.dtype)
    except (ref.RefError, OSError, ValueError, KeyError) as e:
        print(f"make_fixture: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
