#!/usr/bin/env node
// Hugging Face tokenizers' single-call throughput (the Node binding) on the documents that
// tests/bench/bench_tokenizer.c measures lib/text/tokenizer on; that program runs this one.
//
//   node tests/bench/tokenizer_reference_speed.js --node-dir DIR --corpus FILE [--mb N]
//        [--runs N] TOKENIZER_JSON
//
// Prints one line: encode_mb_s=X decode_mb_s=Y (medians; MB = 10^6 bytes of UTF-8 text).
// Calls are awaited one at a time, so the binding's thread pool does not run them in parallel.
'use strict';
const fs = require('fs');
const path = require('path');

const DOC_BYTES = 4096;

function parseArgs(argv) {
    const o = {nodeDir: null, corpus: null, mb: 4, runs: 3, tokenizer: null};
    for (let i = 2; i < argv.length; i++) {
        const a = argv[i];
        if (a === '--node-dir') o.nodeDir = argv[++i];
        else if (a === '--corpus') o.corpus = argv[++i];
        else if (a === '--mb') o.mb = Number(argv[++i]);
        else if (a === '--runs') o.runs = Number(argv[++i]);
        else if (!a.startsWith('-') && !o.tokenizer) o.tokenizer = a;
        else {
            console.error(`tokenizer_reference_speed: unexpected argument '${a}'`);
            process.exit(100);
        }
    }
    if (!o.nodeDir || !o.corpus || !o.tokenizer) {
        console.error('usage: tokenizer_reference_speed.js --node-dir DIR --corpus FILE ' +
            '[--mb N] [--runs N] TOKENIZER_JSON');
        process.exit(100);
    }
    return o;
}

// The same documents as bench_tokenizer.c's make_docs.
function makeDocs(texts, mb) {
    const want = mb * 1e6, docs = [];
    let total = 0, k = 0;
    while (total < want) {
        let doc = '', len = 0;
        while (len < DOC_BYTES) {
            const s = texts[k++ % texts.length];
            if (len) { doc += '\n'; len += 1; }
            doc += s;
            len += Buffer.byteLength(s);
        }
        docs.push(doc);
        total += len;
    }
    return {docs, total};
}

const median = (v) => {
    v.sort((a, b) => a - b);
    const n = v.length;
    return n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
};

async function main() {
    const o = parseArgs(process.argv);
    const {Tokenizer} = require(path.resolve(o.nodeDir, 'node_modules/tokenizers'));
    const texts = fs.readFileSync(o.corpus, 'utf8').split('\n').filter((l) => l)
        .map((l) => JSON.parse(l).text).filter((t) => t !== '' && !t.includes('\u0000'));
    const {docs, total} = makeDocs(texts, o.mb);
    const tok = Tokenizer.fromFile(o.tokenizer);
    const enc = [], dec = [];
    let ids = [];
    for (let r = 0; r < o.runs; r++) {
        const t0 = process.hrtime.bigint();
        ids = [];
        for (const d of docs) ids.push((await tok.encode(d, null, {addSpecialTokens: false})).getIds());
        enc.push(total / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9));
    }
    for (let r = 0; r < o.runs; r++) {
        const t0 = process.hrtime.bigint();
        let out = 0;
        for (const x of ids) out += Buffer.byteLength(await tok.decode(x, false));
        dec.push(out / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9));
    }
    console.log(`encode_mb_s=${median(enc).toFixed(3)} decode_mb_s=${median(dec).toFixed(3)}`);
}

main().catch((e) => {
    console.error(`tokenizer_reference_speed: ${e.stack || e}`);
    process.exit(1);
});
