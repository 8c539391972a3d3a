#!/usr/bin/env node
// Greedy decoding of given token ids with llama.cpp on the CPU, through node-llama-cpp's prebuilt
// addon (the npm package ships llama.cpp as a Node addon plus its shared libraries, no programs).
//
//   node llamacpp_decode.mjs --model M.gguf --prompt-ids 1,2,3 --tokens 32 [--threads 2]
//        [--batch B] [--lora A.gguf,B.gguf,...] [--prefill N] [--kv-type f16|f32]
//        [--modules DIR] [--timings]
//
// Prints one JSON object: {tokens, decode_tok_s, prefill_tok_s, ...}.
//   tokens         the greedy tokens of the first sequence (all of them in "sequences")
//   prompt_tokens  with several prompts (--prompt-ids 1,2;3,4): the first sequence's tokens for
//                  each prompt in turn (only the first prompt is timed)
//   decode_tok_s   tokens generated per second after the prompt, over all sequences: from the
//                  moment every sequence has its first token to the last token
//   prefill_tok_s  with --prefill N: N prompt tokens (ids (7 i + 11) mod 256) evaluated in
//                  one sequence, per second; otherwise the prompt's own prefill (small prompts
//                  make it an overhead figure, not a throughput)
// --batch B runs B sequences of the prompt in one context: node-llama-cpp puts their pending
// tokens into one llama_decode batch per step. With --lora (K files), B must be a multiple of K:
// llama.cpp applies adapters per context, not per sequence, so each adapter gets a context of
// B/K sequences and the adapters' groups run one after another; the rate is every generated
// token over the sum of the groups' decode times. Models load with gpuLayers 0 (memory-mapped);
// a two-token warm-up per context reads the weights before timing. Contexts use llama.cpp's
// default KV cache type (F16; --kv-type f32 for agreement checks) and no flash attention
// (node-llama-cpp's default). The sampler is node-llama-cpp's, at temperature 0 (greedy), and
// runs on every step: its cost is part of the figures, as lora-worker's sampling is of ours.
import path from "node:path";
import process from "node:process";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
    const o = {
        model: null, promptIds: null, tokens: 16, threads: 2, batch: 1, lora: [], prefill: 0,
        kvType: "f16", modules: path.resolve(here, "../../../build/peers/node_modules"),
        ctx: 0, timings: false,
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], v = () => {
            if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
            return argv[++i];
        };
        if (a === "--model") o.model = v();
        else if (a === "--prompt-ids") {
            o.prompts = v().split(";").map((p) => p.split(",").map((s) => parseInt(s, 10)));
            o.promptIds = o.prompts[0];
        }
        else if (a === "--tokens") o.tokens = parseInt(v(), 10);
        else if (a === "--threads") o.threads = parseInt(v(), 10);
        else if (a === "--batch") o.batch = parseInt(v(), 10);
        else if (a === "--lora") o.lora = v().split(",").filter(Boolean);
        else if (a === "--prefill") o.prefill = parseInt(v(), 10);
        else if (a === "--kv-type") o.kvType = v().toLowerCase();
        else if (a === "--modules") o.modules = v();
        else if (a === "--ctx") o.ctx = parseInt(v(), 10);
        else if (a === "--timings") o.timings = true;
        else if (a === "--help") {
            console.log("usage: llamacpp_decode.mjs --model M.gguf --prompt-ids IDS --tokens N " +
                "[--threads T] [--batch B] [--lora A.gguf,...] [--prefill N] [--kv-type f16|f32]");
            process.exit(0);
        } else throw new Error(`unknown option ${a}`);
    }
    if (!o.model || !o.promptIds || o.prompts.flat().some((x) => !Number.isInteger(x) || x < 0))
        throw new Error("--model and --prompt-ids are required");
    if (!(o.tokens >= 1) || !(o.batch >= 1) || !(o.threads >= 1))
        throw new Error("--tokens, --batch and --threads must be positive");
    if (o.lora.length && o.batch % o.lora.length)
        throw new Error("--batch must be a multiple of the number of --lora files");
    if (!["f16", "f32"].includes(o.kvType)) throw new Error("--kv-type is f16 or f32");
    return o;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;

// node-llama-cpp creates its contexts with one KV stream per sequence (kv_unified = false in
// its addon), and llama.cpp then cuts a batch into micro-batches of consecutive, increasing
// sequence ids only (llama_batch_allocr::split_equal, "sequential"). The binding queues the
// sequences' tokens in the order their samplers finish, so a decode step of 32 sequences became
// up to 32 micro-batches of one token: batch-1 speed. Putting the queued tokens in sequence-id
// order keeps a step in one micro-batch. The queue is internal to node-llama-cpp (pinned
// version); the batch items are built from it in the same order.
function bySequenceId(group, { items, size }) {
    const queued = group.context && group.context._queuedDecodes ? [...group.context._queuedDecodes] : null;
    let ordered = items;
    if (queued && queued.length === items.length) {
        ordered = items.map((item, i) => [queued[i].sequenceId, item])
            .sort((a, b) => a[0] - b[0]).map((p) => p[1]);
    }
    group.reordered = (group.reordered || 0) + (queued && queued.length === items.length ? 1 : 0);
    return maximumParallelism({ items: ordered, size });
}

// node-llama-cpp's default strategy ("maximumParallelism"), which is not exported: every queued
// item gets an equal share of the batch, then the rest by priority; the order is kept.
function maximumParallelism({ items, size }) {
    let left = size;
    const each = Math.floor(left / items.length);
    const res = [];
    const clipped = [];
    for (const item of items) {
        const amount = Math.min(item.tokens.length, left, each);
        const p = { item, processAmount: amount };
        res.push(p);
        left -= amount;
        if (amount < item.tokens.length) clipped.push(p);
        if (left === 0) break;
    }
    clipped.sort((a, b) => b.item.evaluationPriority - a.item.evaluationPriority);
    for (const p of clipped) {
        if (left <= 0) break;
        const more = Math.min(p.item.tokens.length - p.processAmount, left);
        p.processAmount += more;
        left -= more;
    }
    return res;
}

// Runs n sequences of the prompt in one context, greedily, to `tokens` tokens each. Returns
// the tokens and the times at which each sequence got its first and its last token.
async function decodeGroup(group, promptIds, tokens) {
    if (!group.seqs) {
        group.seqs = [];
        for (let s = 0; s < group.context.totalSequences; s++) group.seqs.push(group.context.getSequence());
    }
    const seqs = group.seqs;
    for (const seq of seqs) await seq.clearHistory();
    const t0 = now();
    const runs = seqs.map(async (seq) => {
        const out = [];
        let first = 0, last = 0;
        for await (const tok of seq.evaluate(promptIds, { temperature: 0, yieldEogToken: true })) {
            last = now();
            if (out.length === 0) first = last;
            out.push(tok);
            if (out.length >= tokens) break;
        }
        return { out, first, last };
    });
    const res = await Promise.all(runs);
    const firstAll = Math.max(...res.map((r) => r.first));
    const lastAll = Math.max(...res.map((r) => r.last));
    return {
        sequences: res.map((r) => r.out),
        prefill_s: firstAll - t0,
        decode_s: lastAll - firstAll,
        decoded: res.reduce((n, r) => n + r.out.length - 1, 0),
    };
}

async function bindingVersion(modules) {
    const fs = await import("node:fs/promises");
    const pkg = JSON.parse(await fs.readFile(path.join(modules, "node-llama-cpp", "package.json"), "utf8"));
    return pkg.version;
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const nlc = await import(pathToFileURL(path.join(o.modules, "node-llama-cpp", "dist", "index.js")).href);
    const llama = await nlc.getLlama({
        gpu: false, build: "never", usePrebuiltBinaries: true, maxThreads: o.threads,
        logLevel: o.timings ? nlc.LlamaLogLevel.info : nlc.LlamaLogLevel.error, progressLogs: false,
    });
    const tLoad = now();
    const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0, useMmap: true });
    const loadS = now() - tLoad;
    const groups = o.lora.length ? o.lora.map((f) => ({ lora: f })) : [{ lora: null }];
    const perGroup = o.batch / groups.length;
    const longest = Math.max(...o.prompts.map((p) => p.length));
    const ctxSize = o.ctx || Math.max(longest + o.tokens + 16, o.prefill + 16, 64);
    const common = {
        sequences: perGroup, contextSize: ctxSize, batchSize: Math.max(512, o.prefill),
        threads: { ideal: o.threads, min: o.threads }, flashAttention: false,
        experimentalKvCacheKeyType: o.kvType.toUpperCase(),
        experimentalKvCacheValueType: o.kvType.toUpperCase(),
        ignoreMemorySafetyChecks: true, failedCreationRemedy: false,
        performanceTracking: o.timings,
    };
    for (const g of groups) {
        g.context = await model.createContext({
            ...common, ...(g.lora ? { lora: { adapters: [{ filePath: g.lora, scale: 1 }] } } : {}),
            batching: { itemPrioritizationStrategy: (arg) => bySequenceId(g, arg) },
        });
    }
    // Warm-up: one short generation per context pages the weights and adapters in.
    for (const g of groups) await decodeGroup(g, o.promptIds, 2);

    let decodeS = 0, decoded = 0, promptS = 0;
    const sequences = [];
    for (const g of groups) {
        const r = await decodeGroup(g, o.promptIds, o.tokens);
        decodeS += r.decode_s;
        decoded += r.decoded;
        promptS += r.prefill_s;
        sequences.push(...r.sequences);
    }
    const result = {
        engine: "llama.cpp",
        llama_cpp: llama.llamaCppRelease,
        binding: `node-llama-cpp ${await bindingVersion(o.modules)}`,
        cpu: llama.systemInfo.trim(),
        model: path.basename(o.model),
        threads: o.threads,
        batch: o.batch,
        adapters: o.lora.length,
        kv_type: o.kvType,
        tokens: sequences[0],
        sequences: o.batch > 1 ? sequences : undefined,
        decode_tok_s: decoded / decodeS,
        decode_s: decodeS,
        decoded,
        prompt_s: promptS,
        load_s: loadS,
    };
    if (o.prompts.length > 1) {
        // the other prompts, one after another on the first context's sequences (agreement checks)
        result.prompt_tokens = [sequences[0]];
        for (const p of o.prompts.slice(1)) {
            const r = await decodeGroup(groups[0], p, o.tokens);
            result.prompt_tokens.push(r.sequences[0]);
        }
    }
    if (o.prefill > 0) {
        const ids = [];
        for (let i = 0; i < o.prefill; i++) ids.push((7 * i + 11) % 256); // the same ids in every peer
        const seq = groups[0].seqs[0];
        await seq.clearHistory();
        await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, 8)); // warm the path
        await seq.clearHistory();
        const t = now();
        await seq.evaluateWithoutGeneratingNewTokens(ids);
        result.prefill_tokens = o.prefill;
        result.prefill_tok_s = o.prefill / (now() - t);
    } else {
        result.prefill_tok_s = o.promptIds.length * o.batch / promptS;
    }
    if (o.timings) for (const g of groups) await g.context.printTimings();
    for (const g of groups) await g.context.dispose();
    await model.dispose();
    process.stdout.write(JSON.stringify(result) + "\n");
}

main().catch((e) => {
    process.stderr.write(`llamacpp_decode: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
});
