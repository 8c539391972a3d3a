#!/usr/bin/env node
// Compares the C tokenizer (through tests/tools/tokenize) with Hugging Face's tokenizers (the
// Node binding that tests/ref/node_deps.sh installs) on a corpus of JSON lines, line by line.
//
//   node tests/ref/tokenizer_compat.js --tool PATH --corpus FILE --node-dir DIR
//        [--name NAME] [--stream-check SEED] [--show N] TOKENIZER_JSON
//
// For every line it checks, against the reference:
//   encode          ids of encode(text)                      (addSpecialTokens false)
//   encode_special  ids of encode(text, addSpecialTokens)
//   decode          decode(ids)                              (skipSpecialTokens false)
//   decode_skip     decode(ids, skipSpecialTokens)
//   decode_special  decode(ids of encode_special)
// where the decodes take the C side's ids, so that they test decoding alone. Then the round
// trip: on every line where the reference's decode(encode(x)) gives back x, the C side must
// too; the lines where the reference does not are counted by reason.
// With --stream-check, the tool also checks its streaming decoder on every line.
//
// Output is TAP, one test per check; the first --show (default 5) mismatches of each are
// printed with both sides. Exit 0 when everything matches, 1 otherwise, 100 on usage errors.
'use strict';
const fs = require('fs');
const path = require('path');
const {spawnSync} = require('child_process');

function usage(code) {
    const text = 'usage: tokenizer_compat.js --tool PATH --corpus FILE --node-dir DIR ' +
        '[--name NAME] [--stream-check SEED] [--show N] TOKENIZER_JSON';
    (code ? console.error : console.log)(text);
    process.exit(code);
}

function parseArgs(argv) {
    const o = {tool: null, corpus: null, nodeDir: null, name: null, stream: null, show: 5,
        tokenizer: null};
    for (let i = 2; i < argv.length; i++) {
        const a = argv[i], v = () => {
            if (i + 1 >= argv.length) usage(100);
            return argv[++i];
        };
        if (a === '--tool') o.tool = v();
        else if (a === '--corpus') o.corpus = v();
        else if (a === '--node-dir') o.nodeDir = v();
        else if (a === '--name') o.name = v();
        else if (a === '--stream-check') o.stream = v();
        else if (a === '--show') o.show = Number(v());
        else if (a === '-h' || a === '--help') usage(0);
        else if (a.startsWith('-') || o.tokenizer) usage(100);
        else o.tokenizer = a;
    }
    if (!o.tool || !o.corpus || !o.nodeDir || !o.tokenizer) usage(100);
    o.name = o.name || path.basename(path.dirname(o.tokenizer));
    return o;
}

const show = (x) => JSON.stringify(x);
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// Why the reference's decode(encode(x)) is not x.
function whyNoRoundTrip(text, ids, tok, specials) {
    if (text.normalize('NFC') !== text && tok.hasNfc) return 'NFC normalization changes the text';
    if (specials.some((s) => text.includes(s))) return 'added tokens in the text';
    if (tok.hasPrepend && text.startsWith(' ')) return 'a leading space (SentencePiece prefix)';
    if (tok.hasPrepend && text.includes('\u2581')) return "'\u2581' in the text decodes as a space";
    if (ids.length === 0 && text !== '') return 'nothing encoded';
    return 'other';
}

async function main() {
    const o = parseArgs(process.argv);
    const {Tokenizer} = require(path.resolve(o.nodeDir, 'node_modules/tokenizers'));
    const texts = fs.readFileSync(o.corpus, 'utf8').split('\n').filter((l) => l !== '')
        .map((l) => JSON.parse(l).text);
    const args = [o.tokenizer, '--input', o.corpus];
    if (o.stream !== null) args.push('--stream-check', o.stream);
    const run = spawnSync(o.tool, args, {maxBuffer: 1 << 30, encoding: 'utf8'});
    if (run.error || run.status === null || run.status > 1) {
        console.log(`not ok 1 - ${o.name}: the C tool failed: ` +
            `${run.error || run.stderr || 'status ' + run.status}`);
        console.log('1..1');
        process.exit(1);
    }
    const got = run.stdout.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
    const spec = JSON.parse(fs.readFileSync(o.tokenizer, 'utf8'));
    const specials = (spec.added_tokens || []).map((t) => t.content);
    const norm = JSON.stringify(spec.normalizer || null);
    const tokInfo = {hasNfc: norm.includes('"NFC"'), hasPrepend: norm.includes('"Prepend"')};
    const ref = Tokenizer.fromFile(o.tokenizer);

    const checks = ['encode', 'encode_special', 'decode', 'decode_skip', 'decode_special'];
    if (o.stream !== null) checks.push('stream');
    const bad = Object.fromEntries(checks.map((c) => [c, []]));
    let refTrips = 0, cTrips = 0, lost = [];
    const reasons = {};
    for (let i = 0; i < texts.length; i++) {
        const text = texts[i], c = got[i] || {error: 'no output line'};
        const ids = (await ref.encode(text, null, {addSpecialTokens: false})).getIds();
        const idsSp = (await ref.encode(text, null, {addSpecialTokens: true})).getIds();
        if (c.error) {
            for (const k of checks) bad[k].push({i, text, detail: `C error: ${c.error}`});
            continue;
        }
        if (!same(c.ids, ids)) bad.encode.push({i, text, detail: `C ${show(c.ids)}\n#   ref ${show(ids)}`});
        if (!same(c.ids_special, idsSp))
            bad.encode_special.push({i, text, detail: `C ${show(c.ids_special)}\n#   ref ${show(idsSp)}`});
        const pairs = [['decode', c.ids, false, c.decoded], ['decode_skip', c.ids, true, c.decoded_skip],
            ['decode_special', c.ids_special, false, c.decoded_special]];
        for (const [k, cIds, skip, cText] of pairs) {
            const want = await ref.decode(cIds, skip);
            if (want !== cText) bad[k].push({i, text, detail: `ids ${show(cIds)}\n#   C   ${show(cText)}\n#   ref ${show(want)}`});
        }
        if (o.stream !== null && c.stream_ok !== true) bad.stream.push({i, text, detail: 'stream_ok false'});
        const refBack = await ref.decode(ids, false);
        if (refBack === text) {
            refTrips++;
            if (c.decoded === text) cTrips++;
            else lost.push({i, text, detail: `C decode gives ${show(c.decoded)}`});
        } else {
            const why = whyNoRoundTrip(text, ids, tokInfo, specials);
            reasons[why] = (reasons[why] || 0) + 1;
        }
    }

    let n = 0, failed = 0;
    const report = (ok, msg, list) => {
        n++;
        if (!ok) failed++;
        console.log(`${ok ? 'ok' : 'not ok'} ${n} - ${o.name}: ${msg}`);
        for (const m of (list || []).slice(0, o.show))
            console.log(`#   line ${m.i + 1} ${show(m.text)}\n#   ${m.detail}`);
    };
    for (const k of checks) {
        const miss = bad[k].length;
        report(miss === 0, `${k}: ${texts.length - miss} match, ${miss} mismatch`, bad[k]);
    }
    const why = Object.entries(reasons).map(([k, v]) => `${v} ${k}`).join(', ') || 'none';
    report(lost.length === 0, `round trip: reference gives back ${refTrips}/${texts.length} ` +
        `strings, C ${cTrips}/${refTrips} of those; others: ${why}`, lost);
    console.log(`1..${n}`);
    process.exit(failed ? 1 : 0);
}

main().catch((e) => {
    console.log(`not ok 1 - ${e.stack || e}`);
    console.log('1..1');
    process.exit(1);
});
