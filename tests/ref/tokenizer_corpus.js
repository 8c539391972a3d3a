#!/usr/bin/env node
// Writes the tokenizer test corpus: JSON lines {"text": "..."}, the same bytes on every run
// (a seeded generator, no clock, no locale). tests/ref/tokenizer_compat.js runs it through the
// C tokenizer and Hugging Face's reference.
//
//   node tests/ref/tokenizer_corpus.js [--out FILE] [--seed N] [--random N]
//
// The corpus holds hand-picked cases in families (prose, accents, CJK, RTL, emoji, numbers,
// whitespace, code, contractions, odd but valid Unicode, every model's special tokens and near
// misses), each family's cases varied, then --random N (default 1200) strings that mix pieces
// of all families. Every string is valid UTF-16 without lone surrogates, so it is valid UTF-8.
'use strict';
const fs = require('fs');

function parseArgs(argv) {
    const o = {out: null, seed: 20240611, random: 1200};
    for (let i = 2; i < argv.length; i++) {
        const a = argv[i];
        if (a === '--out') o.out = argv[++i];
        else if (a === '--seed') o.seed = Number(argv[++i]);
        else if (a === '--random') o.random = Number(argv[++i]);
        else if (a === '-h' || a === '--help') {
            console.log('usage: tokenizer_corpus.js [--out FILE] [--seed N] [--random N]');
            process.exit(0);
        } else {
            console.error(`tokenizer_corpus: unexpected argument '${a}'`);
            process.exit(100);
        }
    }
    if (!Number.isInteger(o.seed) || !Number.isInteger(o.random) || o.random < 0) {
        console.error('tokenizer_corpus: --seed and --random take integers');
        process.exit(100);
    }
    return o;
}

// mulberry32: small, fast, and the same everywhere.
function rng(seed) {
    let a = seed >>> 0;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const cp = (...xs) => String.fromCodePoint(...xs);

const WORDS = ('the quick brown fox jumps over lazy dog a an of to in is it that was for on are ' +
    'with as his they at be this have from or one had by word but not what all were we when ' +
    'your can said there use each which she do how their if will up other about out many then ' +
    'them these so some her would make like him into time has look two more write go see ' +
    'number no way could people my than first water been call who oil its now find long down ' +
    'day did get come made may part tokenizer adapter LoRA GPU kernel batch latency throughput ' +
    'Hello World OpenAI HuggingFace NASA iPhone McDonald JavaScript x86_64 e-mail co-operate')
    .split(' ');

const FAMILIES = {
    prose: [
        'Hello world', 'Hello, world!', 'The quick brown fox jumps over the lazy dog.',
        'HELLO WORLD', 'hello', 'Hello', ' Hello', 'Hello ', 'a', 'I', 'A.B.C.', 'e.g. i.e. etc.',
        'Mr. Smith went to Washington; he said: "no!"', 'What?! Really... (yes) [no] {maybe}',
        'snake_case camelCase PascalCase kebab-case SCREAMING_CASE',
        'https://example.com/path?query=1&b=2#frag', 'user@example.org', '#hashtag @mention',
        '100% of $5.00 is 5 dollars & 0 cents ~ ^ * + = | \\ / < > `backticks`',
        '--- *** ___ ... ??? !!! ,,, ;;; ::: """ \'\'\'',
    ],
    accents: [
        'café', 'cafe\u0301', 'naïve', 'nai\u0308ve', 'résumé', 're\u0301sume\u0301',
        'Ångström', 'A\u030angstro\u0308m', 'Ærøskøbing', 'Zürich', 'Zu\u0308rich',
        'Crème brûlée', 'São Paulo', 'Dvořák', 'Dvor\u030ca\u0301k', 'Łódź', 'İstanbul', 'ışık',
        'Straße', 'STRASSE', 'ﬁ ﬂ ﬀ', 'ǅ ǈ ǋ', 'Ωmega ω ϖ', 'Ελληνικά', 'Русский язык',
        'Українська', 'ქართული', 'Հայերեն', 'हिन्दी', 'தமிழ்', 'ไทย ภาษา', 'Tiếng Việt',
        'Tie\u0302\u0301ng Vie\u0323\u0302t', 'ḱṷṓn', 'x\u0327\u0301\u0300\u0302',
    ],
    cjk: [
        '你好，世界！', '我爱自然语言处理。', '中华人民共和国', '繁體中文測試', '𠀀𠀁𠀂 extension B',
        'こんにちは世界', 'カタカナとひらがなと漢字', 'ｶﾀｶﾅ half-width', '東京都渋谷区',
        'ＡＢＣ１２３ full-width', '안녕하세요 세계', '한국어 텍스트', '한국어'.normalize('NFD'),
        '日本語と English mixed 中文', '「引用」『二重』【括弧】', '〇一二三四五六七八九十',
    ],
    rtl: [
        'مرحبا بالعالم', 'السلام عليكم', 'العربية ١٢٣٤٥٦٧٨٩٠', 'שלום עולם', 'עברית עם ניקוד: שָׁלוֹם',
        '\u200fRTL mark\u200f', '\u200eLTR mark\u200e', '\u202bembedded\u202c', '\u2067isolate\u2069',
        'mixed English و عربي', 'فارسی ۱۲۳', 'اردو زبان',
    ],
    emoji: [
        '😀', '😀😃😄', '👍🏽', '👍🏻👍🏼👍🏽👍🏾👍🏿', '👨‍👩‍👧‍👦', '👩🏽‍💻', '🏳️‍🌈', '🇯🇵🇺🇸🇫🇷',
        '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '1️⃣ #️⃣ *️⃣', '❤️ ❤︎', '☺️', 'I ❤ NY', '🤖 robots 🚀🚀', '🧑‍🤝‍🧑', '🫠🫡🫶',
        'emoji at end 🎉', '🎉 emoji at start',
    ],
    numbers: [
        '0', '1', '12', '123', '1234', '12345', '123456789012345678901234567890', '3.14159',
        '-2.5e-10', '1,000,000', '1.000.000,00', '$1,234.56', '50%', '2024-06-11', '12:34:56',
        '+1 (555) 123-4567', '0x1F 0b1010 0o777', 'v1.2.3', '1st 2nd 3rd 4th', '٣ ۴ ५ ௫ 五',
        '½ ¾ ⅓ ² ³ ①②③', 'IV XII MMXXIV Ⅻ', '007', '0000000000', '9' .repeat(40),
    ],
    whitespace: [
        ' ', '  ', '   ', '\t', '\n', '\r\n', '\n\n', '\n\n\n', ' \n ', '\t\t\tindented',
        'trailing   ', '   leading', '  both  ', 'a  b   c    d', 'tab\there', 'line1\nline2',
        'line1\r\nline2\r\n', 'para1\n\n\npara2', 'nbsp\u00a0here', 'ideographic\u3000space',
        'thin\u2009space', 'en\u2002em\u2003', '\u205fmath space', 'mongolian\u180evowel',
        'nel\u0085line', 'ls\u2028ps\u2029', 'vt\u000bff\u000c', ' \t \n \r ', '\u00a0\u00a0',
        'end with newline\n', '\n start with newline', 'x \n y', 'x\n y', 'x \ny',
    ],
    code: [
        'def f(x):\n    return x * 2\n', 'for i in range(10):\n\tprint(i)\n',
        'class Foo(Bar):\n    """Doc."""\n\n    def __init__(self):\n        self.x = {"a": 1}\n',
        '#include <stdio.h>\n\nint main(void)\n{\n    printf("hi\\n");\n    return 0;\n}\n',
        'static int x[4] = {1, 2, 3, 4}; /* comment */ // line\n',
        'if (a && b || !c) { x += 1; } else { x -= 1; }',
        '{"key": "value", "n": [1, 2.5, -3], "nested": {"t": true, "f": false, "z": null}}',
        '{\n  "a": 1,\n  "b": [\n    "x",\n    "y"\n  ]\n}',
        '<html><body><p class="x">Hi &amp; bye</p></body></html>', 'SELECT * FROM t WHERE id = 1;',
        'fn main() -> Result<(), Box<dyn Error>> { Ok(()) }', '$ ls -la | grep ^d && echo ok',
        'x = lambda a, b: a ** b  # power', '    ', '\t\t', 'a\tb\tc\n1\t2\t3',
        '```python\nprint("x")\n```', '@decorator\ndef g(*args, **kwargs): ...',
    ],
    contractions: [
        "it's", "IT'S", "It'S", "don't", "DON'T", "we're", "WE'RE", "they've", "I'm", "I'M",
        "you'll", "YOU'LL", "he'd", "HE'D", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
        "rock 'n' roll", "'quoted'", "o'clock", "y'all'd've", "it’s curly", "don’t", "Tom's",
        "the dogs' bones", "'''triple'''", "x's y'S z'Ll", "''", "'", "'s's's",
    ],
    oddities: [
        '\ufffd', 'a\ufffdb', '\u0301 lone combining', '\u0301', '\u0300\u0301\u0302', 'e\u20dd',
        'text\ufe0f', '\ufe0e', 'vs17\u{e0100}', 'zw\u200dj', 'zw\u200cnj', '\u200b zero width',
        '\ufeffBOM', 'private \ue000\uf8ff', cp(0xf0000, 0x10fffd), 'nonchar \ufffe\uffff',
        '\ufdd0\ufdef', cp(0x1fffe, 0x10ffff), 'soft\u00adhyphen', '\u0000nul', 'ctrl\u0001\u001f',
        '\u007f del', '\u00ad', 'tag chars ' + cp(0xe0041, 0xe0042, 0xe007f), 'ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕',
        '𝐁𝐨𝐥𝐝', 'Ⓒ ⓒ ㊙', '℃ ℉ № ™', 'ﷺ', 'ﷻ', 'Å Å', '\u212b\u2126\u212a', 'ǰ\u0323',
        'ᄀ\u1161\u11a8', '\u1100\u1161', 'Ⅻ ⅻ', 'ꙮ', '҈҈', 'ส\u0e31\u0e49', 'ـــ',
    ],
    special: [
        '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|begin_of_text|>', '<|end_of_text|>',
        '<|eot_id|>', '<|start_header_id|>user<|end_header_id|>', '<s>', '</s>', '<unk>',
        '<think>', '</think>', '<tool_call>', '<|fim_prefix|>', '<|reserved_special_token_5|>',
        '<s>Hello</s>', '<s> Hello</s>', 'Hello<s>world', 'Hello <s> world', '<s><s></s></s>',
        '<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n',
        '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>',
        '<|im_start', 'im_start|>', '<|im_start |>', '< s>', '<s >', '<<s>>', '</s', 's>', '<|',
        '|>', '<|endoftext|><|endoftext|>', 'x<|endoftext|>y', ' <|im_end|> ', '<|IM_START|>',
        '<think>\nreasoning\n</think>\n\nanswer', '<unk><unk>', '<0x41>', '<0xFF>', '▁', '▁▁x',
        'Ġ', 'Ċ', 'ĠĠ',
    ],
};

// Character pools for generated text: long-assigned blocks only (PCRE2's and Oniguruma's
// Unicode versions differ on recent additions, which is not what this corpus tests).
const RANGES = [
    [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x17f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
    [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x3040, 0x30ff], [0x4e00, 0x9fff],
    [0xac00, 0xd7a3], [0x2000, 0x206f], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f],
    [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x20000, 0x2a6df], [0x0300, 0x036f],
];

function randomChars(r, n) {
    let s = '';
    for (let i = 0; i < n; i++) {
        const [lo, hi] = RANGES[Math.floor(r() * RANGES.length)];
        s += cp(lo + Math.floor(r() * (hi - lo + 1)));
    }
    return s;
}

function sentence(r, n) {
    const w = [];
    for (let i = 0; i < n; i++) {
        let x = WORDS[Math.floor(r() * WORDS.length)];
        const c = r();
        if (c < 0.1) x = x.toUpperCase();
        else if (c < 0.25) x = x[0].toUpperCase() + x.slice(1);
        w.push(x);
    }
    const seps = [' ', ' ', ' ', ' ', ', ', '. ', '  ', '\n', '; ', ' - '];
    let s = w[0];
    for (let i = 1; i < w.length; i++) s += seps[Math.floor(r() * seps.length)] + w[i];
    return s + ['.', '!', '?', '', '...', '\n'][Math.floor(r() * 6)];
}

const pick = (r, xs) => xs[Math.floor(r() * xs.length)];

// Variations of one case that exercise the pre-tokenizers' context rules.
function variants(s) {
    return [s, ' ' + s, s + ' ', 'x' + s + 'y', s + '\n', 'Text: ' + s + ' end.', s + s];
}

function corpus(o) {
    const r = rng(o.seed);
    const out = [''];
    for (const cases of Object.values(FAMILIES))
        for (const s of cases) out.push(...variants(s));
    for (let b = 0; b < 256; b++) out.push(cp(b)); // every one-byte and Latin-1 character
    for (let n = 1; n <= 40; n++) out.push(sentence(r, n));
    for (let n = 1; n <= 17; n++) out.push(' '.repeat(n) + 'x' + ' '.repeat(n), '\n'.repeat(n));
    for (let n = 1; n <= 12; n++) out.push('1'.repeat(n), randomChars(r, n * 3));
    const all = Object.values(FAMILIES).flat();
    const joins = ['', ' ', '\n', '  ', '\t', ', ', '<s>', '<|im_end|>', '\u200d', '\u3000'];
    for (let i = 0; i < o.random; i++) {
        const parts = [];
        const k = 1 + Math.floor(r() * 6);
        for (let j = 0; j < k; j++) {
            const c = r();
            if (c < 0.45) parts.push(pick(r, all));
            else if (c < 0.7) parts.push(sentence(r, 1 + Math.floor(r() * 12)));
            else if (c < 0.85) parts.push(randomChars(r, 1 + Math.floor(r() * 10)));
            else parts.push(String(Math.floor(r() * 1e9)) + pick(r, ['', '.5', ',000', 'e3']));
        }
        let s = parts[0];
        for (let j = 1; j < parts.length; j++) s += pick(r, joins) + parts[j];
        out.push(s);
    }
    return out;
}

function main() {
    const o = parseArgs(process.argv);
    const lines = corpus(o).map((text) => JSON.stringify({text})).join('\n') + '\n';
    if (o.out) fs.writeFileSync(o.out, lines);
    else process.stdout.write(lines);
}

main();
