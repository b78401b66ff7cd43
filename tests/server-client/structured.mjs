// SPDX-License-Identifier: MIT
// Structured outputs of llmkit-server checked by the `ajv` validator: for
// each JSON Schema of a suite (required fields, enums, arrays with
// minItems / maxItems, nested objects, anyOf, patterns, formats, integer
// ranges, tuples, nullable unions), samples at temperature 1 on stories260K
// through /v1/chat/completions (the `openai` client, response_format
// json_schema) and /v1/completions (llama-server's json_schema field); each
// must finish with "stop" and its text must be valid under its schema.
// Then json_object and a GBNF grammar. Run by run_client_test.sh against a
// server started with --chat-template zephyr:
//   node structured.mjs http://127.0.0.1:PORT/v1
import assert from 'node:assert/strict';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';

const baseURL = process.argv[2];
assert.ok(baseURL, 'usage: node structured.mjs BASE_URL');
const client = new OpenAI({ baseURL, apiKey: 'test-key', timeout: 120_000, maxRetries: 0 });
const ajv = new Ajv2020({ strict: true, allErrors: true });
addFormats(ajv);

// Bounded lengths (maxLength, maxItems, enumerations) so that every sample finishes within max_tokens.
const schemas = {
  person: {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false,
  },
  colour: { type: 'string', enum: ['red', 'green', 'blue'] },
  small_numbers: { type: 'array', items: { type: 'integer', minimum: -5, maximum: 5 }, minItems: 2, maxItems: 4 },
  pet_owner: {
    type: 'object',
    properties: {
      pet: {
        type: 'object',
        properties: { kind: { enum: ['cat', 'dog'] }, legs: { type: 'integer', minimum: 0, maximum: 4 } },
        required: ['kind', 'legs'], additionalProperties: false,
      },
      owner: { type: 'string', maxLength: 8 },
    },
    required: ['pet', 'owner'], additionalProperties: false,
  },
  any_of: { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'string', maxLength: 5 }, { type: 'boolean' }] },
  pattern: { type: 'string', pattern: '^[A-Z][a-z]{1,6}$' },
  formats: {
    type: 'object',
    properties: { day: { type: 'string', format: 'date' }, id: { type: 'string', format: 'uuid' } },
    required: ['day', 'id'], additionalProperties: false,
  },
  range: { type: 'integer', minimum: 100, maximum: 250 },
  tuple: { type: 'array', prefixItems: [{ type: 'string', maxLength: 4 }, { type: 'boolean' }], items: false, minItems: 2 },
  story: {
    type: 'object',
    properties: {
      kind: { const: 'story' },
      words: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
      mood: { oneOf: [{ const: 'happy' }, { const: 'sad' }] },
    },
    required: ['kind', 'words', 'mood'], additionalProperties: false,
  },
  nullable: { type: ['string', 'null'], maxLength: 5 },
};

const maxTokens = 400;
let n_checked = 0;
function check(name, schema, choice) {
  assert.equal(choice.finish_reason, 'stop', `${name}: finish_reason ${choice.finish_reason} for ${JSON.stringify(choice)}`);
  const text = choice.message ? choice.message.content : choice.text;
  let doc;
  assert.doesNotThrow(() => { doc = JSON.parse(text); }, `${name}: not JSON: ${JSON.stringify(text)}`);
  const validate = ajv.compile(schema);
  assert.ok(validate(doc), `${name}: ${JSON.stringify(text)} is not valid: ${ajv.errorsText(validate.errors)}`);
  ++n_checked;
  return text;
}

for (const [name, schema] of Object.entries(schemas)) {
  // Chat, through the openai client (OpenAI's response_format).
  const chat = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: `Answer in JSON: ${name}` }],
    temperature: 1, n: 3, seed: 11, max_tokens: maxTokens,
    response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
  });
  const texts = chat.choices.map((c) => check(name, schema, c));
  // Completions, llama-server's json_schema field.
  const res = await fetch(`${baseURL}/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer test-key' },
    body: JSON.stringify({ prompt: 'Once upon a time', temperature: 1, n: 3, seed: 5, max_tokens: maxTokens, json_schema: schema }),
  });
  assert.equal(res.status, 200, `${name}: ${await res.clone().text()}`);
  for (const c of (await res.json()).choices) texts.push(check(name, schema, c));
  console.log(`${name}: ${texts.map((t) => JSON.stringify(t)).join(' ')}`);
}

// json_object: any JSON object. The grammar bounds nothing, and stories260K, which knows no JSON, seldom closes
// a string or an object; a logit_bias on the '"' and '}' tokens (ids from /tokenize, the last token of each)
// steers it to close them where the grammar allows, so that the samples finish and can be validated.
async function lastToken(text) {
  const r = await fetch(`${baseURL.replace(/\/v1$/, '')}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer test-key' },
    body: JSON.stringify({ content: text }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).tokens.at(-1);
}
const obj = await client.chat.completions.create({
  model: 'stories260K', messages: [{ role: 'user', content: 'An object' }],
  temperature: 1, n: 8, seed: 3, max_tokens: 600, response_format: { type: 'json_object' },
  logit_bias: { [await lastToken('}')]: 8, [await lastToken('"')]: 5 },
});
let n_objects = 0;
for (const c of obj.choices) {
  if (c.finish_reason !== 'stop') continue;
  check('json_object', { type: 'object' }, c);
  ++n_objects;
}
assert.ok(n_objects >= 4, `json_object: ${n_objects} of 8 samples finished`);

// A GBNF grammar (llama-server's grammar field), streamed.
const stream = await client.completions.create({
  model: 'stories260K', prompt: 'The cat', temperature: 1, max_tokens: 64, stream: true, seed: 9,
  grammar: 'root ::= "The " ("cat" | "dog") " is " [a-z]{1,8} "."',
});
let streamed = '';
let finish = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.text ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
assert.equal(finish, 'stop');
assert.match(streamed, /^The (cat|dog) is [a-z]{1,8}\.$/);

// An invalid schema: a 400 naming where it is wrong.
await assert.rejects(
  client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'bad', strict: true, schema: { type: 'object', properties: { a: { type: 'strin' } } } } },
  }),
  (e) => e.status === 400 && /properties\/a/.test(e.message),
);
console.log(`structured outputs: ${n_checked} documents valid under ajv`);
console.log('structured outputs: all checks passed');
