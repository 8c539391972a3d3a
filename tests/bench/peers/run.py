#!/usr/bin/env python3
"""bench-peers: lora-stack's CPU decode next to llama.cpp (prebuilt, through node-llama-cpp) and
PyTorch eager bfloat16 (or float32: --torch-dtypes), on the same deterministic model, at the same
thread count.

    tests/bench/peers/run.py [--quick] [--shape 0.5b] [--rounds 4] [--threads 2] ...

1. Prepares, once, in the cache (build/peers/cache): the model (make_model.sh), a float32 copy
   with the same values for lora-worker (the runtime maps float32 safetensors in place instead
   of converting bfloat16 at load, which keeps the load short and steady), GGUF files in F32,
   BF16 and Q8_0 (gguf_write.py), eight rank-16 adapters over all seven projections and their
   llama.cpp LoRA GGUFs.
2. Checks agreement: greedy tokens of llama.cpp (F32 weights, F32 KV cache) and PyTorch
   (float32) against lora-worker generate's, computed exactly whatever precision is timed, on a
   small model of the benchmark's architecture (with and without adapters) and a small Llama
   (the Q/K permutation), and llama.cpp F32 against lora-worker on the benchmark model. A
   mismatch stops the benchmark.
3. Times, in interleaved rounds (each round in a rotated order), and reports medians:
   decode at batch 1; batch 8 and 32 with 8 distinct adapters; batch 32 without adapters;
   a 256-token prefill. lora-worker generate is timed from outside: a run to K+1 tokens minus
   a run to 1 token with the same requests (loading, prompt and first token cancel), so its
   figures carry the noise of two process runs; the peers time themselves in-process.
   llama.cpp cannot mix adapters in one batch (its adapters are per context): with 8 adapters
   its requests run one adapter at a time, each adapter's requests batched together, one
   adapter after another. PyTorch has no adapters here: its batch rows are the base model.

Options pass --dtype, --quantization and --matmul-precision through to lora-worker generate
(--ours-dtype, --ours-quantization, --ours-matmul-precision) for the runtime's own bfloat16 / int8
weights; with the first two, lora-worker reads the bfloat16 model directory instead of the
float32 copy. PyTorch's bfloat16 rounds activations to bfloat16 as the fast matmul does.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
PROMPT = [17, 42, 99, 123, 7, 64, 200, 31]
N_ADAPTERS = 8
ADAPTER_RANK = 16
GGUF_TYPES = ("f32", "bf16", "q8_0")
TYPE_LABEL = {"f32": "F32", "bf16": "BF16", "f16": "F16", "q8_0": "Q8_0"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, env=None, capture=True, check=True):
    r = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{(r.stderr or '')[-3000:]}")
    return r


def newer(path, *sources):
    """path exists and is newer than every source file."""
    if not os.path.exists(path):
        return False
    t = os.path.getmtime(path)
    return all(os.path.getmtime(s) <= t for s in sources)


# ---- preparation -----------------------------------------------------------------------------

class Prepared:
    pass


def make_model(shape, cache, bin_dir, allow_generate=True):
    target = os.path.join(cache, shape)
    if not allow_generate and not os.path.exists(os.path.join(target, ".complete")):
        raise SystemExit(f"bench-peers: {target} is missing: write it once with "
                         f"tests/bench/peers/make_model.sh {shape} {cache}")
    env = dict(os.environ, LORA_BIN=bin_dir)
    r = run([os.path.join(HERE, "make_model.sh"), shape, cache], env=env)
    return r.stdout.strip()


def gguf(model_dir, out, gtype):
    src = os.path.join(HERE, "gguf_write.py")
    if not newer(out, src, os.path.join(HERE, "hf_model.py"), os.path.join(model_dir, ".complete")):
        t = time.time()
        run([PYTHON, src, "model", model_dir, out, "--type", gtype])
        log(f"  {os.path.basename(out)}: {time.time() - t:.1f} s")
    return out


def f32_copy(model_dir, out):
    marker = os.path.join(out, ".complete")
    if not newer(marker, os.path.join(model_dir, ".complete")):
        t = time.time()
        shutil.rmtree(out, ignore_errors=True)
        run([PYTHON, os.path.join(HERE, "hf_model.py"), "to-f32", model_dir, out])
        open(marker, "w").close()
        log(f"  {os.path.basename(out)}: {time.time() - t:.1f} s")
    return out


def adapters(model_dir, prefix, bin_dir, n, rank, lora_type="f32"):
    """n PEFT adapters (rank, all projections, distinct seeds) and their LoRA GGUFs."""
    out = []
    for i in range(n):
        d = f"{prefix}-ad{i}"
        if not newer(os.path.join(d, ".complete"), os.path.join(model_dir, ".complete")):
            shutil.rmtree(d, ignore_errors=True)
            run([os.path.join(bin_dir, "lora-worker"), "make-adapter", "--model", model_dir,
                 "--out", d, "--rank", str(rank), "--seed", str(100 + i)])
            open(os.path.join(d, ".complete"), "w").close()
        g = f"{d}.gguf"
        if not newer(g, os.path.join(d, ".complete"), os.path.join(HERE, "gguf_write.py")):
            run([PYTHON, os.path.join(HERE, "gguf_write.py"), "lora", model_dir, d, g,
                 "--type", lora_type])
        out.append((f"a{i}", d, g))
    return out


# ---- the three engines -----------------------------------------------------------------------

class Ours:
    def __init__(self, bin_dir, threads, dtype=None, quantization=None, matmul=None):
        self.exe = os.path.join(bin_dir, "lora-worker")
        self.extra = []
        if dtype:
            self.extra += ["--dtype", dtype]
        if quantization:
            self.extra += ["--quantization", quantization]
        if matmul:
            self.extra += ["--matmul-precision", matmul]
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.tmp = tempfile.mkdtemp(prefix="bench-peers-")

    def generate(self, model, prompts, max_tokens, ads=None, assign=None, tokens=True):
        """Runs one lora-worker generate over len(prompts) requests; returns (its --stats, token
        lists). assign[i] is the adapter index of request i or None. tokens=False leaves out
        --json, whose prompt log-probabilities would put every prompt position through the LM
        head: the peers' prefill computes the last position's logits only."""
        batch = os.path.join(self.tmp, "requests.jsonl")
        with open(batch, "w") as f:
            for i, p in enumerate(prompts):
                a = assign[i] if assign else None
                f.write(json.dumps({"prompt_ids": p, "max_tokens": max_tokens,
                                    "lora": None if a is None else ads[a][0]}) + "\n")
        cmd = [self.exe, "generate", "--model", model, "--batch", batch, "--ignore-eos",
               "--stats", "--max-num-batched-tokens", str(max(512, sum(len(p) for p in prompts)))]
        if tokens:
            cmd.append("--json")
        for name, d, _ in ads or []:
            cmd += ["--lora", f"{name}={d}"]
        cmd += self.extra
        r = run(cmd, env=self.env)
        stats = json.loads(r.stderr.strip().splitlines()[-1])
        if not tokens:
            return stats, []
        return stats, [json.loads(line)["tokens"] for line in r.stdout.splitlines() if line.strip()]

    def decode_rate(self, model, batch, tokens, ads=None):
        """Tokens per second of the decode steps, from the worker's own step times (loading and
        the prompt's step left out, as llama.cpp's timings leave them out)."""
        prompts = [PROMPT] * batch
        assign = [i % len(ads) for i in range(batch)] if ads else None
        st, toks = self.generate(model, prompts, tokens + 1, ads, assign)
        if batch == 1 and not ads:
            self.b1_tokens = toks[0]
        return st["decode_tokens"] / st["decode_seconds"] if st["decode_seconds"] > 0 else float("nan")

    def prefill_rate(self, model, n):
        """Prompt tokens per second of one n-token prompt's step (the budget holds it whole)."""
        ids = [(7 * i + 11) % 256 for i in range(n)]
        st, _ = self.generate(model, [ids], 1, tokens=False)
        return n / st["prefill_seconds"] if st["prefill_seconds"] > 0 else float("nan")


def prompt_arg(prompt):
    """--prompt-ids for the peers' scripts: one prompt (a list of ids) or several (a list of
    lists, separated by ';')."""
    prompt = prompt or PROMPT
    if prompt and isinstance(prompt[0], list):
        return ";".join(",".join(map(str, p)) for p in prompt)
    return ",".join(map(str, prompt))


class LlamaCpp:
    def __init__(self, threads, modules):
        self.threads = threads
        self.modules = modules

    def run(self, model, batch, tokens, loras=None, prefill=0, kv="f16", prompt=None):
        cmd = ["node", os.path.join(HERE, "llamacpp_decode.mjs"), "--model", model,
               "--prompt-ids", prompt_arg(prompt), "--tokens", str(tokens),
               "--threads", str(self.threads), "--batch", str(batch), "--kv-type", kv,
               "--modules", self.modules]
        if loras:
            cmd += ["--lora", ",".join(loras)]
        if prefill:
            cmd += ["--prefill", str(prefill)]
        return json.loads(run(cmd).stdout)


TORCH_DTYPES = {"bfloat16": "bf16", "float32": "f32"}


def torch_label(dtype):
    return f"PyTorch {TORCH_DTYPES[dtype]}"


class Torch:
    def __init__(self, threads):
        self.threads = threads
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads))

    def run(self, model, batches, tokens, dtype="bfloat16", prefill=0, prompt=None):
        cmd = [PYTHON, os.path.join(HERE, "torch_decode.py"), "--model", model,
               "--prompt-ids", prompt_arg(prompt), "--tokens", str(tokens),
               "--batch", ",".join(map(str, batches)), "--threads", str(self.threads),
               "--dtype", dtype]
        if prefill:
            cmd += ["--prefill", str(prefill)]
        return json.loads(run(cmd, env=self.env).stdout)


# ---- agreement ---------------------------------------------------------------------------------

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(ours, llama, torch, p, args):
    """Returns a list of result lines and whether every strict check passed."""
    lines, ok = [], True
    n = args.agree_tokens
    prompts = [PROMPT, [1, 2, 3], [65, 66, 67, 68, 69]]

    def check(label, got, want, strict=True):
        nonlocal ok
        d = first_difference(got, want)
        if d is None:
            lines.append(f"  {label}: {len(want)} of {len(want)} tokens equal")
        else:
            lines.append(f"  {label}: first difference at token {d} "
                         f"({'MISMATCH' if strict else 'expected for this type'})")
            ok = ok and not strict
        return d

    for name, (model, g32, ads) in p.small.items():
        _, ref = ours.generate(model, prompts, n)
        got = {}
        if llama:
            got["llama.cpp F32"] = llama.run(g32, 1, n, kv="f32", prompt=prompts)["prompt_tokens"]
        if torch:
            got["PyTorch float32"] = torch.run(model, [1], n, dtype="float32",
                                               prompt=prompts)["prompt_tokens"]
        for peer, toks in got.items():
            for i, pr in enumerate(prompts):
                check(f"{name}, prompt {pr[:3]}..: {peer} vs lora-worker", toks[i], ref[i])
        if ads and llama:
            k = len(ads)
            _, ref = ours.generate(model, [PROMPT] * k, n, ads, list(range(k)))
            r = llama.run(g32, k, n, loras=[g for _, _, g in ads], kv="f32")
            seqs = r.get("sequences") or [r["tokens"]]
            for i in range(k):
                check(f"{name}, adapter {i}: llama.cpp F32 + LoRA GGUF vs lora-worker",
                      seqs[i], ref[i])
    # the benchmark model itself, unless it is one of the small ones (--quick)
    if llama and "f32" in p.ggufs and p.model not in [m for m, _, _ in p.small.values()]:
        _, ref = ours.generate(p.ours_model, [PROMPT], n)
        got = llama.run(p.ggufs["f32"], 1, n, kv="f32")["tokens"]
        check(f"{p.shape}: llama.cpp F32 vs lora-worker", got, ref[0])
    return lines, ok


def timed_tokens(ours, tokens, p):
    """How far the other types' greedy tokens (from the timing runs, batch 1) follow lora-stack's:
    bfloat16 and Q8_0 weights are expected to part from float32 sooner or later."""
    lines = []
    ref = getattr(ours, "b1_tokens", None)
    if not ref:
        return lines
    for peer, got in tokens.items():
        n = min(len(ref), len(got))
        d = first_difference(got[:n], ref[:n])
        lines.append(f"  {p.shape}: {peer} vs lora-worker: "
                     + (f"{n} of {n} tokens equal" if d is None else f"first difference at token {d} of {n}"))
    return lines


# ---- timing ------------------------------------------------------------------------------------

HZ = os.sysconf("SC_CLK_TCK")


def cpu_snapshot():
    """(wall, CPU seconds of the whole machine, CPU seconds of this process and its children)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v) - v[3] - v[4]  # all but idle and iowait (guest time is already in user)
    ru = os.times()
    return time.perf_counter(), busy / HZ, ru.user + ru.system + ru.children_user + ru.children_system


def others_load(a, b):
    """Cores' worth of CPU that other processes used between two snapshots."""
    wall = b[0] - a[0]
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall) if wall > 0 else 0.0


def wait_idle(limit, threshold=0.15, window=0.5):
    """Waits, up to limit seconds, for a window in which other processes use under threshold
    cores (the machine is shared). Returns the last window's load."""
    end = time.time() + limit
    while True:
        a = cpu_snapshot()
        time.sleep(window)
        load = others_load(a, cpu_snapshot())
        if load < threshold or time.time() >= end:
            return load

def measure(ours, llama, torch, p, args):
    ads = p.adapters
    loras = [g for _, _, g in ads]
    bt = args.batch_tokens
    jobs = []  # (key, function returning {row: value})
    tokens = {}  # peer -> greedy tokens at batch 1 (last round)
    interference = []  # per job: cores used by other processes meanwhile

    def ours_job():
        def f():
            res = {("b1", "ours"): ours.decode_rate(p.ours_model, 1, args.tokens)}
            for b in args.batches:
                res[(f"b{b}-ad", "ours")] = ours.decode_rate(p.ours_model, b, bt, ads)
            if args.no_adapter_batch:
                b = args.no_adapter_batch
                res[(f"b{b}", "ours")] = ours.decode_rate(p.ours_model, b, bt)
            res[("prefill", "ours")] = ours.prefill_rate(p.ours_model, args.prefill)
            return res
        return f

    jobs.append(("ours", ours_job()))
    if llama:
        for t in p.types:
            def f(t=t):
                r = llama.run(p.ggufs[t], 1, args.tokens, prefill=args.prefill)
                tokens[f"llama.cpp {TYPE_LABEL[t]}"] = r["tokens"]
                return {("b1", f"llama.cpp {TYPE_LABEL[t]}"): r["decode_tok_s"],
                        ("prefill", f"llama.cpp {TYPE_LABEL[t]}"): r["prefill_tok_s"]}
            jobs.append((f"llama.cpp {t} b1", f))
        for t in p.adapter_types:
            for b in args.batches:
                def f(t=t, b=b):
                    r = llama.run(p.ggufs[t], b, bt, loras=loras)
                    return {(f"b{b}-ad", f"llama.cpp {TYPE_LABEL[t]}"): r["decode_tok_s"]}
                jobs.append((f"llama.cpp {t} b{b} adapters", f))
            if args.no_adapter_batch:
                def f(t=t, b=args.no_adapter_batch):
                    r = llama.run(p.ggufs[t], b, bt)
                    return {(f"b{b}", f"llama.cpp {TYPE_LABEL[t]}"): r["decode_tok_s"]}
                jobs.append((f"llama.cpp {t} b{args.no_adapter_batch}", f))
    for dtype in (args.torch_dtypes if torch else []):
        def f(dtype=dtype):
            label = torch_label(dtype)
            bs = sorted(set([1] + args.batches + ([args.no_adapter_batch] if args.no_adapter_batch else [])))
            r = torch.run(p.model, bs, bt, dtype=dtype, prefill=args.prefill)
            tokens[label] = r["runs"][0]["tokens"]
            res = {("prefill", label): r["prefill_tok_s"]}
            for run_ in r["runs"]:
                b = run_["batch"]
                rows = ["b1"] if b == 1 else []
                if b in args.batches:
                    rows.append(f"b{b}-ad")
                if b == args.no_adapter_batch:
                    rows.append(f"b{b}")
                for row in rows:
                    res[(row, label)] = run_["decode_tok_s"]
            return res
        jobs.append((f"torch {dtype}", f))

    samples = {}
    for rnd in range(args.rounds):
        order = jobs[rnd % len(jobs):] + jobs[:rnd % len(jobs)]
        t = time.time()
        for name, f in order:
            if args.wait_idle > 0:
                wait_idle(args.wait_idle)
            a = cpu_snapshot()
            got = f()
            b = cpu_snapshot()
            interference.append(others_load(a, b))
            for k, v in got.items():
                samples.setdefault(k, []).append((v, interference[-1]))
            if args.verbose:
                log(f"    {name}: {b[0] - a[0]:.1f} s, other processes {interference[-1]:.2f} cores")
        log(f"  round {rnd + 1}/{args.rounds}: {time.time() - t:.0f} s")
    # The median of the samples taken while other processes used under args.quiet cores, or of
    # all when none was (such cells are marked); a differential timing can come out as NaN.
    med, noisy = {}, set()
    for k, v in samples.items():
        good = [x for x, load in v if x == x]
        quiet = [x for x, load in v if x == x and load < args.quiet]
        if quiet:
            med[k] = statistics.median(quiet)
        elif good:
            med[k] = statistics.median(good)
            noisy.add(k)
    return med, noisy, samples, tokens, interference


def table(med, noisy, p, args, ours_label):
    rows = [("b1", "decode, batch 1")]
    for b in args.batches:
        rows.append((f"b{b}-ad", f"decode, batch {b}, {N_ADAPTERS} adapters"))
    if args.no_adapter_batch:
        rows.append((f"b{args.no_adapter_batch}", f"decode, batch {args.no_adapter_batch}, no adapter"))
    rows.append(("prefill", f"prefill, {args.prefill} tokens"))
    cols = [c for c in (["ours"] + [f"llama.cpp {TYPE_LABEL[t]}" for t in p.types]
                        + [torch_label(d) for d in args.torch_dtypes])
            if any(k[1] == c for k in med)]
    head = ["tokens/s"] + [ours_label if c == "ours" else c for c in cols]
    out = [head]
    for key, label in rows:
        line = [label]
        ref = med.get((key, "ours"))
        for c in cols:
            v = med.get((key, c))
            if v is None:
                line.append("-")
            elif c == "ours" or ref is None:
                line.append(f"{v:.1f}" + ("*" if (key, c) in noisy else ""))
            else:
                line.append(f"{v:.1f} ({ref / v:.2f}x)" + ("*" if (key, c) in noisy else ""))
        out.append(line)
    widths = [max(len(r[i]) for r in out) for i in range(len(head))]
    text = []
    for j, r in enumerate(out):
        text.append("| " + " | ".join(s.ljust(w) for s, w in zip(r, widths)) + " |")
        if j == 0:
            text.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


# ---- main --------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, one round, few tokens: checks the pipeline (under a minute)")
    ap.add_argument("--shape", default=None, help="make_model.sh shape (default 0.5b; --quick: tiny)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "main", "bin"))
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "peers", "cache"))
    ap.add_argument("--modules", default=os.path.join(ROOT, "build", "peers", "node_modules"))
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=None, help="decoded tokens at batch 1 (32)")
    ap.add_argument("--batch-tokens", type=int, default=None,
                    help="decoded tokens per sequence at batch 8 and 32 (16)")
    ap.add_argument("--batches", default="8,32", help="batch sizes with 8 adapters")
    ap.add_argument("--no-adapter-batch", type=int, default=32,
                    help="also a batch of this size without adapters (0: none)")
    ap.add_argument("--prefill", type=int, default=None, help="prefill length (256)")
    ap.add_argument("--types", default=None, help="llama.cpp GGUF types at batch 1 (f32,bf16,q8_0)")
    ap.add_argument("--adapter-types", default=None,
                    help="llama.cpp GGUF types at the larger batches (f32,q8_0)")
    ap.add_argument("--agree-tokens", type=int, default=16)
    ap.add_argument("--ours-dtype", default=None,
                    help="pass --dtype to lora-worker generate (auto|float32|bfloat16|float16)")
    ap.add_argument("--ours-quantization", default=None,
                    help="pass --quantization to lora-worker generate (int8)")
    ap.add_argument("--ours-matmul-precision", default=None,
                    help="pass --matmul-precision to lora-worker generate (exact|fast)")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-dtypes", default="bfloat16",
                    help="PyTorch dtypes timed, comma-separated: bfloat16, float32 (bfloat16)")
    ap.add_argument("--no-agreement", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--verbose", action="store_true", help="log each timed job's duration")
    ap.add_argument("--wait-idle", type=float, default=None,
                    help="before each timed job, wait up to this many seconds for the other "
                         "processes to use under 0.15 cores (default 20; --quick: 0)")
    ap.add_argument("--quiet", type=float, default=0.3,
                    help="samples count as quiet while other processes use under this many cores")
    args = ap.parse_args()

    q = args.quick
    shape = args.shape or ("tiny" if q else "0.5b")
    args.rounds = args.rounds or (1 if q else 4)
    args.tokens = args.tokens or (8 if q else 32)
    args.batch_tokens = args.batch_tokens or (4 if q else 16)
    args.prefill = args.prefill or (32 if q else 256)
    if args.wait_idle is None:
        args.wait_idle = 0 if q else 20
    args.batches = [int(b) for b in args.batches.split(",") if b]
    big = shape == "7b"
    types = (args.types or ("bf16,q8_0" if big else ",".join(GGUF_TYPES))).split(",")
    adapter_types = (args.adapter_types or ("f32" if q else "q8_0" if big else "f32,q8_0")).split(",")
    for t in types + adapter_types:
        if t not in TYPE_LABEL:
            raise SystemExit(f"bench-peers: unknown GGUF type {t}")
    args.torch_dtypes = [d for d in args.torch_dtypes.split(",") if d]
    for d in args.torch_dtypes:
        if d not in TORCH_DTYPES:
            raise SystemExit(f"bench-peers: unknown PyTorch dtype {d} (bfloat16, float32)")

    if big and not (args.ours_dtype or args.ours_quantization):
        raise SystemExit("bench-peers: the 7b shape needs --ours-dtype bfloat16 or "
                         "--ours-quantization int8 (its float32 weights would take 30 GB)")
    llama = None
    if not args.no_llamacpp:
        if not os.path.exists(os.path.join(args.modules, "node-llama-cpp", "package.json")):
            raise SystemExit(f"bench-peers: node-llama-cpp is not installed in {args.modules}: "
                             "run make bench-deps")
        llama = LlamaCpp(args.threads, args.modules)
    torch = None
    if not args.no_torch:
        if run([PYTHON, "-c", "import torch, numpy"], check=False).returncode != 0:
            raise SystemExit("bench-peers: python3-torch and python3-numpy are needed: run make bench-deps")
        torch = Torch(args.threads)

    t0 = time.time()
    run([PYTHON, os.path.join(HERE, "gguf_write.py"), "self-check"])
    log(f"bench-peers: preparing {shape} in {args.cache}")
    p = Prepared()
    p.shape = shape
    p.model = make_model(shape, args.cache, args.bin, allow_generate=not big)
    native = bool(args.ours_dtype or args.ours_quantization) or big
    p.ours_model = p.model if native else f32_copy(p.model, p.model + "-f32")
    p.types = types
    p.adapter_types = [t for t in adapter_types]
    p.ggufs = {t: gguf(p.model, f"{p.model}.{t}.gguf", t)
               for t in sorted(set(types + adapter_types + (["f32"] if not big else [])))}
    p.adapters = adapters(p.model, p.model, args.bin, N_ADAPTERS, ADAPTER_RANK)
    # small models for the agreement checks: the benchmark's architecture (with adapters) and
    # a Llama (untied, float32, two shards), whose Q/K rows llama.cpp wants permuted
    p.small = {}
    if not args.no_agreement:
        small_q = make_model("tiny", args.cache, args.bin)
        small_l = make_model("small-llama", args.cache, args.bin)
        p.small["small qwen2"] = (small_q, gguf(small_q, small_q + ".f32.gguf", "f32"),
                                  adapters(small_q, small_q, args.bin, 2, 8))
        p.small["small llama"] = (small_l, gguf(small_l, small_l + ".f32.gguf", "f32"), [])
    log(f"bench-peers: prepared in {time.time() - t0:.0f} s")

    ours = Ours(args.bin, args.threads, args.ours_dtype, args.ours_quantization,
                args.ours_matmul_precision)
    exact = Ours(args.bin, args.threads)
    ours_label = "lora-stack " + (args.ours_quantization or args.ours_dtype or "f32") + \
        (f" {args.ours_matmul_precision}" if args.ours_matmul_precision else "")
    result = {"shape": shape, "threads": args.threads, "prompt": PROMPT, "rounds": args.rounds}
    try:
        if not args.no_agreement:
            t = time.time()
            # The conversions are checked against the exact computation: lora-worker's own
            # rounded precisions (int8, fast bf16) are not expected to give float32's tokens.
            lines, ok = agreement(exact, llama, torch, p, args)
            print(f"agreement (greedy, {args.agree_tokens} tokens):")
            print("\n".join(lines), flush=True)
            result["agreement"] = lines
            log(f"bench-peers: agreement in {time.time() - t:.0f} s")
            if not ok:
                print("bench-peers: greedy tokens differ where they must not", file=sys.stderr)
                return 1
        t = time.time()
        log(f"bench-peers: {args.rounds} interleaved rounds")
        med, noisy, samples, tokens, interference = measure(ours, llama, torch, p, args)
        log(f"bench-peers: timed in {time.time() - t:.0f} s")
        lines = timed_tokens(ours, tokens, p)
        if lines:
            print("greedy tokens of the timed batch-1 runs (not required to agree):")
            print("\n".join(lines))
            result["timed_tokens"] = lines
    finally:
        shutil.rmtree(ours.tmp, ignore_errors=True)
        shutil.rmtree(exact.tmp, ignore_errors=True)
    print()
    print(f"{shape}: decode and prefill tokens/s, {args.threads} threads, median of "
          f"{args.rounds} interleaved round(s); (x) = lora-stack / peer, above 1 = lora-stack faster")
    print(table(med, noisy, p, args, ours_label))
    print(f"batch 1: {args.tokens} tokens after an {len(PROMPT)}-token prompt; larger batches: "
          f"{args.batch_tokens} tokens per sequence"
          + ("; llama.cpp with adapters: one adapter's requests at a time" if llama else "")
          + ("; PyTorch: no adapters, eager " + " and ".join(args.torch_dtypes) if torch else ""))
    busy = statistics.median(interference) if interference else 0.0
    print(f"other processes used a median of {busy:.2f} cores (at most {max(interference or [0]):.2f}) "
          f"while the jobs ran; medians over the samples taken while they used under "
          f"{args.quiet} cores" + (f"; * = no such sample, a median of all: not reliable"
                                   if noisy else ""))
    result["other_processes_cores"] = interference
    result["noisy"] = [f"{k[0]} {k[1]}" for k in sorted(noisy)]
    result["median_tok_s"] = {f"{k[0]} {k[1]}": v for k, v in med.items()}
    result["samples_tok_s_and_other_cores"] = {f"{k[0]} {k[1]}": v for k, v in samples.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    log(f"bench-peers: total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
