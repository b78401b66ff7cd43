#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Writes tests/data/o200k-split-corpus.jsonl: {"text", "pieces"} per line, the
// pieces JavaScript's own regex engine cuts with GPT-4o's o200k split regex
// (tiktoken's o200k_base; tokenizer.ggml.pre "gpt-4o"), the oracle of
// llmkit's hand-written pre_tokenize_o200k. Two spellings differ from the
// original only where ECMAScript needs them: (?i:...) is spelled out in
// ASCII classes (node 20 has no inline flags; llmkit folds ASCII only) and
// \s / \S are Unicode White_Space (ECMAScript's \s differs on U+0085, U+FEFF).
// Run from anywhere: node scripts/tokenizer-oracle/o200k-split.mjs (no npm packages).
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const S = '\\p{White_Space}';
const C = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
const split = new RegExp(
  [
    `[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+${C}`,
    `[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*${C}`,
    `\\p{N}{1,3}`,
    ` ?[^${S}\\p{L}\\p{N}]+[\\r\\n/]*`,
    `[${S}]*[\\r\\n]+`,
    `[${S}]+(?![^${S}])`,
    `[${S}]+`,
  ].join('|'),
  'gu');
const pieces = (text) => {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(split)) {
    if (m.index !== at) throw new Error(`gap at ${at} in ${JSON.stringify(text)}`);
    out.push(m[0]);
    at += m[0].length;
  }
  if (at !== text.length) throw new Error(`unsplit tail in ${JSON.stringify(text)}`);
  return out;
};

let seed = 0x40200;
const random = () => {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const int = (n) => Math.floor(random() * n);
const pick = (xs) => xs[int(xs.length)];

const hand = [
  'camelCaseWords and PascalCase, HTTPServer, getHTTPResponse, iPhone',
  "DON'T you'RE I'M we'll THEY'VE it's O'Neil 'tis ''s",
  'e\u0301te\u0301 cafe\u0301 Cafe\u0301 \u0301alone \u0301A x\u0301\u0302y',
  '\u01c5ungla \u01c4UNGLA \u01c6ungla Title\u01c5Case',
  'नमस्ते दुनिया हिन्दी', 'ภาษาไทย ไม่มีช่องว่าง', '日本語のテキストと漢字', '한국어 텍스트',
  'Привет Мир ПРИВЕТмир', 'Ελληνικά ΑΘΗΝΑ αθήνα', 'مرحبا بالعالم', 'שלום עולם',
  '1234567 12 3.14159 ١٢٣٤٥ ½ ²³', 'a/b/c http://x.y/z\n/\n//\r\n/ ./run.sh',
  '  leading\ttabs\t\tand  double  spaces   \n\n\r\n  \n', 'end with spaces   ', '\u00a0nbsp\u00a0\u2003em',
  '👍🏽 👨‍👩‍👧 🇫🇷 emoji👍', '!!! ??? ... --- ***\n', ' !x !X ¡Hola!', '__init__ self._x = X_Y',
  '<|endoftext|> <tag attr="v">Body</tag>', '\u0085next\ufeffbom', 'ＦＵＬＬｗｉｄｔｈ ＡＢＣ',
];

const pools = {
  upper: 'ABCDEFGHIJKLMNOPQRSTUVWXYZÀÉÎÕÜΑΒΓΔЖЗИЙ\u01c5\u1f88',
  lower: 'abcdefghijklmnopqrstuvwxyzàéîõüαβγδжзий\u00df',
  caseless: 'あいうえお漢字中文한국\u02b0\u02b2\u05d0\u0627\u0915',
  mark: '\u0301\u0302\u0308\u093e\u094d\u0e31\u20dd',
  number: '0123456789٣٤²½Ⅻ',
  space: '    \t\n\r\u00a0\u2003\u3000',
  other: "!?.,;:'\"/\\()[]{}<>@#$%^&*-_=+|~`€😀👍",
};
const kinds = Object.keys(pools);
const charOf = (k) => pick([...pools[k]]);
const words = ['the', 'The', 'THE', "don't", "CAN'T", 'camelCase', 'XMLHttp', 'naïve', 'über', 'x/y', '2024'];

const corpus = new Set(hand);
for (let i = 0; i < 1500; ++i) {
  let s = '';
  const n = 1 + int(24);
  for (let j = 0; j < n; ++j) s += random() < 0.15 ? pick(words) : charOf(pick(kinds));
  corpus.add(s);
}
for (let i = 0; i < 300; ++i) {  // runs of one kind next to another: the backtracking cases
  let s = '';
  const n = 1 + int(4);
  for (let j = 0; j < n; ++j) {
    const k = pick(kinds);
    const len = 1 + int(6);
    for (let r = 0; r < len; ++r) s += charOf(k);
  }
  corpus.add(s);
}

const lines = [...corpus].map((text) => JSON.stringify({ text, pieces: pieces(text) }));
const out = join(root, 'tests/data/o200k-split-corpus.jsonl');
writeFileSync(out, lines.join('\n') + '\n');
console.log(`wrote ${out}: ${lines.length} strings`);
