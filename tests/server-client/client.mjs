// SPDX-License-Identifier: MIT
// llmkit-server against the official `openai` npm client: a completion, a
// streamed chat completion (equal to the same request non-streamed), the
// model list, and error answers (400 naming the field, 401 for a wrong key).
// Run by run_client_test.sh against a server started with --api-key test-key
// --chat-template zephyr on stories260K:  node client.mjs http://127.0.0.1:PORT/v1
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.argv[2];
assert.ok(baseURL, 'usage: node client.mjs BASE_URL');
const client = new OpenAI({ baseURL, apiKey: 'test-key', timeout: 60_000, maxRetries: 0 });

// A completion: greedy, so stories260K tells its usual story.
const completion = await client.completions.create({
  model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
});
assert.equal(completion.object, 'text_completion');
assert.match(completion.choices[0].text, /there was a little girl named Lily/);
assert.equal(completion.choices[0].finish_reason, 'length');
assert.equal(completion.usage.completion_tokens, 24);
assert.equal(completion.usage.total_tokens, completion.usage.prompt_tokens + 24);
console.log(`completion: ${JSON.stringify(completion.choices[0].text)}`);

// A streamed chat completion, then the same request non-streamed.
const chatRequest = {
  model: 'stories260K',
  messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
  max_tokens: 16, temperature: 0.8, seed: 7,
};
const stream = await client.chat.completions.create({
  ...chatRequest, stream: true, stream_options: { include_usage: true },
});
let streamed = '';
let role = null;
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  ++chunks;
  assert.equal(chunk.object, 'chat.completion.chunk');
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) streamed += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
assert.equal(role, 'assistant');
assert.ok(['stop', 'length'].includes(finish), `finish_reason ${finish}`);
assert.ok(usage && usage.completion_tokens > 0 && usage.completion_tokens <= 16, `usage ${JSON.stringify(usage)}`);
assert.ok(chunks >= 3, `only ${chunks} chunks`);
const whole = await client.chat.completions.create(chatRequest);
assert.equal(whole.choices[0].message.role, 'assistant');
assert.equal(whole.choices[0].message.content, streamed, 'streamed text differs from the non-streamed answer');
assert.equal(whole.choices[0].finish_reason, finish);
console.log(`streamed chat (${chunks} chunks): ${JSON.stringify(streamed)}`);

const models = await client.models.list();
assert.equal(models.data[0].id, 'stories260K');

// Errors: a 400 that names the field, and a 401 for a wrong key.
await assert.rejects(
  client.completions.create({ model: 'stories260K', prompt: 'x', temperature: 5 }),
  (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.param === 'temperature' &&
    /temperature/.test(err.message),
);
const stranger = new OpenAI({ baseURL, apiKey: 'wrong-key', timeout: 60_000, maxRetries: 0 });
await assert.rejects(
  stranger.models.list(),
  (err) => err instanceof OpenAI.AuthenticationError && err.status === 401 && err.code === 'invalid_api_key',
);
console.log('openai client: all checks passed');
