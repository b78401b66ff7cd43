#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Renders gpt-oss chats with tools (tool definitions, assistant tool_calls,
// tool results) through gpt-oss's own Jinja chat template with
// @huggingface/jinja (trim_blocks and lstrip_blocks, as transformers renders
// it), for llmkit's byte-for-byte test of chat::format_with_tools on the
// harmony family:
//   tests/data/harmony-tools-rendered.json
//     {"date": D, "cases": [{"name", "messages", "tools", "add_generation_prompt", "reasoning_effort", "text"}]}
// Messages are in OpenAI's shape (call arguments as JSON strings); they are
// rendered with the arguments parsed to objects, as vLLM and llama.cpp pass
// them to templates. The template is not part of llmkit: pass the
// chat_template.jinja of openai/gpt-oss-20b or -120b (Hugging Face).
// Run: cd scripts/harmony-oracle && npm ci && node render-tools.mjs path/to/chat_template.jinja
import { Template } from '@huggingface/jinja';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
if (!process.argv[2]) throw new Error('usage: node render-tools.mjs path/to/chat_template.jinja');
const template = new Template(readFileSync(process.argv[2], 'utf8'));

const fn = (name, description, parameters) => ({ type: 'function', function: { name, description, ...(parameters ? { parameters } : {}) } });
const weather = [fn('get_weather', 'Weather in a city', {
  type: 'object',
  properties: {
    location: { type: 'string', description: 'The city, e.g. Paris' },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'], default: 'celsius' },
  },
  required: ['location'],
})];
const varied = [
  fn('add', 'Adds two numbers', {
    type: 'object',
    properties: { a: { type: 'integer' }, b: { type: 'number', default: 1.5 }, exact: { type: 'boolean', default: false } },
    required: ['a'],
  }),
  fn('send_mail', 'Sends a mail', {
    type: 'object',
    properties: {
      to: { type: 'array', items: { type: 'string' }, description: 'Addresses' },
      counts: { type: 'array', items: { type: 'integer' } },
      flags: { type: 'array', items: { type: 'boolean' } },
      cc: { type: 'array', items: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] } },
      tags: { type: 'array', nullable: true },
      subject: { type: 'string', nullable: true },
      meta: { type: 'object', properties: { x: { type: 'integer' }, y: { type: 'string', enum: ['a', 'b'] } }, required: ['x'] },
      blob: { type: 'object' },
      kind: { type: ['string', 'null'] },
      level: { oneOf: [{ type: 'string' }, { type: 'number', description: 'a number' }] },
      shape: { oneOf: [{ type: 'object' }, { type: 'string' }] },
      priority: { type: 'string', enum: ['low', 'high'], default: 'low' },
      anything: {},
    },
    required: ['to', 'meta'],
  }),
  fn('ping', 'Checks the service'),
  fn('noop', 'Does nothing', { type: 'object', properties: {} }),
];

const sys = { role: 'system', content: 'Be brief.' };
const ask = { role: 'user', content: 'Weather in Paris?' };
const call = (content, ...calls) => ({
  role: 'assistant', content,
  tool_calls: calls.map(([id, name, args]) => ({ id, type: 'function', function: { name, arguments: args } })),
});
const result = (id, content) => ({ role: 'tool', tool_call_id: id, content });
const cases = [
  ['tools', [ask], weather, true],
  ['tools_system', [sys, ask], weather, true],
  ['tools_varied', [sys, { role: 'user', content: 'Mail Bob' }], varied, true],
  ['call_result', [ask, call('', ['call_1', 'get_weather', '{"location":"Paris"}']), result('call_1', '{"temp": 21}')], weather, true],
  ['call_with_thought', [sys, ask, call('I should check the weather.', ['call_1', 'get_weather', '{"location": "Paris", "unit": "celsius"}']),
    result('call_1', 'sunny, 21 C')], weather, true],
  ['call_then_final', [ask, call('Let me look.', ['call_1', 'get_weather', '{"location":"Paris"}']), result('call_1', '21'),
    { role: 'assistant', content: 'It is 21 C in Paris.' }, { role: 'user', content: 'And in Oslo?' }], weather, true],
  ['two_calls', [ask, call('', ['c1', 'get_weather', '{"location":"Paris"}']), result('c1', '21'),
    call('', ['c2', 'get_weather', '{"location":"Oslo","unit":"fahrenheit"}']), result('c2', '50')], weather, true],
  ['call_nested_args', [{ role: 'user', content: 'Mail Bob' }, call('', ['m', 'send_mail', '{"to": ["bob@x.org"], "meta": {"x": 1, "y": "a"}, "cc": [{"name": "Ann"}], "n": 2.5, "ok": true, "none": null}']),
    result('m', 'sent "ok"\nline <2> é ✓')], varied, true],
  ['history_without_tools', [ask, call('', ['call_1', 'get_weather', '{"location":"Paris"}']), result('call_1', '21')], undefined, true],
  ['final_without_prompt', [ask, call('', ['call_1', 'get_weather', '{"location":"Paris"}']), result('call_1', '21'),
    { role: 'assistant', content: 'It is 21 C.' }], weather, false],
  ['no_prompt_after_result', [sys, ask, call('', ['call_1', 'get_weather', '{}']), result('call_1', '21')], weather, false],
  ['high_effort', [sys, ask], weather, true, 'high'],
  ['low_effort_call', [ask, call('', ['call_1', 'get_weather', '{"location":"Paris"}']), result('call_1', '21')], varied, true, 'low'],
];

const out = { date: new Date().toISOString().slice(0, 10), cases: [] };
for (const [name, messages, tools, add_generation_prompt, reasoning_effort] of cases) {
  const rendered = messages.map((m) => m.tool_calls ? {
    ...m, tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } })),
  } : m);
  const text = template.render({ messages: rendered, tools, add_generation_prompt, reasoning_effort });
  out.cases.push({ name, messages, tools: tools ?? [], add_generation_prompt, reasoning_effort: reasoning_effort ?? 'medium', text });
}
writeFileSync(join(root, 'tests/data/harmony-tools-rendered.json'), JSON.stringify(out, null, 1) + '\n');
