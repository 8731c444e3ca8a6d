/*
 * anthropic.test.mjs - POST /v1/messages and /v1/messages/count_tokens
 * driven by the official `@anthropic-ai/sdk` npm client.
 *
 * tests/clients/e2e_agent_apis.sh starts the servers and runs this file with
 * `node --test`; the environment names them:
 *
 *   KVPIN_URL, KVPIN_API_KEY  the bundled stories260K model, chatml
 *                             template (tools in the generic format), a key
 *   KVPIN_TTL_URL             the same model, no key, --pin-ttl-scale so that
 *                             a "5m" breakpoint expires after 6 seconds
 *
 * Expected values come from references and invariants, never from kvpin's
 * own output: the shapes and event order of Anthropic's API reference; a
 * greedy answer through /v1/messages is the greedy answer of the same
 * conversation through /v1/chat/completions (one chat layer renders both);
 * streamed deltas concatenate to the non-streamed text; a forced tool_use's
 * input validates with ajv against its input_schema; a stop sequence taken
 * from an unconstrained answer ends the answer right before it; the three
 * input counts of usage add up to what count_tokens says.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import Ajv from 'ajv';

const URL_MAIN = process.env.KVPIN_URL;
const URL_TTL = process.env.KVPIN_TTL_URL;
const API_KEY = process.env.KVPIN_API_KEY;
if (!URL_MAIN || !URL_TTL || !API_KEY) throw new Error('set KVPIN_URL, KVPIN_API_KEY and KVPIN_TTL_URL (tests/clients/e2e_agent_apis.sh does)');

const client = new Anthropic({ baseURL: URL_MAIN, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
const ttlClient = new Anthropic({ baseURL: URL_TTL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const oai = new OpenAI({ baseURL: URL_MAIN + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
const ajv = new Ajv({ strict: false, allErrors: true });

const SYSTEM = [{ type: 'text', text: 'You are a storyteller.' }, { type: 'text', text: 'Tell short stories.' }];
const ASK = [{ role: 'user', content: 'Tell me about a cat.' }];
const WEATHER = {
    name: 'get_weather',
    description: 'The weather in a city',
    input_schema: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
    },
};
const CHECK_WEATHER = ajv.compile(WEATHER.input_schema);

const sum = (u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;

function checkUsage(u) {
    for (const k of ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens', 'output_tokens'])
        assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k}: ${u[k]}`);
}

async function rejectsWith(promise, Class, status, type, re) {
    await assert.rejects(promise, (err) => {
        assert.ok(err instanceof Class, `expected ${Class.name}, got ${err && err.constructor.name}: ${err && err.message}`);
        assert.equal(err.status, status);
        assert.equal(err.error?.type, 'error');
        assert.equal(err.error?.error?.type, type);
        if (re) assert.match(err.error.error.message, re);
        return true;
    });
}

test('messages.create: a text answer in Anthropic shape, usage adding up to count_tokens', async () => {
    const body = { model: 'm', max_tokens: 24, temperature: 0, system: SYSTEM, messages: ASK };
    const m = await client.messages.create(body);
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(typeof m.model, 'string');
    assert.equal(m.content.length, 1);
    assert.equal(m.content[0].type, 'text');
    assert.ok(m.content[0].text.length > 0);
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence, null);
    checkUsage(m.usage);
    assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 24);
    const ct = await client.messages.countTokens({ model: 'm', system: SYSTEM, messages: ASK });
    assert.equal(sum(m.usage), ct.input_tokens);
    // the same again: the same greedy text
    const again = await client.messages.create(body);
    assert.equal(again.content[0].text, m.content[0].text);
});

test('messages.create and chat.completions render one conversation alike: same greedy text, same prompt', async () => {
    const m = await client.messages.create({ model: 'm', max_tokens: 20, temperature: 0, system: 'Be brief.', messages: ASK });
    const c = await oai.chat.completions.create({
        model: 'm', max_tokens: 20, temperature: 0,
        messages: [{ role: 'system', content: 'Be brief.' }, ...ASK],
    });
    assert.equal(m.content[0].text, c.choices[0].message.content);
    assert.equal(sum(m.usage), c.usage.prompt_tokens);
    assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
});

test('stop_sequences: the answer ends right before the stop, stop_reason stop_sequence', async () => {
    const base = { model: 'm', max_tokens: 32, temperature: 0, messages: ASK };
    const whole = (await client.messages.create(base)).content[0].text;
    const words = whole.split(' ').filter((w) => w.length >= 3);
    assert.ok(words.length >= 2, `a long enough answer: ${whole}`);
    const stop = words[1];
    const at = whole.indexOf(stop);
    const m = await client.messages.create({ ...base, stop_sequences: [stop, 'never-seen-zzz'] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, whole.slice(0, at));
});

test('tools with tool_choice any: a tool_use whose input validates, then a tool_result round trip', async () => {
    for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
        for (let seed = 0; seed < 2; seed++) {
            const m = await client.messages.create({
                model: 'm', max_tokens: 200, temperature: 1, top_k: 40 + seed, tools: [WEATHER], tool_choice,
                messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
            });
            assert.equal(m.stop_reason, 'tool_use');
            const uses = m.content.filter((b) => b.type === 'tool_use');
            assert.equal(uses.length, 1);
            const use = uses[0];
            assert.match(use.id, /^toolu_/);
            assert.equal(use.name, 'get_weather');
            assert.ok(CHECK_WEATHER(use.input), `${JSON.stringify(use.input)}: ${ajv.errorsText(CHECK_WEATHER.errors)}`);
            const next = await client.messages.create({
                model: 'm', max_tokens: 12, temperature: 0, tools: [WEATHER],
                messages: [
                    { role: 'user', content: 'What is the weather in Paris?' },
                    { role: 'assistant', content: m.content },
                    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C, sunny' }] },
                ],
            });
            assert.equal(next.type, 'message');
            checkUsage(next.usage);
            // the round trip's prompt holds the first turn's: it is reused
            assert.ok(next.usage.cache_read_input_tokens > 0);
        }
    }
});

test('messages.stream: Anthropic event order, deltas that make the final message', async () => {
    const body = { model: 'm', max_tokens: 24, temperature: 0, system: SYSTEM, messages: ASK };
    const plain = await client.messages.create(body);
    const events = [];
    let text = '';
    const stream = client.messages.stream(body);
    for await (const ev of stream) {
        events.push(ev.type);
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    }
    const final = await stream.finalMessage();
    assert.equal(events[0], 'message_start');
    assert.equal(events.at(-1), 'message_stop');
    assert.equal(events.at(-2), 'message_delta');
    const starts = events.filter((e) => e === 'content_block_start').length;
    assert.equal(starts, events.filter((e) => e === 'content_block_stop').length);
    assert.ok(starts >= 1);
    const firstStart = events.indexOf('content_block_start');
    assert.ok(events.indexOf('content_block_delta') > firstStart);
    assert.ok(events.lastIndexOf('content_block_stop') < events.indexOf('message_delta'));
    assert.equal(text, plain.content[0].text);
    assert.equal(final.content[0].text, plain.content[0].text);
    assert.equal(final.stop_reason, plain.stop_reason);
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
});

test('messages.stream with a forced tool: tool_use block with input_json_delta, input that validates', async () => {
    const stream = client.messages.stream({
        model: 'm', max_tokens: 200, temperature: 1, tools: [WEATHER], tool_choice: { type: 'any' },
        messages: [{ role: 'user', content: 'Weather?' }],
    });
    const deltas = [];
    for await (const ev of stream) if (ev.type === 'content_block_delta') deltas.push(ev.delta.type);
    const final = await stream.finalMessage();
    assert.ok(deltas.includes('input_json_delta'));
    assert.equal(final.stop_reason, 'tool_use');
    const use = final.content.find((b) => b.type === 'tool_use');
    assert.ok(use && CHECK_WEATHER(use.input), JSON.stringify(final.content));
});

test('errors in Anthropic shape with its status codes', async () => {
    const base = { model: 'm', max_tokens: 4, messages: ASK };
    const { max_tokens, ...noMax } = base;
    await rejectsWith(client.messages.create(noMax), Anthropic.BadRequestError, 400, 'invalid_request_error', /max_tokens/);
    await rejectsWith(client.messages.create({ ...base, max_tokens: 0 }), Anthropic.BadRequestError, 400,
        'invalid_request_error', /max_tokens/);
    // more than the context is cut at it, as Claude Code's 128,000 needs
    const huge = await client.messages.create({ ...base, max_tokens: 1 << 29, stop_sequences: ['.'] });
    assert.equal(huge.type, 'message');
    const bad = new Anthropic({ baseURL: URL_MAIN, apiKey: 'wrong', maxRetries: 0 });
    await rejectsWith(bad.messages.create(base), Anthropic.AuthenticationError, 401, 'authentication_error');
    await rejectsWith(client.messages.create({
        ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
    }), Anthropic.BadRequestError, 400, 'invalid_request_error', /image/);
    await rejectsWith(client.messages.create({
        ...base, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_nope', content: 'x' }] }],
    }), Anthropic.BadRequestError, 400, 'invalid_request_error', /toolu_nope/);
    const cc = { type: 'ephemeral' };
    await rejectsWith(client.messages.create({
        ...base, system: [1, 2, 3, 4, 5].map((i) => ({ type: 'text', text: `part ${i}`, cache_control: cc })),
    }), Anthropic.BadRequestError, 400, 'invalid_request_error', /maximum of 4/);
    await rejectsWith(client.messages.create({
        ...base, system: [{ type: 'text', text: 'x', cache_control: { type: 'ephemeral', ttl: '2h' } }],
    }), Anthropic.BadRequestError, 400, 'invalid_request_error', /ttl/);
    await rejectsWith(client.messages.create({ ...base, messages: [{ role: 'tool', content: 'x' }] }),
        Anthropic.BadRequestError, 400, 'invalid_request_error', /role/);
    // healthy afterwards
    const m = await client.messages.create(base);
    assert.equal(m.type, 'message');
});

/* cache_control on the system block: turn 1 writes the prefix up to the
 * breakpoint (a creation), turn 2 (the answer and a new question appended)
 * reads at least that prefix and creates nothing; once the TTL has passed
 * without a hit, the same prefix is a creation again. Runs on the short-TTL
 * server ("5m" is 6 s there), so each step stays well inside the TTL. */
test('cache_control: a two-turn loop reads the pinned prefix; an expired TTL is a creation again', async () => {
    const system = [{ type: 'text', text: 'You are a storyteller. You tell short stories about a cat named Tom.',
        cache_control: { type: 'ephemeral', ttl: '5m' } }];
    const turn1 = [{ role: 'user', content: 'Tell me about Tom.' }];
    const a = await ttlClient.messages.create({ model: 'm', max_tokens: 16, temperature: 0, system, messages: turn1 });
    checkUsage(a.usage);
    assert.ok(a.usage.cache_creation_input_tokens > 0, JSON.stringify(a.usage));
    assert.equal(a.usage.cache_read_input_tokens, 0);
    assert.equal(sum(a.usage), (await ttlClient.messages.countTokens({ model: 'm', system, messages: turn1 })).input_tokens);
    const pinned = a.usage.cache_creation_input_tokens;
    const turn2 = [...turn1, { role: 'assistant', content: a.content }, { role: 'user', content: 'And then?' }];
    const b = await ttlClient.messages.create({ model: 'm', max_tokens: 16, temperature: 0, system, messages: turn2 });
    assert.equal(b.usage.cache_creation_input_tokens, 0, JSON.stringify(b.usage));
    assert.ok(b.usage.cache_read_input_tokens >= pinned, JSON.stringify(b.usage));
    assert.equal(sum(b.usage), (await ttlClient.messages.countTokens({ model: 'm', system, messages: turn2 })).input_tokens);
    await new Promise((r) => setTimeout(r, 7500)); // past the 6 s TTL
    const c = await ttlClient.messages.create({ model: 'm', max_tokens: 16, temperature: 0, system, messages: turn2 });
    assert.equal(c.usage.cache_creation_input_tokens, pinned, JSON.stringify(c.usage));
    assert.equal(c.usage.cache_read_input_tokens, 0);
    assert.equal(sum(c.usage), sum(b.usage));
});

test('cache_control on tools and message blocks: breakpoints in order, usage adding up', async () => {
    const tools = [{ ...WEATHER, cache_control: { type: 'ephemeral' } }];
    const messages = [{ role: 'user', content: [
        { type: 'text', text: 'Hello there.', cache_control: { type: 'ephemeral', ttl: '1h' } },
        { type: 'text', text: 'What now?' }] }];
    const m = await ttlClient.messages.create({ model: 'm', max_tokens: 4, temperature: 0, tools, system: 'Be brief.', messages });
    checkUsage(m.usage);
    const ct = await ttlClient.messages.countTokens({ model: 'm', tools, system: 'Be brief.', messages });
    assert.equal(sum(m.usage), ct.input_tokens);
    const pins = m.kvpin_cache.cache_control;
    assert.equal(pins.length, 2);
    assert.ok(pins[0].tokens < pins[1].tokens, JSON.stringify(pins));
    assert.ok(pins.every((p) => p.pinned === true), JSON.stringify(pins));
    assert.equal(m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens >= pins[1].tokens, true);
});
