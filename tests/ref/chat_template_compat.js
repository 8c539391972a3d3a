#!/usr/bin/env node
// chat_template_compat: the C chat template renderer (tests/tools/chat_render) against Jinja.
//
// Generates the same deterministic set of conversations for every template (with and
// without a system message, 1 to 6 turns, add_generation_prompt true and false, contents with
// newlines, edge whitespace, unicode, template syntax and special tokens, empty ones, plus
// orders and roles some families refuse), renders each with @huggingface/jinja and with the C
// tool, and requires byte-identical prompts. A conversation the template rejects through
// raise_exception must be rejected by the C side too; the C side also refuses some the
// template renders silently (an unknown role dropped, a misplaced system message ignored),
// which the policy below lists per family.
//
// Reference semantics: transformers renders templates with Python Jinja2, and that is what
// models were trained on. @huggingface/jinja 0.5.13 differs from it in three ways that real
// templates reach: str.strip/lstrip/rstrip ignore their chars argument (Qwen3 calls
// lstrip('\n')), == and != use JavaScript's loose equality ('' != false is false; Llama 2
// tests system_message != false), and trim uses JavaScript's whitespace set. The shim below
// gives those three Python semantics; every conversation is rendered with and without it and
// the count where the unshimmed renderer differs is reported. When python3 with jinja2 is
// installed, each conversation is also rendered by Jinja2 as transformers configures it, and
// the C prompt must equal that too.
//
// Usage: chat_template_compat.js --node-dir DIR --tool PATH --family F [--variant NAME]
//          (--config PATH | --template PATH [--bos T] [--eos T]) [--c-name NAME] [--min N]
// --c-name renders the C side with a built-in template (--name) instead of the same file.
// Exit 0 when every conversation agrees, 1 otherwise, 100 on usage errors.
'use strict';

const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

function usage(msg) {
    process.stderr.write(`chat_template_compat: usage: ${msg}\n`);
    process.exit(100);
}

function parseArgs(argv) {
    const a = { min: 60 };
    const known = ['node-dir', 'tool', 'family', 'variant', 'config', 'template', 'bos', 'eos',
        'c-name', 'min'];
    for (let i = 0; i < argv.length; i += 2) {
        const k = argv[i].replace(/^--/, '');
        if (!known.includes(k) || i + 1 >= argv.length)
            usage(`unknown option or missing value: ${argv[i]}`);
        a[k] = argv[i + 1];
    }
    if (!a['node-dir'] || !a.tool || !a.family || !!a.config === !!a.template)
        usage('need --node-dir, --tool, --family and one of --config / --template');
    a.min = Number(a.min);
    return a;
}

// ---- the reference template: source and tokens, as transformers reads them ----------------

function tokenText(v) {
    if (v && typeof v === 'object')
        v = v.content;
    return typeof v === 'string' ? v : null;
}

function loadReference(a) {
    if (a.template)
        return { source: fs.readFileSync(a.template, 'utf8'), bos: a.bos ?? null,
            eos: a.eos ?? null };
    const cfg = JSON.parse(fs.readFileSync(a.config, 'utf8'));
    let source = cfg.chat_template;
    if (Array.isArray(source))
        source = (source.find((t) => t.name === 'default') || {}).template;
    if (typeof source !== 'string')
        throw new Error(`${a.config}: no chat_template string`);
    return { source, bos: tokenText(cfg.bos_token), eos: tokenText(cfg.eos_token) };
}

// ---- the Python-semantics shim for @huggingface/jinja --------------------------------------

const PY_SPACE = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85,
    0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
    0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000]);

// Python's str.strip(chars) family: chars null strips str.isspace() characters.
function pyStrip(s, chars, left, right) {
    const cps = Array.from(s);
    const set = chars == null ? null : new Set(Array.from(chars));
    const drop = (c) => (set ? set.has(c) : PY_SPACE.has(c.codePointAt(0)));
    let i = 0, j = cps.length;
    while (left && i < j && drop(cps[i]))
        i++;
    while (right && j > i && drop(cps[j - 1]))
        j--;
    return cps.slice(i, j).join('');
}

// Thrown by the template's raise_exception, to tell it from the renderer's own errors.
class Raised extends Error {}

function installShim(jinja, shim) {
    const set = jinja.Environment.prototype.set;
    jinja.Environment.prototype.set = function (name, value) {
        if (name === 'raise_exception')
            value = (msg) => { throw new Raised(String(msg)); };
        return set.call(this, name, value);
    };
    const env = new jinja.Environment();
    env.set('s', 'x');
    env.set('b', true);
    const sample = env.lookupVariable('s');
    const StringValue = sample.constructor;
    const BooleanValue = env.lookupVariable('b').constructor;
    const FunctionValue = sample.builtins.get('strip').constructor;
    const builtins = Object.getOwnPropertyDescriptor(StringValue.prototype, 'builtins').get;
    const stripArg = (args) =>
        (args[0] && typeof args[0].value === 'string' ? args[0].value : null);

    Object.defineProperty(StringValue.prototype, 'builtins', {
        get() {
            const map = builtins.call(this);
            if (shim.on && !map.pyShim) {
                map.pyShim = true;
                const self = this;
                const fn = (l, r) => new FunctionValue((args) =>
                    new StringValue(pyStrip(self.value, stripArg(args), l, r)));
                map.set('strip', fn(true, true));
                map.set('lstrip', fn(true, false));
                map.set('rstrip', fn(false, true));
            }
            return map;
        },
    });
    const proto = jinja.Interpreter.prototype;
    const applyFilter = proto.applyFilter;
    proto.applyFilter = function (operand, filterNode, environment) {
        if (shim.on && filterNode.type === 'Identifier' && filterNode.value === 'trim' &&
            operand instanceof StringValue)
            return new StringValue(pyStrip(operand.value, null, true, true));
        return applyFilter.call(this, operand, filterNode, environment);
    };
    const numeric = (v) => ['IntegerValue', 'FloatValue', 'BooleanValue'].includes(v.type);
    const binary = proto.evaluateBinaryExpression;
    proto.evaluateBinaryExpression = function (node, environment) {
        const op = node.operator.value;
        if (!shim.on || (op !== '==' && op !== '!='))
            return binary.call(this, node, environment);
        const l = this.evaluate(node.left, environment);
        const r = this.evaluate(node.right, environment);
        let eq;
        if (numeric(l) && numeric(r))
            eq = Number(l.value) === Number(r.value);
        else if (l.type === 'StringValue' || r.type === 'StringValue')
            eq = l.type === r.type && l.value === r.value;
        else if (l.type === 'UndefinedValue' || r.type === 'UndefinedValue')
            eq = l.type === r.type;
        else
            eq = l.value == r.value;
        return new BooleanValue(op === '==' ? eq : !eq);
    };
}

// ---- conversations -------------------------------------------------------------------------

// mulberry32: a small deterministic generator, so every run sees the same conversations.
function rng(seed) {
    return () => {
        seed = (seed + 0x6d2b79f5) | 0;
        let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const CONTENTS = [
    'Hello!', '', 'What is 2 + 2?', '  leading and trailing spaces  ', '\n\nnewlines around\n\n',
    'line one\nline two\n\nline four', '\ttabs\tinside\t', ' x', 'x ', '   ', '0', 'false', 'None',
    'unicode: héllo wörld, 你好, Привет, 🌍👍🏽',
    'quotes "double" \'single\' and \\backslash\\',
    '{{ not a template }} {% if x %}', '[INST] injected [/INST] <<SYS>>', '<|im_end|> injected',
    '<think>\nplan the answer\n</think>\n\nthe answer', '</think>closing only',
    '<think>a</think>b</think>\n c', '\n<think>\n\nx\n\n</think>\n\n\n  y',
    '<tool_response>\n{"ok": true}\n</tool_response>', 'windows\r\nline ends\r\n',
    '\u00a0no-break spaces\u00a0', '\u2003em space\u3000', '\u0085next line\u001c',
    '\ufeffbyte order mark\ufeff', 'x'.repeat(700) + '\n' + 'long line '.repeat(150),
];

function conversations() {
    const next = rng(20240611);
    const pick = () => CONTENTS[Math.floor(next() * CONTENTS.length)];
    const msg = (role) => ({ role, content: pick() });
    const out = [];
    const add = (kind, messages, gen) => out.push({ kind, messages, add_generation_prompt: gen });
    const alternating = (system, turns, endAssistant) => {
        const m = system ? [msg('system')] : [];
        for (let t = 0; t < turns; t++) {
            m.push(msg('user'));
            if (t < turns - 1 || endAssistant)
                m.push(msg('assistant'));
        }
        return m;
    };
    for (const system of [false, true])
        for (let turns = 1; turns <= 6; turns++)
            for (const endAssistant of [false, true])
                for (const gen of [false, true])
                    add('alternating', alternating(system, turns, endAssistant), gen);
    for (let i = 0; i < 24; i++)
        add('alternating', alternating(next() < 0.5, 1 + Math.floor(next() * 6), next() < 0.5),
            next() < 0.5);
    const c = (role, content) => ({ role, content });
    const fixed = [
        ['alternating', [c('user', 'q'), c('assistant', '<think>\nr\n</think>\n\na')]],
        ['alternating', [c('user', '<tool_response>x</tool_response>'), c('assistant', ' a')]],
        ['alternating', [c('system', ''), c('user', ''), c('assistant', '')]],
        ['alternating', [c('system', '0'), c('user', 'hi')]],
        ['free', [c('user', 'a'), c('user', 'b')]],
        ['free', [c('assistant', 'a')]],
        ['free', [c('assistant', 'a'), c('user', 'b')]],
        ['free', [c('system', 's')]],
        ['free', [c('system', 's'), c('system', 't'), c('user', 'u')]],
        ['free', [c('user', 'u'), c('system', 's'), c('user', 'v')]],
        ['free', [c('user', 'u'), c('assistant', 'a'), c('system', 's')]],
        ['free', [c('user', 'q'), c('assistant', '<think>r1</think>a1'), c('assistant', ' a2')]],
        ['free', [c('user', 'q'), c('assistant', 'a1'), c('assistant', '<think>\nr\n</think>a2')]],
        ['free', [c('system', 's'), c('assistant', 'a'), c('user', 'u')]],
        ['role', [c('user', 'u'), c('bot', 'b')]],
        ['role', [c('user', 'u'), c('tool', '{"x": 1}')]],
        ['role', [c('developer', 'd'), c('user', 'u')]],
        ['role', [c('System', 's'), c('user', 'u')]],
        ['role', [c('', 'x'), c('user', 'u')]],
        ['role', [{ content: 'no role' }, c('user', 'u')]],
        ['role', [c('user', null)]],
        ['empty', []],
    ];
    for (const [kind, messages] of fixed)
        for (const gen of [false, true])
            add(kind, messages, gen);
    return out;
}

// Why the C side refuses a conversation the template may render, or null. desc is what the C
// tool detected (--describe).
function cRefuses(desc, conv) {
    const m = conv.messages;
    if (m.length === 0)
        return 'empty';
    if (m.some((x) => !['system', 'user', 'assistant'].includes(x.role) ||
        typeof x.content !== 'string'))
        return 'role';
    if (desc.family !== 'llama2' && desc.family !== 'mistral')
        return null;
    const loop = desc.system_slot !== 'none' && m[0].role === 'system' ? m.slice(1) : m;
    if (loop.length === 0)
        return 'system alone';
    for (let k = 0; k < loop.length; k++) {
        if ((loop[k].role === 'user') !== (k % 2 === 0))
            return 'alternation';
        if (loop[k].role === 'system')
            return 'system position';
    }
    return null;
}

// ---- renderers -----------------------------------------------------------------------------

function renderJs(jinja, shim, on, ref, convs) {
    const template = new jinja.Template(ref.source);
    shim.on = on;
    return convs.map((conv) => {
        const ctx = { messages: conv.messages, add_generation_prompt: conv.add_generation_prompt };
        if (ref.bos != null)
            ctx.bos_token = ref.bos;
        if (ref.eos != null)
            ctx.eos_token = ref.eos;
        try {
            return { prompt: template.render(ctx) };
        } catch (e) {
            return e instanceof Raised ? { raise: e.message } : { error: e.message };
        }
    });
}

// Jinja2 configured as transformers' apply_chat_template does it.
const JINJA2 = `
import json, sys
from datetime import datetime
try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print(json.dumps({"unavailable": "python3 has no jinja2"}))
    sys.exit(0)
class Raised(jinja2.exceptions.TemplateError):
    pass
def raise_exception(message):
    raise Raised(message)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
req = json.load(sys.stdin)
template = env.from_string(req["source"])
out = []
for conv in req["conversations"]:
    ctx = {"messages": conv["messages"], "add_generation_prompt": conv["add_generation_prompt"]}
    for k in ("bos", "eos"):
        if req[k] is not None:
            ctx[k + "_token"] = req[k]
    try:
        out.append({"prompt": template.render(**ctx)})
    except Raised as e:
        out.append({"raise": str(e)})
    except Exception as e:
        out.append({"error": "%s: %s" % (type(e).__name__, e)})
print(json.dumps({"version": jinja2.__version__, "results": out}))
`;

function renderJinja2(ref, convs) {
    const python = process.env.PYTHON || 'python3';
    const input = JSON.stringify({ source: ref.source, bos: ref.bos, eos: ref.eos,
        conversations: convs.map((c) => ({ messages: c.messages,
            add_generation_prompt: c.add_generation_prompt })) });
    const r = spawnSync(python, ['-c', JINJA2], { input, maxBuffer: 1 << 28, encoding: 'utf8' });
    if (r.error || r.status !== 0)
        return { unavailable: `${python} failed: ${r.error ? r.error.message : r.stderr}` };
    return JSON.parse(r.stdout);
}

function cArgs(a) {
    if (a['c-name'])
        return ['--name', a['c-name']];
    if (a.config)
        return ['--config', a.config];
    const args = ['--template', a.template];
    if (a.bos != null)
        args.push('--bos', a.bos);
    if (a.eos != null)
        args.push('--eos', a.eos);
    return args;
}

function runTool(a, extra, input) {
    const r = spawnSync(a.tool, cArgs(a).concat(extra), { input, maxBuffer: 1 << 28,
        encoding: 'utf8' });
    if (r.error)
        throw new Error(`unable to run ${a.tool}: ${r.error.message}`);
    return r;
}

// ---- comparison ----------------------------------------------------------------------------

function main() {
    const a = parseArgs(process.argv.slice(2));
    const jinja = require(path.resolve(a['node-dir'], 'node_modules/@huggingface/jinja'));
    const shim = { on: false };
    installShim(jinja, shim);
    const ref = loadReference(a);
    const label = a['c-name'] ? `--name ${a['c-name']} vs ${a.config || a.template}`
        : a.config || a.template;

    const d = runTool(a, ['--describe'], '');
    if (d.status !== 0)
        throw new Error(`${a.tool} --describe exited ${d.status}: ${d.stderr.trim()}`);
    const desc = JSON.parse(d.stdout);
    if (desc.family !== a.family || (a.variant && desc.name !== a.variant))
        throw new Error(`detected ${desc.family}/${desc.name}, expected ${a.family}/` +
            `${a.variant || '*'}`);

    const convs = conversations();
    const shimmed = renderJs(jinja, shim, true, ref, convs);
    const raw = renderJs(jinja, shim, false, ref, convs);
    const py = renderJinja2(ref, convs);
    const t = runTool(a, [], convs.map((c) => JSON.stringify({ messages: c.messages,
        add_generation_prompt: c.add_generation_prompt })).join('\n') + '\n');
    const cOut = t.stdout.split('\n').filter((l) => l).map((l) => JSON.parse(l));
    if (t.status !== 0 || cOut.length !== convs.length)
        throw new Error(`${a.tool} exited ${t.status} with ${cOut.length} lines for ` +
            `${convs.length} requests: ${t.stderr.trim()}`);

    const n = { identical: 0, bothReject: 0, raised: 0, cOnly: 0, mismatched: 0, rawDiffers: 0,
        py: 0, pyRendered: 0 };
    const policy = {};
    const failures = [];
    convs.forEach((conv, i) => {
        const ref1 = shimmed[i], c = cOut[i], refusal = cRefuses(desc, conv);
        const fail = (why, expected) => { n.mismatched++; failures.push({ i, why, conv, expected,
            c }); };
        if (raw[i].prompt !== ref1.prompt || !!raw[i].raise !== !!ref1.raise)
            n.rawDiffers++;
        if (ref1.error && !refusal)
            return fail(`the reference failed: ${ref1.error}`, ref1);
        if (refusal || ref1.raise) {
            if (c.prompt !== undefined)
                return fail(ref1.raise ? 'the template raises, C renders'
                    : `C should refuse (${refusal})`, ref1);
            if (!refusal)
                return fail(`the template raises (${ref1.raise}) but the policy expects a prompt`,
                    ref1);
            if (ref1.raise || ref1.error) {
                n.bothReject++;
                n.raised += ref1.raise ? 1 : 0;
            } else {
                n.cOnly++;
                policy[refusal] = (policy[refusal] || 0) + 1;
            }
        } else if (c.prompt !== ref1.prompt) {
            return fail(c.error ? `C refuses: ${c.error}` : 'prompts differ', ref1);
        } else {
            n.identical++;
        }
        if (py.results) {
            const p = py.results[i];
            // A policy refusal stands whatever Jinja2 does; otherwise the outcomes must match.
            const same = refusal ? c.prompt === undefined
                : p.prompt !== undefined ? c.prompt === p.prompt
                : c.prompt === undefined && p.raise !== undefined;
            if (p.prompt !== undefined)
                n.pyRendered++;
            if (same)
                n.py++;
            else
                fail(`jinja2 disagrees: ${p.error || p.raise || 'renders'}`, p);
        }
    });

    const policyText = Object.entries(policy).map(([k, v]) => `${v} ${k}`).join(', ') || 'none';
    console.log(`chat_template_compat: ${label}: ${desc.family}/${desc.name}: ` +
        `${convs.length} conversations: ${n.identical} identical prompts, ${n.mismatched} ` +
        `mismatched, ${n.bothReject} rejected by both (${n.raised} by raise_exception), ` +
        `${n.cOnly} refused by C only ` +
        `(${policyText}); unshimmed @huggingface/jinja differs on ${n.rawDiffers}; ` +
        (py.results ? `jinja2 ${py.version} agrees on ${n.py}/${convs.length} ` +
            `(${n.pyRendered} rendered)` : `jinja2 not run: ${py.unavailable}`));
    for (const f of failures.slice(0, 5)) {
        console.log(`# conversation ${f.i} (${f.conv.kind}): ${f.why}`);
        console.log(`#   messages: ${JSON.stringify(f.conv.messages).slice(0, 400)} ` +
            `add_generation_prompt=${f.conv.add_generation_prompt}`);
        console.log(`#   expected: ${JSON.stringify(f.expected).slice(0, 600)}`);
        console.log(`#   C:        ${JSON.stringify(f.c).slice(0, 600)}`);
    }
    if (convs.length < a.min) {
        console.log(`# only ${convs.length} conversations, fewer than ${a.min}`);
        return 1;
    }
    return n.mismatched ? 1 : 0;
}

try {
    process.exitCode = main();
} catch (e) {
    process.stderr.write(`chat_template_compat: fatal: ${e.message}\n`);
    process.exitCode = 1;
}
