// Drives a pdserve OpenAI endpoint with the official OpenAI Node SDK (installed by
// scripts/install-deps.sh into .cache/npm): tool calls forced by tool_choice (named and
// "required"), whole and streamed through the SDK's stream helper, a conversation with tool
// results, and reasoning_content apart from content. The server runs with --tool-call-parser
// hermes and --reasoning-parser deepseek_r1 on a random-weight model: the forced calls come from
// constrained decoding; the reasoning from the template opening the think block in the prompt
// (deepseek_r1: the reply is reasoning until </think>).
// Usage: node chat_tools.cjs BASE_URL MODEL. Exit 0 when every check passes.
'use strict';
const path = require('node:path');
const assert = require('node:assert/strict');
const { OpenAI } = require(path.join(__dirname, '../../.cache/npm/node_modules/openai'));

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object' } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const named = { type: 'function', function: { name: 'get_weather' } };
const base = { model, messages, tools, temperature: 0, max_tokens: 96 };

function checkCall(choice, name) {
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
  assert.equal(choice.message.content, null, JSON.stringify(choice));
  assert.equal(choice.message.tool_calls.length, 1, JSON.stringify(choice));
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  if (name) assert.equal(call.function.name, name);
  const args = JSON.parse(call.function.arguments);
  assert.ok(args !== null && typeof args === 'object' && !Array.isArray(args), call.function.arguments);
  return call;
}

async function main() {
  const whole = await client.chat.completions.create({ ...base, tool_choice: named });
  const call = checkCall(whole.choices[0], 'get_weather');
  console.log('named, whole:', call.function.name, call.function.arguments);

  const stream = client.chat.completions.stream({ ...base, tool_choice: named });
  const done = [];
  stream.on('tool_calls.function.arguments.done', (e) => done.push(e));
  stream.on('content.delta', (e) => assert.fail('content leaked: ' + JSON.stringify(e)));
  const streamed = checkCall((await stream.finalChatCompletion()).choices[0], 'get_weather');
  assert.equal(done.length, 1);
  assert.equal(done[0].name, 'get_weather');
  assert.equal(streamed.function.arguments, call.function.arguments);  // greedy: the same call
  console.log('named, streamed:', streamed.function.name, streamed.function.arguments);

  const required = await client.chat.completions.create({ ...base, tool_choice: 'required' });
  const any = checkCall(required.choices[0]);
  assert.ok(['get_weather', 'get_time'].includes(any.function.name), any.function.name);
  console.log('required:', any.function.name, any.function.arguments);

  // The call's result goes back as a tool message; the next forced call still parses.
  const followUp = await client.chat.completions.create({
    ...base, tool_choice: { type: 'function', function: { name: 'get_time' } },
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
               { role: 'tool', tool_call_id: call.id, content: '{"sky": "clear"}' }] });
  checkCall(followUp.choices[0], 'get_time');

  // Too few tokens to finish the call: "length", the partial text as content, no tool_calls.
  const cut = await client.chat.completions.create({ ...base, tool_choice: named, max_tokens: 3 });
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.equal(cut.choices[0].message.tool_calls, undefined);
  assert.ok(cut.choices[0].message.content.length > 0);

  await assert.rejects(
    client.chat.completions.create({ ...base, tool_choice: { type: 'function',
                                                              function: { name: 'nope' } } }),
    (e) => e.status === 400 && /not the name of one of 'tools'/.test(e.message));

  const reasoning = await client.chat.completions.create(
    { model, messages, temperature: 0, max_tokens: 8 });
  const message = reasoning.choices[0].message;
  assert.ok(typeof message.reasoning_content === 'string' && message.reasoning_content.length > 0,
            JSON.stringify(message));
  assert.equal(message.content, null);
  let streamedReasoning = '';
  const rs = client.chat.completions.stream({ model, messages, temperature: 0, max_tokens: 8 });
  rs.on('chunk', (c) => { streamedReasoning += c.choices[0]?.delta?.reasoning_content ?? ''; });
  await rs.finalChatCompletion();
  assert.equal(streamedReasoning, message.reasoning_content);
  console.log('reasoning:', JSON.stringify(message.reasoning_content));
  console.log('ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
