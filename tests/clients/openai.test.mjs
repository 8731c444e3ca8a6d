/*
 * openai.test.mjs - `kvpin serve` driven by the official `openai` npm client.
 *
 * tests/clients/e2e_openai.sh starts the servers and runs this file with
 * `node --test`; the environment names them:
 *
 *   KVPIN_URL        chatml template, --api-key, F32 KV    (most tests, and
 *                    tools in the generic format)
 *   KVPIN_API_KEY    that server's key
 *   KVPIN_TOOLS_URL  qwen2.5 template (tools), no key       (tool tests)
 *   KVPIN_MODEL_ID   the id GET /v1/models must report
 *   KVPIN_CTX        the main server's --ctx
 *
 * Both serve the bundled stories260K model. Expected values come from
 * references and invariants, never from kvpin's own output:
 *
 *   - llama.cpp's greedy continuation of "Once upon a time"
 *     (tests/data/golden/stories260K.once.json) and llama2.c's greedy story
 *     from BOS (tests/data/stories260K.llama2c-greedy.txt, 256 tokens, which
 *     llama2.c ends with a newline of its own);
 *   - the OpenAI API reference for object shapes, stream chunks, usage and
 *     error bodies;
 *   - invariants: a greedy request gives the same text again; streamed
 *     pieces concatenate to the non-streamed text; a repeated prompt reuses
 *     all its tokens but the last (recomputed for its logits); a chat turn
 *     reuses at least the previous turn's prompt; tool schemas are rendered
 *     canonically, so key order and whitespace do not change the prompt.
 *
 * Tests in one file run one after another, so each sees the prefix cache
 * as the previous ones left it; assertions on cached_tokens only rely on
 * what the test itself sent before.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const URL_MAIN = process.env.KVPIN_URL;
const URL_TOOLS = process.env.KVPIN_TOOLS_URL;
const API_KEY = process.env.KVPIN_API_KEY;
const MODEL = process.env.KVPIN_MODEL_ID;
const CTX = Number(process.env.KVPIN_CTX);
if (!URL_MAIN || !URL_TOOLS || !API_KEY || !MODEL || !(CTX > 300))
    throw new Error('set KVPIN_URL, KVPIN_API_KEY, KVPIN_TOOLS_URL, KVPIN_MODEL_ID and KVPIN_CTX (tests/clients/e2e_openai.sh does)');

const client = new OpenAI({ baseURL: URL_MAIN + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
const tools = new OpenAI({ baseURL: URL_TOOLS + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

const data = (p) => new URL('../data/' + p, import.meta.url);
const ONCE = JSON.parse(readFileSync(data('golden/stories260K.once.json'), 'utf8'));
const LLAMA2C = readFileSync(data('stories260K.llama2c-greedy.txt'), 'utf8');
const CAUSES = ['hit', 'cold', 'evicted', 'timestamp', 'counter', 'identifier', 'reordered_json', 'whitespace',
    'inserted_at_front', 'other', 'retokenized', 'template_rewrites_history', 'new_prefix', 'window_evicted'];

/* ---- helpers ------------------------------------------------------------ */

/* POST to a kvpin endpoint outside the OpenAI API (/tokenize), or with a
 * body the client would re-serialise (raw whitespace). */
async function post(base, path, body, key) {
    const headers = { 'Content-Type': 'application/json' };
    if (key) headers.Authorization = 'Bearer ' + key;
    const r = await fetch(base + path, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
    const j = await r.json();
    assert.equal(r.status, 200, `${path}: ${JSON.stringify(j)}`);
    return j;
}

async function tokenize(text) {
    return (await post(URL_MAIN, '/tokenize', { content: text, add_special: true }, API_KEY)).tokens;
}

/* The ChatML layout (<|im_start|>role\ncontent<|im_end|>\n ... and the
 * generation prompt), as the template of that family writes it. */
function chatml(messages) {
    return messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('') + '<|im_start|>assistant\n';
}

function commonPrefix(a, b) {
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    return n;
}

async function collect(stream) {
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    return chunks;
}

function checkUsage(u, promptTokens, completionTokens) {
    assert.equal(typeof u.prompt_tokens, 'number');
    if (promptTokens !== undefined) assert.equal(u.prompt_tokens, promptTokens);
    if (completionTokens !== undefined) assert.equal(u.completion_tokens, completionTokens);
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    const cached = u.prompt_tokens_details.cached_tokens;
    assert.ok(Number.isInteger(cached) && cached >= 0 && cached < u.prompt_tokens, `cached_tokens ${cached}`);
    return cached;
}

/* The kvpin_cache report agrees with usage. */
function checkCacheReport(c, usage) {
    assert.equal(typeof c, 'object', 'kvpin_cache is present');
    assert.equal(c.prompt_tokens, usage.prompt_tokens);
    assert.equal(c.reused_tokens, usage.prompt_tokens_details.cached_tokens);
    assert.equal(c.computed_tokens, usage.prompt_tokens - c.reused_tokens);
    assert.ok(CAUSES.includes(c.cause), `cause ${c.cause}`);
    assert.equal(c.evicted, false);
}

function checkEnvelope(o, object) {
    assert.equal(o.object, object);
    assert.equal(o.model, MODEL);
    const prefix = object.startsWith('chat.') ? 'chatcmpl-' : 'cmpl-';
    assert.ok(typeof o.id === 'string' && o.id.startsWith(prefix) && o.id.length > prefix.length, `id ${o.id}`);
    assert.ok(Number.isInteger(o.created) && Math.abs(o.created - Date.now() / 1000) < 600, `created ${o.created}`);
}

/* The error a client call must throw. */
async function rejectsWith(promise, Class, status, check) {
    await assert.rejects(promise, (err) => {
        assert.ok(err instanceof Class, `expected ${Class.name}, got ${err && err.constructor.name}: ${err && err.message}`);
        assert.equal(err.status, status);
        assert.equal(typeof err.error?.message, 'string');
        if (check) check(err);
        return true;
    });
}

/* ---- models --------------------------------------------------------------- */

test('models.list returns the served model', async () => {
    const page = await client.models.list();
    assert.equal(page.data.length, 1);
    const m = page.data[0];
    assert.equal(m.id, MODEL);
    assert.equal(m.object, 'model');
    assert.equal(typeof m.owned_by, 'string');
    assert.ok(Number.isInteger(m.created));
    const ids = [];
    for await (const x of client.models.list()) ids.push(x.id);
    assert.deepEqual(ids, [MODEL]);
});

/* ---- completions ---------------------------------------------------------- */

const ONCE_N = ONCE.greedy.length;

test('completions: greedy text equals llama.cpp, finish_reason length, usage', async () => {
    const params = { model: MODEL, prompt: ONCE.prompt, max_tokens: ONCE_N, temperature: 0 };
    const a = await client.completions.create(params);
    checkEnvelope(a, 'text_completion');
    assert.equal(a.choices.length, 1);
    assert.equal(a.choices[0].index, 0);
    assert.equal(a.choices[0].text, ONCE.greedy_text);
    assert.equal(a.choices[0].finish_reason, 'length');
    assert.equal(a.choices[0].logprobs, null);
    checkUsage(a.usage, ONCE.n_tokens, ONCE_N);
    checkCacheReport(a.kvpin_cache, a.usage);
    // the same request again: the same text, every prompt token but the last from the cache
    const b = await client.completions.create(params);
    assert.equal(b.choices[0].text, a.choices[0].text);
    assert.equal(checkUsage(b.usage, ONCE.n_tokens, ONCE_N), ONCE.n_tokens - 1);
    checkCacheReport(b.kvpin_cache, b.usage);
    assert.equal(b.kvpin_cache.cause, 'hit');
    assert.notEqual(b.id, a.id);
});

test('completions: greedy from BOS equals llama2.c (256 tokens)', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: '', max_tokens: 256, temperature: 0 });
    assert.equal(r.choices[0].text + '\n', LLAMA2C);
    assert.equal(r.choices[0].finish_reason, 'length');
    checkUsage(r.usage, 1, 256);
});

test('completions: prompt as token ids equals the text prompt', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: ONCE.tokens, max_tokens: ONCE_N, temperature: 0 });
    assert.equal(r.choices[0].text, ONCE.greedy_text);
    checkUsage(r.usage, ONCE.n_tokens, ONCE_N);
});

test('completions: a stop string ends the text before it, finish_reason stop', async () => {
    const stop = 'Lily.';
    const want = ONCE.greedy_text.slice(0, ONCE.greedy_text.indexOf(stop));
    assert.ok(want.length > 0);
    const params = { model: MODEL, prompt: ONCE.prompt, max_tokens: ONCE_N, temperature: 0, stop: [stop, 'never-seen'] };
    const r = await client.completions.create(params);
    assert.equal(r.choices[0].text, want);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(r.usage.completion_tokens < ONCE_N);
    const chunks = await collect(await client.completions.create({ ...params, stream: true }));
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), want);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
});

test('completions: text held back for a stop string that does not complete is sent', async () => {
    // "Lily" starts the first stop and "saw" (the last word) starts the second:
    // neither completes, so the whole text comes back, streamed or not
    const params = { model: MODEL, prompt: ONCE.prompt, max_tokens: ONCE_N, temperature: 0, stop: ['Lily and', 'saw a dragon'] };
    assert.ok(ONCE.greedy_text.endsWith(' saw'));
    const r = await client.completions.create(params);
    assert.equal(r.choices[0].text, ONCE.greedy_text);
    assert.equal(r.choices[0].finish_reason, 'length');
    const chunks = await collect(await client.completions.create({ ...params, stream: true }));
    assert.equal(chunks.map((c) => c.choices[0].text).join(''), ONCE.greedy_text);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
});

test('completions: stream concatenates to the non-streamed text; include_usage adds a usage chunk', async () => {
    const params = { model: MODEL, prompt: ONCE.prompt, max_tokens: ONCE_N, temperature: 0 };
    const whole = await client.completions.create(params);
    const chunks = await collect(await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }));
    assert.ok(chunks.length >= 3, `${chunks.length} chunks`);
    for (const c of chunks) {
        checkEnvelope(c, 'text_completion');
        assert.equal(c.id, chunks[0].id);
    }
    const last = chunks.at(-1);
    const body = chunks.slice(0, -1);
    // the usage chunk: empty choices, the usage of the whole request
    assert.deepEqual(last.choices, []);
    assert.equal(checkUsage(last.usage, ONCE.n_tokens, ONCE_N), ONCE.n_tokens - 1);
    checkCacheReport(last.kvpin_cache, last.usage);
    for (const c of body) {
        assert.equal(c.choices.length, 1);
        assert.equal(c.choices[0].index, 0);
        assert.ok(c.usage === undefined || c.usage === null, 'usage only on the last chunk');
    }
    assert.equal(body.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
    assert.equal(body.map((c) => c.choices[0].text).join(''), ONCE.greedy_text);
    const finishes = body.map((c) => c.choices[0].finish_reason).filter((f) => f !== null && f !== undefined);
    assert.deepEqual(finishes, ['length']);
    assert.equal(body.at(-1).choices[0].finish_reason, 'length');
    // without include_usage: no usage anywhere
    const plain = await collect(await client.completions.create({ ...params, stream: true }));
    assert.ok(plain.every((c) => c.usage === undefined || c.usage === null));
    assert.ok(plain.every((c) => c.choices.length === 1));
    assert.equal(plain.map((c) => c.choices[0].text).join(''), ONCE.greedy_text);
});

/* ---- chat ----------------------------------------------------------------- */

const STORY = [
    { role: 'system', content: 'You tell short stories about a dog named Max.' },
    { role: 'user', content: 'Once upon a time' },
];

test('chat: non-stream shape, prompt is the ChatML rendering, greedy repeat is identical', async () => {
    const params = { model: MODEL, messages: STORY, max_tokens: 24, temperature: 0 };
    const a = await client.chat.completions.create(params);
    checkEnvelope(a, 'chat.completion');
    assert.equal(a.choices.length, 1);
    const c = a.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.ok(typeof c.message.content === 'string' && c.message.content.length > 0);
    assert.equal(c.finish_reason, 'length');
    checkUsage(a.usage, (await tokenize(chatml(STORY))).length, 24);
    checkCacheReport(a.kvpin_cache, a.usage);
    const b = await client.chat.completions.create(params);
    assert.equal(b.choices[0].message.content, c.message.content);
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
    // max_completion_tokens is the same limit
    const d = await client.chat.completions.create({ model: MODEL, messages: STORY, max_completion_tokens: 24, temperature: 0 });
    assert.equal(d.choices[0].message.content, c.message.content);
    assert.equal(d.usage.completion_tokens, 24);
});

test('chat: stream has the role first, deltas concatenate to the non-streamed content', async () => {
    const params = { model: MODEL, messages: STORY, max_tokens: 24, temperature: 0 };
    const whole = (await client.chat.completions.create(params)).choices[0].message.content;
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    const chunks = await collect(stream);
    for (const c of chunks) {
        checkEnvelope(c, 'chat.completion.chunk');
        assert.equal(c.id, chunks[0].id);
    }
    const body = chunks.slice(0, -1);
    assert.equal(body[0].choices[0].delta.role, 'assistant');
    assert.ok(body.slice(1).every((c) => c.choices[0].delta.role === undefined), 'the role is sent once');
    assert.equal(body.map((c) => c.choices[0].delta.content ?? '').join(''), whole);
    const finishes = body.map((c) => c.choices[0].finish_reason).filter((f) => f !== null && f !== undefined);
    assert.deepEqual(finishes, ['length']);
    assert.equal(body.at(-1).choices[0].finish_reason, 'length');
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    checkUsage(last.usage, undefined, 24);
    assert.equal(last.usage.prompt_tokens_details.cached_tokens, last.usage.prompt_tokens - 1);
    checkCacheReport(last.kvpin_cache, last.usage);
    // the stream helper of the client assembles the same message
    const helper = client.chat.completions.stream(params);
    const final = await helper.finalChatCompletion();
    assert.equal(final.choices[0].message.content, whole);
    assert.equal(final.choices[0].finish_reason, 'length');
});

test('chat: a stop string ends the content before it, streamed and not', async () => {
    const whole = (await client.chat.completions.create({ model: MODEL, messages: STORY, max_tokens: 24, temperature: 0 }))
        .choices[0].message.content;
    const at = Math.floor(whole.length / 2);
    const stop = whole.slice(at, at + 3);
    const want = whole.slice(0, whole.indexOf(stop));
    const params = { model: MODEL, messages: STORY, max_tokens: 24, temperature: 0, stop };
    const r = await client.chat.completions.create(params);
    assert.equal(r.choices[0].message.content, want);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const chunks = await collect(await client.chat.completions.create({ ...params, stream: true }));
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), want);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
});

test('chat: content as text parts is the parts joined by newlines', async () => {
    const parts = [{ role: 'user', content: [{ type: 'text', text: 'Once upon a time' }, { type: 'text', text: 'there was a cat.' }] }];
    const joined = [{ role: 'user', content: 'Once upon a time\nthere was a cat.' }];
    const a = await client.chat.completions.create({ model: MODEL, messages: parts, max_tokens: 12, temperature: 0 });
    assert.equal(a.usage.prompt_tokens, (await tokenize(chatml(joined))).length);
    const b = await client.chat.completions.create({ model: MODEL, messages: joined, max_tokens: 12, temperature: 0 });
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
});

test('chat: concurrent requests give the same greedy text as one at a time', async () => {
    const starts = ['Once upon a time', 'Lily and Tom', 'The big red ball', 'One day, a bird'];
    const req = (s) => ({ model: MODEL, messages: [{ role: 'user', content: s }], max_tokens: 20, temperature: 0 });
    const alone = [];
    for (const s of starts) alone.push((await client.chat.completions.create(req(s))).choices[0].message.content);
    const together = await Promise.all(starts.map((s) => client.chat.completions.create(req(s))));
    assert.deepEqual(together.map((r) => r.choices[0].message.content), alone);
});

test('chat: a 4-turn agent loop reuses each previous turn from the cache', async () => {
    let messages = [
        { role: 'system', content: 'You are a storyteller. Every story has a cat named Tom and a red ball.' },
        { role: 'user', content: 'Tell me a story.' },
    ];
    const asks = ['And then what happened?', 'Where did the ball go?', 'How did it end?'];
    let prev = null;
    for (let turn = 0; turn < 4; turn++) {
        const { data: r, response } = await client.chat.completions
            .create({ model: MODEL, messages, max_tokens: 16, temperature: 0 })
            .withResponse();
        assert.equal(response.status, 200);
        const answer = r.choices[0].message.content;
        const ids = await tokenize(chatml(messages));
        const cached = checkUsage(r.usage, ids.length, undefined);
        checkCacheReport(r.kvpin_cache, r.usage);
        if (prev) {
            // the new prompt starts with the whole previous prompt (ChatML only appends) ...
            assert.equal(commonPrefix(ids, prev.ids), prev.ids.length, `turn ${turn + 1}: previous prompt is a token prefix`);
            // ... so the cache gives at least that, at most the previous prompt and answer
            assert.ok(cached >= prev.usage.prompt_tokens, `turn ${turn + 1}: cached ${cached} < ${prev.usage.prompt_tokens}`);
            assert.ok(cached <= prev.usage.prompt_tokens + prev.usage.completion_tokens,
                `turn ${turn + 1}: cached ${cached} beyond the previous prompt + answer`);
            assert.ok(cached > prev.cached, `turn ${turn + 1}: cached_tokens grows (${prev.cached} -> ${cached})`);
            assert.ok(!['cold', 'evicted'].includes(r.kvpin_cache.cause), `turn ${turn + 1}: ${r.kvpin_cache.cause}`);
            assert.ok(r.kvpin_cache.diverged_at_token >= cached);
        }
        prev = { ids, usage: r.usage, cached };
        if (turn < 3) messages = [...messages, { role: 'assistant', content: answer }, { role: 'user', content: asks[turn] }];
    }
});

test('a client that aborts a stream frees its sequence; the server keeps answering', async () => {
    const metric = async (name) => {
        const r = await fetch(URL_MAIN + '/metrics', { headers: { Authorization: 'Bearer ' + API_KEY } });
        const m = (await r.text()).match(new RegExp('^' + name + ' (\\S+)$', 'm'));
        assert.ok(m, name);
        return Number(m[1]);
    };
    // The server learns that the client left when a write fails, and then
    // cancels the request, which had about CTX tokens left to generate. On a
    // machine too busy to notice before the generation ends, the request
    // finishes instead: up to 3 tries, one of them must be cancelled.
    let cancelledOnce = false;
    for (let attempt = 0; attempt < 3 && !cancelledOnce; attempt++) {
        const cancelled0 = await metric('kvpin_generations_cancelled_total');
        const ended0 = await metric('kvpin_generations_finished_total');
        const ac = new AbortController();
        const stream = await client.completions.create(
            { model: MODEL, prompt: '', max_tokens: CTX - 8, temperature: 0, ignore_eos: true, stream: true },
            { signal: ac.signal });
        let got = '';
        for await (const c of stream) { // the client ends the iteration quietly on abort
            got += c.choices[0]?.text ?? '';
            if (got.length > 20) ac.abort();
        }
        assert.ok(got.length > 20 && LLAMA2C.startsWith(got), 'the text before the abort is the greedy story');
        assert.ok(got.length < LLAMA2C.length, 'the stream stopped early');
        // the request ends (in 60 s even if it runs to its end under a sanitizer)
        let health, ended;
        for (let i = 0; i < 600; i++) {
            health = await (await fetch(URL_MAIN + '/health')).json();
            ended = await metric('kvpin_generations_finished_total');
            if (health.running === 0 && ended > ended0) break;
            await new Promise((r) => setTimeout(r, 100));
        }
        assert.equal(ended, ended0 + 1, 'the aborted request ended');
        assert.equal(health.running, 0);
        assert.equal(health.queued, 0);
        const cancelled = await metric('kvpin_generations_cancelled_total');
        assert.ok(cancelled === cancelled0 || cancelled === cancelled0 + 1);
        cancelledOnce = cancelled === cancelled0 + 1;
    }
    assert.ok(cancelledOnce, 'an aborted stream is cancelled');
    const r = await client.completions.create({ model: MODEL, prompt: ONCE.prompt, max_tokens: ONCE_N, temperature: 0 });
    assert.equal(r.choices[0].text, ONCE.greedy_text);
});

/* ---- tools (qwen2.5 template) --------------------------------------------- */

const WEATHER = {
    type: 'function',
    function: {
        name: 'get_weather',
        description: 'The current weather in a city',
        parameters: {
            type: 'object',
            properties: { city: { type: 'string', description: 'City name' }, unit: { type: 'string', enum: ['c', 'f'] } },
            required: ['city'],
        },
    },
};
/* The same tool, every object's keys in another order. */
const WEATHER_REORDERED = {
    function: {
        parameters: {
            required: ['city'],
            properties: { unit: { enum: ['c', 'f'], type: 'string' }, city: { description: 'City name', type: 'string' } },
            type: 'object',
        },
        description: 'The current weather in a city',
        name: 'get_weather',
    },
    type: 'function',
};
const TIME = {
    type: 'function',
    function: { name: 'get_time', description: 'The time now', parameters: { type: 'object', properties: {} } },
};
const ASK = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('tools: accepted and rendered; key order and whitespace do not change the prompt', async () => {
    const base = { model: MODEL, messages: ASK, max_tokens: 4, temperature: 0 };
    const none = await tools.chat.completions.create(base);
    const one = await tools.chat.completions.create({ ...base, tools: [WEATHER] });
    const two = await tools.chat.completions.create({ ...base, tools: [WEATHER, TIME] });
    checkEnvelope(one, 'chat.completion');
    assert.ok(one.usage.prompt_tokens > none.usage.prompt_tokens, 'the tools are in the prompt');
    assert.ok(two.usage.prompt_tokens > one.usage.prompt_tokens, 'a second tool adds to the prompt');
    // the same tool with its keys reordered: the same prompt, all but the last token cached
    const re = await tools.chat.completions.create({ ...base, tools: [WEATHER_REORDERED] });
    assert.equal(re.usage.prompt_tokens, one.usage.prompt_tokens);
    assert.equal(re.usage.prompt_tokens_details.cached_tokens, re.usage.prompt_tokens - 1);
    assert.equal(re.kvpin_cache.cause, 'hit');
    assert.equal(re.choices[0].message.content, one.choices[0].message.content);
    // and sent by hand with other whitespace (the client would re-serialise it)
    const raw = JSON.stringify({ ...base, tools: [WEATHER_REORDERED] }, null, 3).replace(/":/g, '" :\t');
    const ws = await post(URL_TOOLS, '/v1/chat/completions', raw);
    assert.equal(ws.usage.prompt_tokens, one.usage.prompt_tokens);
    assert.equal(ws.usage.prompt_tokens_details.cached_tokens, ws.usage.prompt_tokens - 1);
});

test('tools: an assistant tool call and a tool result render; arguments are canonical', async () => {
    const call = (args) => [
        ...ASK,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: args } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21, "unit": "c"}' },
    ];
    const base = { model: MODEL, max_tokens: 4, temperature: 0, tools: [WEATHER] };
    const before = await tools.chat.completions.create({ ...base, messages: ASK });
    const a = await tools.chat.completions.create({ ...base, messages: call('{"city": "Paris", "unit": "c"}') });
    checkEnvelope(a, 'chat.completion');
    assert.equal(a.choices[0].message.role, 'assistant');
    assert.ok(a.usage.prompt_tokens > before.usage.prompt_tokens + 10, 'the call and the result are in the prompt');
    // the same arguments with other spacing and key order: the same prompt, reused
    const b = await tools.chat.completions.create({ ...base, messages: call('{ "unit" : "c",\n  "city":"Paris" }') });
    assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
});

test('tools: forcing a call without tools and malformed tools are 400 naming the field', async () => {
    const base = { model: MODEL, messages: ASK, max_tokens: 1 };
    await rejectsWith(tools.chat.completions.create({ ...base, tool_choice: 'required' }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'tool_choice'));
    await rejectsWith(tools.chat.completions.create({ ...base, tools: [1] }), OpenAI.BadRequestError, 400,
        (e) => assert.match(e.param ?? '', /^tools/, `param ${e.param}`));
});

/* ---- tools on a template without tool syntax (chatml: the generic format) -- */

/* A choice's message in the OpenAI reference shape: content a string (or
 * null next to tool calls), tool_calls {id, type: function, function: {name,
 * arguments: a JSON object's text}}, finish_reason tool_calls exactly then. */
function checkToolReply(choice) {
    const m = choice.message;
    assert.equal(m.role, 'assistant');
    if (m.tool_calls && m.tool_calls.length) {
        assert.equal(choice.finish_reason, 'tool_calls');
        for (const c of m.tool_calls) {
            assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
            assert.equal(c.type, 'function');
            assert.equal(typeof c.function.name, 'string');
            assert.equal(typeof JSON.parse(c.function.arguments), 'object');
        }
    } else {
        assert.equal(typeof m.content, 'string');
        assert.ok(['stop', 'length'].includes(choice.finish_reason), choice.finish_reason);
    }
}

test('tools on chatml: accepted, well-formed, streamed the same; a call and its result render', async () => {
    const base = { model: MODEL, messages: ASK, max_tokens: 12, temperature: 0 };
    const none = await client.chat.completions.create(base);
    const one = await client.chat.completions.create({ ...base, tools: [WEATHER, TIME] });
    checkEnvelope(one, 'chat.completion');
    checkToolReply(one.choices[0]);
    assert.ok(one.usage.prompt_tokens > none.usage.prompt_tokens + 50, 'the tool block is in the prompt');
    // keys reordered: the same prompt, all but the last token cached
    const re = await client.chat.completions.create({ ...base, tools: [WEATHER_REORDERED, TIME] });
    assert.equal(re.usage.prompt_tokens, one.usage.prompt_tokens);
    assert.equal(re.usage.prompt_tokens_details.cached_tokens, re.usage.prompt_tokens - 1);
    // streamed through the client: the same message as unstreamed
    const stream = await client.chat.completions.create({ ...base, tools: [WEATHER, TIME], stream: true });
    let content = '', finish = null;
    const calls = [];
    for await (const chunk of stream) {
        const ch = chunk.choices[0];
        if (!ch) continue;
        content += ch.delta.content ?? '';
        for (const t of ch.delta.tool_calls ?? []) {
            calls[t.index] ??= { id: t.id, name: t.function?.name, arguments: '' };
            calls[t.index].arguments += t.function?.arguments ?? '';
        }
        finish = ch.finish_reason ?? finish;
    }
    assert.equal(finish, one.choices[0].finish_reason);
    assert.equal(content, one.choices[0].message.content ?? '');
    assert.deepEqual(calls.map((c) => [c.name, c.arguments]),
        (one.choices[0].message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]));
    // a call in the history and its result; tool_choice none renders no tools
    const hist = [
        ...ASK,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
    ];
    const h = await client.chat.completions.create({ ...base, messages: hist, tools: [WEATHER, TIME] });
    checkToolReply(h.choices[0]);
    assert.ok(h.usage.prompt_tokens > one.usage.prompt_tokens + 20, 'the call and the result are in the prompt');
    assert.ok(h.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens - 5,
        'the turn before is reused (up to the assistant opener)');
    const off = await client.chat.completions.create({ ...base, tools: [WEATHER], tool_choice: 'none' });
    assert.equal(off.usage.prompt_tokens, none.usage.prompt_tokens);
});

/* ---- the request policy ------------------------------------------------------ */

/* The fields of OpenAI's chat/completions and completions references that
 * kvpin does not act on: sent through the real client, every one is
 * accepted, and named in x-kvpin-ignored-fields. */
const CHAT_NOT_ACTED = {
    reasoning_effort: 'low', safety_identifier: 'user-1', service_tier: 'auto', verbosity: 'low',
    modalities: ['text', 'audio'], prediction: { type: 'content', content: 'Hello' },
    audio: { voice: 'alloy', format: 'wav' }, web_search_options: {}, store: true, metadata: { team: 'a' },
    user: 'someone', logit_bias: { '5': 1 }, parallel_tool_calls: false,
};
const COMPL_NOT_ACTED = { echo: true, best_of: 2, suffix: 'The end.', logit_bias: { '5': 1 }, user: 'someone' };
const ignoredOf = (response) => (response.headers.get('x-kvpin-ignored-fields') ?? '').split(',').filter(Boolean).sort();

test('policy: every OpenAI field kvpin does not act on is accepted and named in x-kvpin-ignored-fields', async () => {
    const base = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
    let { data: r, response } = await client.chat.completions.create({ ...base, ...CHAT_NOT_ACTED }).withResponse();
    assert.equal(response.status, 200);
    assert.deepEqual(ignoredOf(response), Object.keys(CHAT_NOT_ACTED).sort());
    assert.equal(r.choices.length, 1);
    ({ response } = await client.completions
        .create({ model: MODEL, prompt: 'Once', max_tokens: 2, ...COMPL_NOT_ACTED }).withResponse());
    assert.deepEqual(ignoredOf(response), Object.keys(COMPL_NOT_ACTED).sort());
    // the cache fields and llama.cpp's fields are acted on: not named
    ({ data: r, response } = await client.chat.completions.create({
        ...base, prompt_cache_key: 'node-agent', n_predict: 2, cache_prompt: true, add_generation_prompt: true,
        chat_template_kwargs: { add_generation_prompt: true },
    }).withResponse());
    assert.deepEqual(ignoredOf(response), []);
    assert.equal(r.kvpin_cache.prompt_cache_key, 'node-agent');
    // unknown fields, top level and inside messages: accepted and named by path
    ({ response } = await client.chat.completions.create({
        ...base, no_such_field: 1,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi', cache_control: { type: 'ephemeral' } }] }],
    }).withResponse());
    assert.deepEqual(ignoredOf(response), ['messages[0].content[0].cache_control', 'no_such_field']);
    // a stream carries the header too
    const stream = await client.chat.completions.create({ ...base, user: 'u', stream: true }).withResponse();
    assert.deepEqual(ignoredOf(stream.response), ['user']);
    for await (const _ of stream.data); // eslint-disable-line no-unused-vars
});

test('policy: the developer role and text parts give the prompt tokens of system and string messages', async () => {
    const plain = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello' }, { role: 'user', content: 'Bye' }];
    const dev = [{ ...plain[0], role: 'developer' }, ...plain.slice(1)];
    const parts = dev.map((m) => ({ ...m, content: [{ type: 'text', text: m.content }] }));
    const ids = async (messages) => (await client.chat.completions.create(
        { model: MODEL, messages, max_tokens: 1, temperature: 0, return_token_ids: true })).choices[0].prompt_token_ids;
    const want = await ids(plain);
    assert.deepEqual(await ids(dev), want);
    assert.deepEqual(await ids(parts), want);
    await rejectsWith(client.chat.completions.create({
        model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: 'Look:' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }],
    }), OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'messages[0].content[1].type'));
});

/* ---- errors ----------------------------------------------------------------- */

test('errors: bad fields are 400 naming the param; an unknown endpoint is 404', async () => {
    const base = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
    await rejectsWith(client.chat.completions.create({ ...base, temperature: 5 }), OpenAI.BadRequestError, 400, (e) => {
        assert.equal(e.param, 'temperature');
        assert.equal(e.type, 'invalid_request_error');
        assert.equal(e.error.param, 'temperature');
    });
    await rejectsWith(client.completions.create({ model: MODEL, prompt: 'Hi', temperature: 5, stream: true }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'temperature'));
    await rejectsWith(client.chat.completions.create({ ...base, messages: [{ role: 'wizard', content: 'Hi' }] }),
        OpenAI.BadRequestError, 400, (e) => assert.match(e.param ?? '', /^messages/));
    await rejectsWith(client.chat.completions.create({ ...base, n: 17 }), OpenAI.BadRequestError, 400,
        (e) => assert.equal(e.param, 'n'));
    await rejectsWith(client.chat.completions.create({ ...base, logprobs: true, top_logprobs: 21 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'top_logprobs'));
    await rejectsWith(client.chat.completions.create({ ...base, response_format: { type: 'xml' } }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'response_format'));
    await rejectsWith(client.chat.completions.create({ ...base, stream_options: { include_usage: true } }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'stream_options'));
    await rejectsWith(client.chat.completions.create({ ...base, max_tokens: 'many' }), OpenAI.BadRequestError, 400,
        (e) => assert.equal(e.param, 'max_tokens'));
    // an endpoint kvpin does not serve
    await rejectsWith(client.images.generate({ model: MODEL, prompt: 'a cat' }), OpenAI.NotFoundError, 404);
});

test('embeddings: the official client reads /v1/embeddings (unit vectors of the model\'s width)', async () => {
    /* undefined: the client asks for base64 and decodes the floats itself */
    for (const encoding_format of ['float', undefined]) {
        const r = await client.embeddings.create({ model: MODEL, input: ['Hi', 'Once upon a time'], encoding_format });
        assert.equal(r.object, 'list');
        assert.equal(r.data.length, 2);
        for (const d of r.data) {
            const v = Array.from(d.embedding);
            assert.equal(v.length, 64);
            const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
            assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
        }
        assert.ok(r.usage.prompt_tokens > 2);
    }
});

test('errors: a prompt longer than the context is 400 context_length_exceeded', async () => {
    const long = 'Once upon a time '.repeat(Math.ceil(CTX / 4) + 20);
    assert.ok((await tokenize(long)).length > CTX);
    await rejectsWith(client.completions.create({ model: MODEL, prompt: long, max_tokens: 1 }), OpenAI.BadRequestError, 400,
        (e) => {
            assert.equal(e.code, 'context_length_exceeded');
            assert.equal(e.param, 'prompt');
        });
    await rejectsWith(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: long }], max_tokens: 1 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.code, 'context_length_exceeded'));
    // token ids: one more than the context is refused, one less fits with a token to generate
    const ids = (n) => [ONCE.tokens[0], ...new Array(n - 1).fill(ONCE.tokens[1])];
    await rejectsWith(client.completions.create({ model: MODEL, prompt: ids(CTX + 1), max_tokens: 1 }), OpenAI.BadRequestError, 400,
        (e) => assert.equal(e.code, 'context_length_exceeded'));
    const fits = await client.completions.create({ model: MODEL, prompt: ids(CTX - 1), max_tokens: 1, temperature: 0 });
    checkUsage(fits.usage, CTX - 1, 1);
    // the server still answers
    const r = await client.completions.create({ model: MODEL, prompt: ONCE.prompt, max_tokens: 4, temperature: 0 });
    assert.ok(ONCE.greedy_text.startsWith(r.choices[0].text));
});

test('errors: a wrong API key is 401 AuthenticationError, the right one works', async () => {
    for (const key of ['wrong', API_KEY + 'x', API_KEY.slice(0, -1)]) {
        const bad = new OpenAI({ baseURL: URL_MAIN + '/v1', apiKey: key, maxRetries: 0 });
        await rejectsWith(bad.models.list(), OpenAI.AuthenticationError, 401);
        await rejectsWith(bad.chat.completions.create({ model: MODEL, messages: STORY, max_tokens: 1 }),
            OpenAI.AuthenticationError, 401, (e) => assert.equal(e.code, 'invalid_api_key'));
    }
    const good = new OpenAI({ baseURL: URL_MAIN + '/v1', apiKey: API_KEY, maxRetries: 0 });
    assert.equal((await good.models.list()).data[0].id, MODEL);
});

/* ---- sampling with a seed ------------------------------------------------------ */

test('seed: the same seed gives the same text at temperature 1; seeds differ', async () => {
    const req = (seed) => client.completions.create({ model: MODEL, prompt: ONCE.prompt, max_tokens: 24, temperature: 1, seed });
    const a = (await req(7)).choices[0].text;
    const b = (await req(7)).choices[0].text;
    assert.equal(a, b);
    const texts = new Set();
    for (const s of [1, 2, 3]) texts.add((await req(s)).choices[0].text);
    assert.ok(texts.size >= 2, `3 seeds gave ${texts.size} distinct texts`);
    const chat = (seed) => client.chat.completions.create({ model: MODEL, messages: STORY, max_tokens: 16, temperature: 1, seed });
    assert.equal((await chat(11)).choices[0].message.content, (await chat(11)).choices[0].message.content);
});

/* ---- n and logprobs ------------------------------------------------------ */

test('n: 4 choices from one prefill; usage counts the prompt once; choice i is seed + i alone', async () => {
    const prompt = 'A small dog ran to the park to find a friend.';
    const P = (await tokenize(prompt)).length;
    const req = { model: MODEL, prompt, max_tokens: 8, temperature: 1, seed: 40, ignore_eos: true };
    const r = await client.completions.create({ ...req, n: 4 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(r.usage.prompt_tokens, P);
    assert.equal(r.usage.completion_tokens, 4 * 8);
    checkUsage(r.usage, P, 32);
    for (const i of [0, 3]) {
        const one = await client.completions.create({ ...req, seed: 40 + i });
        assert.equal(one.choices[0].text, r.choices[i].text, `choice ${i} vs seed ${40 + i}`);
    }
    /* chat, streamed: every chunk names its choice; the deltas per index give the non-streamed contents */
    const creq = { model: MODEL, messages: STORY, max_tokens: 6, temperature: 1, seed: 5, n: 2 };
    const whole = await client.chat.completions.create(creq);
    const chunks = await collect(await client.chat.completions.create({ ...creq, stream: true,
        stream_options: { include_usage: true } }));
    const got = ['', ''];
    const finishes = [0, 0];
    for (const c of chunks)
        for (const ch of c.choices) {
            got[ch.index] += ch.delta.content ?? '';
            if (ch.finish_reason) finishes[ch.index]++;
        }
    assert.deepEqual(got, whole.choices.map((c) => c.message.content));
    assert.deepEqual(finishes, [1, 1]);
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
    assert.equal(last.usage.completion_tokens, whole.usage.completion_tokens);
});

test('logprobs: completions (legacy shape) and chat (content[]), streamed too', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: ONCE.prompt, max_tokens: 5, temperature: 0,
        logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 5);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    assert.equal(lp.token_logprobs.length, 5);
    assert.equal(lp.text_offset[0], 0);
    lp.top_logprobs.forEach((top, k) => {
        const v = Object.values(top);
        assert.ok(v.length >= 1 && v.length <= 3);
        assert.deepEqual([...v].sort((a, b) => b - a), v, 'top_logprobs most likely first');
        assert.ok(lp.token_logprobs[k] <= 0 && lp.token_logprobs[k] <= v[0] + 1e-6);
        assert.equal(top[lp.tokens[k]], lp.token_logprobs[k], 'greedy: the token is the most likely');
    });
    const c = await client.chat.completions.create({ model: MODEL, messages: STORY, max_tokens: 5, temperature: 1,
        seed: 3, logprobs: true, top_logprobs: 2 });
    const content = c.choices[0].logprobs.content;
    assert.equal(content.map((e) => e.token).join(''), c.choices[0].message.content);
    for (const e of content) {
        assert.equal(typeof e.logprob, 'number');
        assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
        assert.equal(e.top_logprobs.length, 2);
        assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.logprob <= e.top_logprobs[0].logprob + 1e-6);
    }
    const chunks = await collect(await client.chat.completions.create({ model: MODEL, messages: STORY, max_tokens: 5,
        temperature: 1, seed: 3, logprobs: true, top_logprobs: 2, stream: true }));
    const streamed = chunks.flatMap((k) => k.choices.flatMap((ch) => ch.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
});
