// SPDX-License-Identifier: MIT
// llmkit-server's tool calls through the official `openai` npm client: a
// required call, a named call and a streamed call, each call's arguments
// parsed as JSON and checked against its tool's schema; then a conversation
// that carries the call and its result back. Run by run_client_test.sh
// against a server started with --chat-template qwen2.5 (Hermes-style
// <tool_call> blocks) on stories260K, whose own GGUF has no template:
//   node tools.mjs http://127.0.0.1:PORT/v1
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.argv[2];
assert.ok(baseURL, 'usage: node tools.mjs BASE_URL');
const client = new OpenAI({ baseURL, apiKey: 'test-key', timeout: 60_000, maxRetries: 0 });

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['celsius', 'fahrenheit'] } },
        required: ['city', 'unit'], additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add', description: 'Adds two small numbers',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: 0, maximum: 99 }, b: { type: 'integer', minimum: 0, maximum: 99 } },
        required: ['a', 'b'],
      },
    },
  },
];

// The checks of these two schemas (the keywords they use), by hand.
function validate(name, args) {
  assert.equal(typeof args, 'object');
  assert.ok(args !== null && !Array.isArray(args), `${name}: arguments are not an object`);
  if (name === 'get_weather') {
    assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
    assert.equal(typeof args.city, 'string');
    assert.ok([...args.city].length <= 16, `city too long: ${args.city}`);
    assert.ok(['celsius', 'fahrenheit'].includes(args.unit), `unit ${args.unit}`);
  } else if (name === 'add') {
    for (const k of ['a', 'b']) {
      assert.ok(Number.isInteger(args[k]) && args[k] >= 0 && args[k] <= 99, `${k} = ${args[k]}`);
    }
    assert.deepEqual(Object.keys(args).filter((k) => k !== 'a' && k !== 'b'), []);
  } else {
    assert.fail(`unknown function ${name}`);
  }
}

function checkCalls(message, onlyName) {
  assert.ok(Array.isArray(message.tool_calls) && message.tool_calls.length > 0, 'no tool_calls');
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function');
    assert.ok(typeof call.id === 'string' && call.id.length > 0);
    if (onlyName) assert.equal(call.function.name, onlyName);
    validate(call.function.name, JSON.parse(call.function.arguments));
  }
}

const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

// A required call (whole answer under the call grammar), at temperature 1, several seeds. One call
// per answer (parallel_tool_calls: false) ends the grammar, so the answer ends with it: max_tokens
// is left to the rest of the context, which the tools' system prompt fills for the most part
// (stories260K holds 512 tokens).
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({
    model: 'stories260K', messages, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed,
  });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  checkCalls(r.choices[0].message);
  console.log(`required (seed ${seed}): ${JSON.stringify(r.choices[0].message.tool_calls)}`);
}

// A named call, one call only.
const named = await client.chat.completions.create({
  model: 'stories260K', messages, tools, tool_choice: { type: 'function', function: { name: 'add' } },
  parallel_tool_calls: false, temperature: 1, seed: 4,
});
assert.equal(named.choices[0].finish_reason, 'tool_calls');
checkCalls(named.choices[0].message, 'add');
assert.equal(named.choices[0].message.tool_calls.length, 1);
console.log(`named: ${JSON.stringify(named.choices[0].message.tool_calls)}`);

// A streamed call: the deltas add up to the non-streamed answer of the same seed.
const request = {
  model: 'stories260K', messages, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed: 5,
};
const stream = await client.chat.completions.create({ ...request, stream: true });
const calls = [];
let finish = null;
let argumentChunks = 0;
for await (const chunk of stream) {
  for (const choice of chunk.choices) {
    if (choice.finish_reason) finish = choice.finish_reason;
    for (const d of choice.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.index, calls.length, 'calls announced out of order');
        calls.push({ id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } });
      }
      assert.ok(d.index < calls.length, 'arguments before the call was announced');
      calls[d.index].function.arguments += d.function?.arguments ?? '';
      if (d.function?.arguments) ++argumentChunks;
    }
  }
}
assert.equal(finish, 'tool_calls');
checkCalls({ tool_calls: calls });
assert.ok(argumentChunks >= 2, `arguments came in ${argumentChunks} chunks`);
const same = await client.chat.completions.create(request);
assert.deepEqual(calls, same.choices[0].message.tool_calls, 'streamed calls differ from the non-streamed answer');
console.log(`streamed (${argumentChunks} argument chunks): ${JSON.stringify(calls)}`);

// The call and its result in the history, then "auto": free text (stories260K never opens a <tool_call>).
const followUp = await client.chat.completions.create({
  model: 'stories260K', tools, tool_choice: 'auto', temperature: 0, max_tokens: 8,
  messages: [...messages, same.choices[0].message,
    { role: 'tool', tool_call_id: same.choices[0].message.tool_calls[0].id, content: '{"temperature": 21}' }],
});
assert.ok(['stop', 'length'].includes(followUp.choices[0].finish_reason));
assert.equal(typeof followUp.choices[0].message.content, 'string');

// Bad input: a tool_choice naming no tool, a parameters schema the converter refuses.
await assert.rejects(
  client.chat.completions.create({ model: 'stories260K', messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
  (err) => err instanceof OpenAI.BadRequestError && err.param === 'tool_choice' && /nope/.test(err.message),
);
await assert.rejects(
  client.chat.completions.create({
    model: 'stories260K', messages,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'array', uniqueItems: true } } } } }],
  }),
  (err) => err instanceof OpenAI.BadRequestError && err.param === 'tools' && /uniqueItems/.test(err.message),
);
console.log('openai client tools: all checks passed');
