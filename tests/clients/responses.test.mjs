/*
 * responses.test.mjs - POST /v1/responses, GET and DELETE
 * /v1/responses/{id} driven by the official `openai` npm client, and the
 * parity of the three chat APIs.
 *
 * tests/clients/e2e_agent_apis.sh starts the server and runs this file with
 * `node --test`; KVPIN_URL and KVPIN_API_KEY name the bundled stories260K
 * model with the chatml template (tools in the generic format).
 *
 * Expected values come from references and invariants, never from kvpin's
 * own output: OpenAI's API reference for the response object, items and
 * stream events; a greedy answer through /v1/responses is the greedy
 * answer of the same conversation through /v1/chat/completions and
 * /v1/messages (one chat layer renders all three, so they give the same
 * prompt tokens and hit the same cached prefix); streamed deltas
 * concatenate to the non-streamed text; a forced call's arguments and a
 * json_schema answer validate with ajv; a conversation continued with
 * previous_response_id reuses every token of the previous turn but its
 * last generated one (never fed back).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';

const URL_MAIN = process.env.KVPIN_URL;
const API_KEY = process.env.KVPIN_API_KEY;
if (!URL_MAIN || !API_KEY) throw new Error('set KVPIN_URL and KVPIN_API_KEY (tests/clients/e2e_agent_apis.sh does)');

const client = new OpenAI({ baseURL: URL_MAIN + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
const anthropic = new Anthropic({ baseURL: URL_MAIN, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
const ajv = new Ajv({ strict: false, allErrors: true });

const WEATHER = {
    type: 'function', name: 'get_weather', description: 'The weather in a city',
    parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'], additionalProperties: false,
    },
};
const CHECK_WEATHER = ajv.compile(WEATHER.parameters);

async function cacheJson() {
    const r = await fetch(URL_MAIN + '/v1/cache', { headers: { Authorization: `Bearer ${API_KEY}` } });
    return r.json();
}

test('responses.create with a string: the shape, and the greedy answer of chat completions', async () => {
    const r = await client.responses.create({ model: 'm', instructions: 'Be brief.', input: 'Tell me about a dog.',
        max_output_tokens: 16, temperature: 0 });
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status));
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].role, 'assistant');
    assert.equal(r.output[0].content[0].type, 'output_text');
    assert.ok(r.output_text.length > 0);
    assert.ok(Number.isInteger(r.usage.input_tokens_details.cached_tokens));
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    const c = await client.chat.completions.create({ model: 'm', max_tokens: 16, temperature: 0,
        messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about a dog.' }] });
    assert.equal(r.output_text, c.choices[0].message.content);
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    // items: the same conversation as input_text parts
    const items = await client.responses.create({ model: 'm', max_output_tokens: 16, temperature: 0, input: [
        { type: 'message', role: 'system', content: 'Be brief.' },
        { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Tell me about a dog.' }] }] });
    assert.equal(items.output_text, r.output_text);
});

test('parity: one conversation through chat completions, Messages and Responses renders the same prompt', async () => {
    const sys = 'You tell tales.', q = 'A tale about a fox, please.';
    const c = await client.chat.completions.create({ model: 'm', max_tokens: 8, temperature: 0,
        messages: [{ role: 'system', content: sys }, { role: 'user', content: q }] });
    const m = await anthropic.messages.create({ model: 'm', max_tokens: 8, temperature: 0, system: sys,
        messages: [{ role: 'user', content: q }] });
    const r = await client.responses.create({ model: 'm', max_output_tokens: 8, temperature: 0, instructions: sys, input: q });
    const n = c.usage.prompt_tokens;
    // the same prompt: the same length, and the second and third find all of it cached but the last token
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens, n);
    assert.equal(r.usage.input_tokens, n);
    assert.equal(m.kvpin_cache.reused_tokens, n - 1);
    assert.equal(r.kvpin_cache.reused_tokens, n - 1);
    assert.equal(m.content[0].text, c.choices[0].message.content);
    assert.equal(r.output_text, c.choices[0].message.content);
});

test('a function tool round trip: a forced call that validates, then function_call_output', async () => {
    const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const r = await client.responses.create({ model: 'm', max_output_tokens: 200, temperature: 1, tools: [WEATHER],
        tool_choice: 'required', input: ask });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    const call = calls[0];
    assert.equal(call.name, 'get_weather');
    assert.ok(call.call_id.length > 0);
    const args = JSON.parse(call.arguments);
    assert.ok(CHECK_WEATHER(args), `${call.arguments}: ${ajv.errorsText(CHECK_WEATHER.errors)}`);
    const next = await client.responses.create({ model: 'm', max_output_tokens: 12, temperature: 0, tools: [WEATHER],
        input: [...ask, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
            { type: 'function_call_output', call_id: call.call_id, output: '18 C, sunny' }] });
    assert.equal(next.object, 'response');
    assert.ok(next.usage.input_tokens_details.cached_tokens > 0);
    // named: the same through previous_response_id
    const named = await client.responses.create({ model: 'm', max_output_tokens: 200, temperature: 1, tools: [WEATHER],
        tool_choice: { type: 'function', name: 'get_weather' }, input: ask });
    const fc = named.output.find((o) => o.type === 'function_call');
    assert.ok(fc && CHECK_WEATHER(JSON.parse(fc.arguments)));
    const cont = await client.responses.create({ model: 'm', max_output_tokens: 8, temperature: 0, tools: [WEATHER],
        previous_response_id: named.id, input: [{ type: 'function_call_output', call_id: fc.call_id, output: 'rain' }] });
    assert.ok(cont.usage.input_tokens_details.cached_tokens >= named.usage.input_tokens);
});

test('text.format json_schema: every completed answer validates', async () => {
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer' } },
        required: ['name', 'age'], additionalProperties: false };
    const check = ajv.compile(schema);
    for (let i = 0; i < 2; i++) {
        const r = await client.responses.create({ model: 'm', max_output_tokens: 200, temperature: 1, input: 'A person.',
            text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
        assert.equal(r.status, 'completed');
        const v = JSON.parse(r.output_text);
        assert.ok(check(v), `${r.output_text}: ${ajv.errorsText(check.errors)}`);
    }
});

test('streaming: the documented events in order, deltas that make the final response', async () => {
    const body = { model: 'm', instructions: 'Be brief.', input: 'Tell me about a dog.', max_output_tokens: 16, temperature: 0 };
    const plain = await client.responses.create(body);
    const stream = await client.responses.create({ ...body, stream: true });
    const types = [];
    let text = '', final = null;
    for await (const ev of stream) {
        types.push(ev.type);
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
    }
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
    const added = types.indexOf('response.output_item.added'), done = types.lastIndexOf('response.output_item.done');
    assert.ok(added > 1 && types.indexOf('response.output_text.delta') > added && done > types.lastIndexOf('response.output_text.delta'));
    assert.equal(text, plain.output_text);
    assert.equal(final.output[0].content[0].text, plain.output_text);
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
    // the message item says how the response ended, streamed and not
    const cut = await client.responses.create({ model: 'm', max_output_tokens: 2, temperature: 0, input: 'Once' });
    assert.equal(cut.status, 'incomplete');
    assert.equal(cut.incomplete_details?.reason ?? 'max_output_tokens', 'max_output_tokens');
    assert.equal(cut.output[0].status, 'incomplete');
    const cs = await client.responses.create({ model: 'm', max_output_tokens: 2, temperature: 0, input: 'Once',
        stream: true });
    let itemDone = null, last = null;
    for await (const ev of cs) {
        if (ev.type === 'response.output_item.done') itemDone = ev.item;
        last = ev;
    }
    assert.equal(last.type, 'response.incomplete');
    assert.equal(itemDone.status, 'incomplete');
    assert.equal(last.response.output[0].status, 'incomplete');
    // a forced call streams its arguments
    const fs = await client.responses.create({ model: 'm', max_output_tokens: 200, temperature: 1, tools: [WEATHER],
        tool_choice: 'required', input: 'Weather?', stream: true });
    let args = '', fdone = null;
    for await (const ev of fs) {
        if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
        if (ev.type === 'response.completed') fdone = ev.response;
    }
    assert.ok(CHECK_WEATHER(JSON.parse(args)), args);
    assert.equal(fdone.output.find((o) => o.type === 'function_call').arguments, args);
});

test('previous_response_id continues the conversation: cached_tokens cover the whole previous turn', async () => {
    const a = await client.responses.create({ model: 'm', instructions: 'Be brief.', input: 'Tell me about a bird.',
        max_output_tokens: 12, temperature: 0 });
    const b = await client.responses.create({ model: 'm', instructions: 'Be brief.', previous_response_id: a.id,
        input: 'And then?', max_output_tokens: 12, temperature: 0 });
    // every token of turn 1 but its last generated one, which is never fed back
    assert.ok(b.usage.input_tokens_details.cached_tokens >= a.usage.input_tokens + a.usage.output_tokens - 1,
        JSON.stringify([a.usage, b.usage]));
    // the same conversation sent whole as items renders the same prompt
    const whole = await client.responses.create({ model: 'm', instructions: 'Be brief.', max_output_tokens: 12,
        temperature: 0, input: [{ role: 'user', content: 'Tell me about a bird.' },
            { role: 'assistant', content: [{ type: 'output_text', text: a.output_text }] },
            { role: 'user', content: 'And then?' }] });
    assert.equal(whole.usage.input_tokens, b.usage.input_tokens);
    assert.equal(whole.output_text, b.output_text);
    const got = await client.responses.retrieve(a.id);
    assert.equal(got.id, a.id);
    assert.equal(got.output_text, a.output_text);
    const before = (await cacheJson()).responses;
    assert.ok(before.count >= 1 && before.count <= before.max_count && before.bytes <= before.max_bytes);
    await client.responses.delete(a.id);
    await assert.rejects(client.responses.retrieve(a.id), (e) => e.status === 404);
    await assert.rejects(client.responses.create({ model: 'm', previous_response_id: a.id, input: 'x', max_output_tokens: 2 }),
        (e) => e.status === 404 && e.param === 'previous_response_id');
    assert.equal((await cacheJson()).responses.count, before.count - 1);
    // store false keeps nothing
    const ns = await client.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2, store: false });
    await assert.rejects(client.responses.retrieve(ns.id), (e) => e.status === 404);
});

test('responses errors: refused items and fields name the field', async () => {
    const bad = async (body, param) => assert.rejects(client.responses.create({ model: 'm', max_output_tokens: 2, ...body }),
        (e) => e.status === 400 && e.param === param);
    await bad({ input: [{ type: 'message', role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] },
        'input[0].content[0].type');
    await bad({ input: [{ type: 'web_search_call' }] }, 'input[0].type');
    await bad({ input: [] }, 'input');
    await bad({ input: 'x', tools: [{ type: 'teleport' }] }, 'tools[0]');
    // a hosted tool kvpin cannot run is left out and named (Codex always sends web_search)
    const { data: hosted, response: hr } = await client.responses.create({ model: 'm', input: 'x', max_output_tokens: 2,
        tools: [{ type: 'web_search' }] }).withResponse();
    assert.equal(hosted.object, 'response');
    assert.ok((hr.headers.get('x-kvpin-ignored-fields') ?? '').split(',').includes('tools[0]:web_search'),
        hr.headers.get('x-kvpin-ignored-fields'));
    await bad({ input: 'x', text: { format: { type: 'json_schema', name: 'n' } } }, 'text.format.schema');
    await bad({ input: 'x', max_output_tokens: 0 }, 'max_output_tokens');
    const ok = await client.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2 });
    assert.equal(ok.object, 'response');
});

test('responses: a namespace tool (Codex) is flattened, and its calls name the namespace', async () => {
    const ns = { type: 'namespace', name: 'multi_agent_v1', description: 'Sub-agents.', tools: [{ type: 'function',
        name: 'close_agent', description: 'Close an agent.', strict: false, parameters: { type: 'object',
            properties: { target: { type: 'string' } }, required: ['target'], additionalProperties: false } }] };
    const r = await client.responses.create({ model: 'm', input: 'Close the agent.', max_output_tokens: 200,
        temperature: 0, tools: [ns, { type: 'web_search', external_web_access: false }], tool_choice: 'required' });
    const call = r.output.find((o) => o.type === 'function_call');
    assert.ok(call, JSON.stringify(r));
    assert.equal(call.name, 'close_agent');
    assert.equal(call.namespace, 'multi_agent_v1');
    assert.equal(typeof JSON.parse(call.arguments).target, 'string');
    const s = await client.responses.create({ model: 'm', input: 'Close the agent.', max_output_tokens: 200,
        temperature: 0, tools: [ns], tool_choice: 'required', stream: true });
    let done = null;
    for await (const ev of s) if (ev.type === 'response.output_item.done' && ev.item.type === 'function_call') done = ev.item;
    assert.equal(done.namespace, 'multi_agent_v1');
    // the call sent back (with its namespace, as Codex does) continues the conversation
    const next = await client.responses.create({ model: 'm', max_output_tokens: 2, tools: [ns], input: [
        { type: 'message', role: 'user', content: 'Close the agent.' },
        { type: 'function_call', call_id: call.call_id, name: call.name, namespace: call.namespace, arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: 'closed' }] });
    assert.equal(next.object, 'response');
});
