/*
 * reasoning.test.mjs - a reasoning model's thinking through the three chat
 * APIs, read by the official `openai` and `@anthropic-ai/sdk` clients.
 *
 * tests/clients/e2e_agent_apis.sh starts the server and runs this file with
 * `node --test`; KVPIN_THINK_URL names the bundled stories260K model served
 * with the qwen3 template (reasoning between <think> and </think>), and
 * KVPIN_INLINE_URL the same with --reasoning-format none.
 *
 * The model is made to write a known reply with a GBNF grammar (kvpin's
 * `grammar` field, on every API): "<think>\n" R "\n</think>\n\n" C. What a
 * client must then see comes from the APIs' references, not from kvpin:
 * chat completions' message.reasoning_content = R and content = C (the
 * field llama.cpp's server and DeepSeek's API use; streamed as
 * delta.reasoning_content); a Messages `thinking` block R before the text
 * block C (streamed as thinking_delta, assembled by the SDK's
 * finalMessage); a Responses `reasoning` item with one reasoning_text part
 * R before the message item C (assembled by the SDK's ResponseStream,
 * which checks every event's item and part). Sent back, the reasoning
 * reaches the template: Qwen 3 renders an assistant turn's reasoning after
 * the last user message (a tool-call loop), so the prompt grows by it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL_THINK = process.env.KVPIN_THINK_URL;
const URL_INLINE = process.env.KVPIN_INLINE_URL;
if (!URL_THINK || !URL_INLINE) throw new Error('set KVPIN_THINK_URL and KVPIN_INLINE_URL (e2e_agent_apis.sh does)');

const openai = new OpenAI({ baseURL: URL_THINK + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120_000 });
const inline = new OpenAI({ baseURL: URL_INLINE + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120_000 });
const anthropic = new Anthropic({ baseURL: URL_THINK, apiKey: 'x', maxRetries: 0, timeout: 120_000 });

const R = 'The user greets me. I answer briefly.';
const C = 'Hello there.';
const gbnf = (r, c) => `root ::= ${JSON.stringify('<think>\n' + r + '\n</think>\n\n' + c)}`;
const GRAMMAR = gbnf(R, C);
const MSGS = [{ role: 'user', content: 'Hi' }];

test('chat completions: reasoning_content apart from the content', async () => {
    const r = await openai.chat.completions.create({ model: 'm', messages: MSGS, max_tokens: 80, grammar: GRAMMAR });
    assert.equal(r.choices[0].message.reasoning_content, R);
    assert.equal(r.choices[0].message.content, C);
    assert.equal(r.choices[0].finish_reason, 'stop');
});

test('chat completions streamed: reasoning deltas, then content deltas', async () => {
    const s = await openai.chat.completions.create({ model: 'm', messages: MSGS, max_tokens: 80, grammar: GRAMMAR,
                                                     stream: true });
    let reasoning = '', content = '', contentBeforeReasoningEnded = false;
    for await (const ch of s) {
        const d = ch.choices[0]?.delta ?? {};
        if (d.reasoning_content) {
            reasoning += d.reasoning_content;
            if (content) contentBeforeReasoningEnded = true;
        }
        if (d.content) content += d.content;
    }
    assert.equal(reasoning, R);
    assert.equal(content, C);
    assert.equal(contentBeforeReasoningEnded, false, 'reasoning comes first');
});

test('--reasoning-format none: the reply as written, in the content', async () => {
    const r = await inline.chat.completions.create({ model: 'm', messages: MSGS, max_tokens: 80, grammar: GRAMMAR });
    assert.equal(r.choices[0].message.content, '<think>\n' + R + '\n</think>\n\n' + C);
    assert.equal(r.choices[0].message.reasoning_content, undefined);
});

test('Messages: a thinking block before the text, whole and streamed', async () => {
    const m = await anthropic.messages.create({ model: 'm', max_tokens: 80, messages: MSGS, grammar: GRAMMAR });
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(m.content[0].thinking, R);
    assert.equal(typeof m.content[0].signature, 'string');
    assert.equal(m.content[1].text, C);
    const stream = anthropic.messages.stream({ model: 'm', max_tokens: 80, messages: MSGS, grammar: GRAMMAR });
    let thinking = '';
    stream.on('thinking', (delta) => { thinking += delta; });
    const f = await stream.finalMessage();
    assert.deepEqual(f.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(f.content[0].thinking, R);
    assert.equal(f.content[1].text, C);
    assert.equal(thinking, R);
});

test('Responses: a reasoning item before the message, whole and streamed', async () => {
    const r = await openai.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 80, grammar: GRAMMAR });
    assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'message']);
    assert.deepEqual(r.output[0].content, [{ type: 'reasoning_text', text: R }]);
    assert.equal(r.output_text, C);
    const stream = openai.responses.stream({ model: 'm', input: 'Hi', max_output_tokens: 80, grammar: GRAMMAR });
    let deltas = '';
    stream.on('response.reasoning_text.delta', (e) => { deltas += e.delta; });
    const f = await stream.finalResponse();
    assert.deepEqual(f.output.map((i) => i.type), ['reasoning', 'message']);
    assert.equal(f.output[0].content[0].text, R);
    assert.equal(f.output[1].content[0].text, C);
    assert.equal(deltas, R);
    /* the stored conversation keeps the reasoning: continued, it is accepted
     * (and the turn before it comes from the cache) */
    const next = await openai.responses.create({ model: 'm', previous_response_id: f.id, input: 'And?',
                                                  max_output_tokens: 4 });
    assert.equal(next.status, 'incomplete'); /* max_output_tokens ended it */
    assert.ok(next.usage.input_tokens_details.cached_tokens > 0);
});

/* A tool-call loop: the assistant turn with reasoning and a call comes
 * after the last user message, where Qwen 3's template renders the
 * reasoning: sent back, it lengthens the prompt. */
test('reasoning sent back reaches the template, through every API', async () => {
    const call = { id: 'call_1', type: 'function', function: { name: 'get_time', arguments: '{}' } };
    const chat = (reasoning) => openai.chat.completions.create({
        model: 'm', max_tokens: 1,
        messages: [...MSGS, { role: 'assistant', content: null, tool_calls: [call], reasoning_content: reasoning },
                   { role: 'tool', tool_call_id: 'call_1', content: '12:00' }],
        tools: [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }],
    });
    const without = (await chat(undefined)).usage.prompt_tokens;
    const withR = (await chat(R)).usage.prompt_tokens;
    assert.ok(withR > without, `prompt with reasoning ${withR} > without ${without}`);

    const messages = (thinking) => anthropic.messages.create({
        model: 'm', max_tokens: 1,
        tools: [{ name: 'get_time', input_schema: { type: 'object', properties: {} } }],
        messages: [...MSGS,
                   { role: 'assistant', content: [...(thinking ? [{ type: 'thinking', thinking, signature: '' }] : []),
                                                  { type: 'tool_use', id: 'toolu_1', name: 'get_time', input: {} }] },
                   { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '12:00' }] }],
    });
    const mWithout = (await messages(null)).usage;
    const mWith = (await messages(R)).usage;
    const total = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
    assert.equal(total(mWith) - total(mWithout), withR - without, 'the same rendering as chat completions');

    const responses = (reasoning) => openai.responses.create({
        model: 'm', max_output_tokens: 1,
        tools: [{ type: 'function', name: 'get_time', parameters: { type: 'object', properties: {} } }],
        input: [{ role: 'user', content: 'Hi' },
                ...(reasoning ? [{ type: 'reasoning', id: 'rs_1', summary: [],
                                   content: [{ type: 'reasoning_text', text: reasoning }] }] : []),
                { type: 'function_call', call_id: 'call_1', name: 'get_time', arguments: '{}' },
                { type: 'function_call_output', call_id: 'call_1', output: '12:00' }],
    });
    const rWithout = (await responses(null)).usage.input_tokens;
    const rWith = (await responses(R)).usage.input_tokens;
    assert.equal(rWith - rWithout, withR - without, 'the same rendering as chat completions');
});

test('a reply cut inside its reasoning is all reasoning', async () => {
    /* the same tokens as written (the inline server), then split */
    for (const n of [4, 12, 20]) {
        const ask = { model: 'm', messages: MSGS, max_tokens: n, grammar: GRAMMAR, temperature: 0 }; /* greedy: the same tokens */
        const raw = (await inline.chat.completions.create(ask)).choices[0].message.content;
        const r = await openai.chat.completions.create(ask);
        assert.equal(r.choices[0].finish_reason, 'length');
        if (raw.startsWith('<think>')) { /* opened: all of it is reasoning */
            assert.equal(r.choices[0].message.content, '');
            assert.equal(r.choices[0].message.reasoning_content ?? '', raw.slice(7).trim());
        } else { /* not even the marker yet: text as written */
            assert.equal(r.choices[0].message.content, raw);
        }
    }
});

/* Qwen 3's template leaves out the reasoning of an answer once a user turn
 * follows it: the next turn cannot reuse the answer as the model wrote it.
 * The report says so (template_rewrites_history), and reuse stops exactly
 * where the answer began: every token of the previous prompt is reused. */
test('the cache report names the template rewriting the previous answer', async () => {
    const sys = { role: 'system', content: 'You answer questions about a long story. '.repeat(8) };
    const first = await openai.chat.completions.create({ model: 'm', messages: [sys, ...MSGS], max_tokens: 80,
                                                         grammar: GRAMMAR, temperature: 0 });
    const m = first.choices[0].message;
    const next = await openai.chat.completions.create({
        model: 'm', max_tokens: 1,
        messages: [sys, ...MSGS, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content },
                   { role: 'user', content: 'Tell me more.' }],
    });
    const c = next.kvpin_cache;
    assert.equal(c.cause, 'template_rewrites_history', c.detail);
    assert.equal(c.reused_tokens, first.usage.prompt_tokens);
    assert.match(c.advice, /enable_thinking/);
    /* the template's lines: the one writing the answer now (its content
     * alone) and the one that wrote it as the last turn (with <think>), as
     * the template text has them */
    const lines = readFileSync(new URL('../../src/serve/templates/qwen3.jinja', import.meta.url), 'utf8').split('\n');
    const at = c.detail.match(/\(template line (\d+); line (\d+) while that answer was the last turn\)/);
    assert.ok(at, c.detail);
    const now = lines[Number(at[1]) - 1], then = lines[Number(at[2]) - 1];
    assert.match(now, /\{\{-? *content *-?\}\}/, `template line ${at[1]}: ${now}`);
    assert.match(then, /<think>/, `template line ${at[2]}: ${then}`);
});
