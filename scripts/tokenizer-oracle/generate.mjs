#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Generates llmkit's byte-level BPE test fixtures from the npm package
// llama3-tokenizer-js (MIT; the Llama 3 vocabulary, merges and a reference
// encoder):
//   tests/data/llama3-bpe-vocab.gguf    vocab-only GGUF (tokenizer.ggml.model = "gpt2", pre = "llama-bpe")
//   tests/data/llama3-bpe-corpus.jsonl  {"text", "ids"[, "special": true]} per line: the JS encoder's ids
//   tests/fuzz/gguf/tiny_bpe_vocab.gguf a tiny hand-made gpt2 vocabulary (fuzzer seed; test_tokenizer_bpe
//                                       checks its bytes equal what llmkit's gguf_writer writes for it)
// Run: cd scripts/tokenizer-oracle && npm ci && node generate.mjs
import { writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import llama3Tokenizer from 'llama3-tokenizer-js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');

// --- GGUF (version 3, metadata only) ---------------------------------------
const T = { u32: 4, i32: 5, bool: 7, string: 8, array: 9 };
class GgufWriter {
  constructor() { this.parts = []; this.n = 0; }
  str(s) { const b = Buffer.from(s, 'utf8'); const h = Buffer.alloc(8); h.writeBigUInt64LE(BigInt(b.length)); this.parts.push(h, b); }
  u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.parts.push(b); }
  key(k, type) { this.str(k); this.u32(type); ++this.n; }
  string(k, v) { this.key(k, T.string); this.str(v); }
  uint32(k, v) { this.key(k, T.u32); this.u32(v); }
  bool(k, v) { this.key(k, T.bool); this.parts.push(Buffer.from([v ? 1 : 0])); }
  strings(k, vs) {
    this.key(k, T.array); this.u32(T.string);
    const h = Buffer.alloc(8); h.writeBigUInt64LE(BigInt(vs.length)); this.parts.push(h);
    for (const v of vs) this.str(v);
  }
  int32s(k, vs) {
    this.key(k, T.array); this.u32(T.i32);
    const h = Buffer.alloc(8); h.writeBigUInt64LE(BigInt(vs.length)); this.parts.push(h);
    const b = Buffer.alloc(4 * vs.length); vs.forEach((v, i) => b.writeInt32LE(v, 4 * i)); this.parts.push(b);
  }
  bytes() {
    const h = Buffer.alloc(24);
    h.writeUInt32LE(0x46554747, 0); h.writeUInt32LE(3, 4); h.writeBigUInt64LE(0n, 8); h.writeBigUInt64LE(BigInt(this.n), 16);
    return Buffer.concat([h, ...this.parts]);
  }
}

// GGUF token types (llama.cpp): 1 normal, 3 control, 4 user defined.
const NORMAL = 1, CONTROL = 3;

// --- The Llama 3 vocabulary fixture ----------------------------------------
const tok = llama3Tokenizer;
const tokens = tok.vocabById;
const n_base = 128000;  // ids >= 128000 are the package's special tokens
const types = tokens.map((_, i) => (i < n_base ? NORMAL : CONTROL));
const merges = [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([m]) => m);
{
  const w = new GgufWriter();
  w.string('general.architecture', 'llama');
  w.string('general.name', 'Llama 3 tokenizer (llama3-tokenizer-js 1.2.0)');
  w.string('tokenizer.ggml.model', 'gpt2');
  w.string('tokenizer.ggml.pre', 'llama-bpe');
  w.strings('tokenizer.ggml.tokens', tokens);
  w.int32s('tokenizer.ggml.token_type', types);
  w.strings('tokenizer.ggml.merges', merges);
  w.uint32('tokenizer.ggml.bos_token_id', tok.getSpecialTokenId('<|begin_of_text|>'));
  w.uint32('tokenizer.ggml.eos_token_id', tok.getSpecialTokenId('<|end_of_text|>'));
  w.bool('tokenizer.ggml.add_bos_token', true);
  mkdirSync(join(root, 'tests/data'), { recursive: true });
  writeFileSync(join(root, 'tests/data/llama3-bpe-vocab.gguf'), w.bytes());
}

// --- A tiny hand-made gpt2 vocabulary (fuzzer seed) --------------------------
{
  // GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves,
  // the rest are shifted to U+0100 and up.
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const byteChar = [];
  let shifted = 0;
  for (let b = 0; b < 256; ++b) byteChar[b] = String.fromCodePoint(printable(b) ? b : 256 + shifted++);
  const small = [...byteChar, 'Ġt', 'he', 'Ġthe', 'Ġa', '<|bos|>', '<|eos|>', '<|user|>'];
  const smallTypes = small.map((t) => (t.startsWith('<|') ? CONTROL : NORMAL));
  smallTypes[small.indexOf('<|user|>')] = 4;  // user defined
  const w = new GgufWriter();
  w.string('general.architecture', 'llama');
  w.string('tokenizer.ggml.model', 'gpt2');
  w.string('tokenizer.ggml.pre', 'qwen2');
  w.strings('tokenizer.ggml.tokens', small);
  w.int32s('tokenizer.ggml.token_type', smallTypes);
  w.strings('tokenizer.ggml.merges', ['Ġ t', 'h e', 'Ġt he', 'Ġ a']);
  w.uint32('tokenizer.ggml.bos_token_id', small.indexOf('<|bos|>'));
  w.uint32('tokenizer.ggml.eos_token_id', small.indexOf('<|eos|>'));
  w.bool('tokenizer.ggml.add_bos_token', false);
  writeFileSync(join(root, 'tests/fuzz/gguf/tiny_bpe_vocab.gguf'), w.bytes());
}

// --- The corpus ---------------------------------------------------------------
let seed = 0x11a3a;
const random = () => {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const int = (n) => Math.floor(random() * n);
const pick = (xs) => xs[int(xs.length)];
const repeat = (n, f) => Array.from({ length: n }, f).join('');

const words = {
  english: ['the', 'The', 'THE', 'quick', 'brown', 'fox', 'jumps', 'over', 'lazy', 'dog', 'Lily', 'park', 'ball',
    'tokenizer', 'llama', 'Llama', 'inference', 'grabbed', 'running', 'unbelievable', 'a', 'I', 'it', 'Hello', 'world'],
  cjk: ['日本語', '東京', 'こんにちは', '世界', 'カタカナ', '中文', '你好', '镇', '한국어', '안녕하세요', '漢字', '学习'],
  arabic: ['مرحبا', 'العالم', 'اللغة', 'العربية', 'كتاب', 'سلام'],
  devanagari: ['नमस्ते', 'दुनिया', 'हिन्दी', 'भाषा', 'क्षत्रिय', 'संस्कृत'],
  cyrillic: ['Привет', 'мир', 'Москва', 'ЯЗЫК', 'ёжик', 'Україна', 'щука'],
  greek: ['Γειά', 'σου', 'Κόσμε', 'λόγος', 'ΑΘΗΝΑ', 'ψυχή'],
  other: ['Ꙋ', 'ß', 'Ñandú', 'Zürich', 'façade', 'naïve', 'Ωmega', 'ǅ', 'ﬁ', 'Ⅻ', '½', '²', '٣٤٥', '१२३', '𝔘𝔫𝔦'],
};
const emoji = ['🦙', '😀', '👍', '👍🏽', '👩‍💻', '👨‍👩‍👧‍👦', '🏳️‍🌈', '❤️', '🇯🇵', '🧑🏿‍🚀', '✋🏻', '🫶', '☕', '1️⃣', '©', '™'];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'x", "'"];
const punct = ['.', ',', '!', '?', ';', ':', '...', '—', '–', '-', '(', ')', '[', ']', '{', '}', '"', '«', '»', '¿', '¡',
  '#', '@', '$', '%', '^', '&', '*', '+', '=', '<', '>', '/', '\\', '|', '~', '`', '_', '。', '、', '！', '؟', '।'];
const spaces = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\r\n', '\r\n\r\n', ' \n', '\n ', '\u00a0', '\u3000',
  '\u2003', '\u000b', '\f', '\r', ' \t \n'];
const code = [
  'int main() {\n  return 0;\n}\n',
  'for (int i = 0; i < n; ++i) sum += a[i] * b[i];',
  'def f(x):\n    return x ** 2  # square\n',
  'const xs = [1, 2, 3].map((x) => x * 2);',
  '#include <vector>\nstd::vector<int> v{1,2,3};',
  'if x != None and y >= 10:\n\tprint(f"{x=}")',
  "SELECT name, COUNT(*) FROM users WHERE id > 100 GROUP BY name;",
  '<div class="a">Hello&nbsp;world</div>',
  '{"key": [1, 2.5, -3e10], "nested": {"ok": true}}',
  '    indented_line = other_line  \r\n',
  "fn main() { println!(\"{}\", 0x1F_u8); }",
  '$ ls -la /usr/bin | grep -v "^d" > out.txt 2>&1',
];
const number = () => {
  const len = 1 + int(14);
  let s = repeat(len, () => String(int(10)));
  if (random() < 0.2) s += '.' + repeat(1 + int(4), () => String(int(10)));
  if (random() < 0.1) s = s.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  if (random() < 0.1) s = '-' + s;
  return s;
};
const word = () => pick(words[pick(Object.keys(words))]);
const piece = () => {
  const r = random();
  if (r < 0.35) return word();
  if (r < 0.45) return number();
  if (r < 0.55) return pick(emoji);
  if (r < 0.65) return pick(contractions);
  if (r < 0.8) return pick(punct);
  if (r < 0.97) return pick(spaces);
  return pick(code);
};
const sentence = (n) => {
  let s = '';
  for (let i = 0; i < n; ++i) {
    s += piece();
    if (random() < 0.6) s += ' ';
  }
  return s;
};

const corpus = new Set();
const add = (s) => { if (s.length > 0) corpus.add(s); };
// Hand-picked edge cases.
for (const s of ['grabbed', ' grabbed', '           grabbed', '\n', ' \n', '\ttabs\t\t\t\tout here', 'ax\n####\nboo',
  '镇', '🦙', '🦙Ꙋ', 'Ꙋ🦙', 'This is a test sentence.', "I'm", "I'M", "you'LL", "it'S", "they'd've", "'s", "''s",
  ' ', '  ', '\t', '\r\n', 'a\r\nb', 'a  \r\n  b', 'trailing   ', '   leading', 'x \n\n y', '\n\n\n', ' \n \n ',
  '1', '12', '123', '1234', '12345', '123456', '1234567', '12345678901234567890', '3.14159', '1,000,000', 'a1b22c333',
  '٣٤٥٦', '१२३४५', 'Ⅻ½²', '$100', '100%', '2024-12-03', '0x7fffffff', 'hello world', 'Hello World!', 'HELLO',
  '👨‍👩‍👧‍👦', '👍🏽👍🏿', '🏳️‍🌈🏳️‍⚧️', 'e\u0301', 'n\u0303o', '\u200b', 'a\u200db', '\ufeffBOM', '\u00a0\u00a0x',
  '日本語のテキスト', 'مرحبا بالعالم', 'नमस्ते दुनिया', 'Привет, мир!', 'Γειά σου Κόσμε', '<|not_special|>',
  '<|begin_of_text', 'begin_of_text|>', '<| eot_id |>']) add(s);
for (const group of Object.values(words)) for (const w of group) { add(w); add(' ' + w); add(w + ' ' + w); }
for (const e of emoji) { add(e); add(' ' + e); add(e + e); }
for (const c of code) add(c);
for (const c of contractions) { add('word' + c); add('WORD' + c + ' next'); add(c + c); }
for (let n = 1; n <= 30; ++n) { add(repeat(n, (_, i) => String((i * 7 + 3) % 10))); add('x' + repeat(n, () => ' ') + 'y'); add(repeat(n, () => '\n')); }
for (let i = 0; i < 200; ++i) add(number());
for (let i = 0; i < 600; ++i) add(sentence(1 + int(4)));
for (let i = 0; i < 2600; ++i) add(sentence(2 + int(24)));
for (let i = 0; i < 300; ++i) add(repeat(1 + int(6), () => pick(spaces)) + word() + repeat(1 + int(6), () => pick(spaces)));
for (let i = 0; i < 300; ++i) add(repeat(1 + int(8), () => pick([...punct, ...spaces, ...contractions])));
for (let i = 0; i < 100; ++i) add(repeat(8 + int(40), () => String.fromCodePoint(0x20 + int(0x2fe0))).replace(/[\ud800-\udfff]/g, ''));

// The package always parses its special tokens: plain lines must not contain any.
const special = /<\|(?:begin_of_text|end_of_text|start_header_id|end_header_id|eot_id|eom_id|python_tag|finetune_right_pad_id|reserved_special_token_\d+)\|>/;
// The package splits with ECMAScript's \s, which differs from the Unicode
// White_Space of the reference tokenizers (and llmkit) on U+0085 and U+FEFF:
// texts with those are left out (tests/test_tokenizer_bpe.cpp has its own cases).
const jsOnlySpace = /[\u0085\ufeff]/;
const lines = [];
for (const text of corpus) {
  if (special.test(text) || jsOnlySpace.test(text)) continue;
  lines.push(JSON.stringify({ text, ids: tok.encode(text, { bos: false, eos: false }) }));
}
// Lines with special tokens, compared with special-token parsing turned on.
const specials = ['<|begin_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>', '<|python_tag|>',
  '<|reserved_special_token_17|>', '<|end_of_text|>'];
for (let i = 0; i < 60; ++i) {
  const text = sentence(1 + int(5)) + pick(specials) + sentence(int(5)) + (random() < 0.5 ? pick(specials) : '');
  lines.push(JSON.stringify({ text, ids: tok.encode(text, { bos: false, eos: false }), special: true }));
}
lines.push(JSON.stringify({ text: '<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
  ids: tok.encode('<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>', { bos: false, eos: false }), special: true }));
writeFileSync(join(root, 'tests/data/llama3-bpe-corpus.jsonl'), lines.join('\n') + '\n');
console.log(`wrote tests/data/llama3-bpe-vocab.gguf (${tokens.length} tokens, ${merges.length} merges), ` +
  `tests/data/llama3-bpe-corpus.jsonl (${lines.length} lines), tests/fuzz/gguf/tiny_bpe_vocab.gguf`);
