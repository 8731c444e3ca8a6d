/*
 * toolloop.test.mjs - an agent's tool loop through the official clients
 * keeps its own cache: every turn reuses the whole previous prompt and
 * answer (kvpin's answer memory, src/serve/answers.h, and tool calls
 * generated in the bytes the template renders back).
 *
 * tests/clients/e2e_agent_apis.sh starts the server and names it:
 *
 *   KVPIN_LOOP_URL   a random-weight model with Phi-3's real vocabulary
 *                    (kvpin mkmodel --tokenizer ggml-vocab-phi-3.gguf) and
 *                    Phi-3.5's chat template (tools in the generic format)
 *
 * Per API (chat completions and Responses through `openai`, Messages
 * through `@anthropic-ai/sdk`), 10 turns: a forced tool call (tool_choice
 * required / any) whose result goes back, then text answers held to a
 * grammar of words (a random model's other tokens may hold bytes a client
 * never sees), each sent back as the client received it. The oracle is an
 * invariant: each turn's cached tokens (the usage the API reports) are at
 * least the previous turn's prompt and output tokens, less one (the end
 * token, sampled but never fed).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL_LOOP = process.env.KVPIN_LOOP_URL;
if (!URL_LOOP) throw new Error('set KVPIN_LOOP_URL (tests/clients/e2e_agent_apis.sh does)');
const openai = new OpenAI({ baseURL: URL_LOOP + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const anthropic = new Anthropic({ baseURL: URL_LOOP, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const TURNS = 10;
const WORDS = 'root ::= [a-z] [a-z ]{0,60}\n';
const PARAMS = {
    type: 'object', properties: { level: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['level'],
};
const forced = (turn) => turn % 3 === 0;

test('chat completions: a 10-turn tool loop reuses every previous token', async () => {
    const tools = [{ type: 'function', function: { name: 'set_level', description: 'Set the level', parameters: PARAMS } }];
    const messages = [{ role: 'system', content: 'You set levels.' }, { role: 'user', content: 'Level, please?' }];
    let prev = 0;
    for (let turn = 0; turn < TURNS; turn++) {
        const body = { model: 'm', messages, tools, max_tokens: forced(turn) ? 200 : 24 };
        if (forced(turn)) body.tool_choice = 'required';
        else body.grammar = WORDS;
        const r = await openai.chat.completions.create(body);
        const cached = r.usage.prompt_tokens_details?.cached_tokens ?? 0;
        if (turn) assert.ok(cached >= prev - 1, `turn ${turn}: cached ${cached} of the previous ${prev}`);
        prev = r.usage.prompt_tokens + r.usage.completion_tokens;
        const m = r.choices[0].message;
        messages.push(m);
        if (m.tool_calls?.length) messages.push({ role: 'tool', tool_call_id: m.tool_calls[0].id, content: 'done' });
        else messages.push({ role: 'user', content: 'And again?' });
        assert.equal(!!m.tool_calls?.length, forced(turn), `turn ${turn}: ${JSON.stringify(m)}`);
    }
});

test('Responses: a 10-turn tool loop reuses every previous token', async () => {
    const tools = [{ type: 'function', name: 'set_level', description: 'Set the level', parameters: PARAMS }];
    const input = [{ role: 'user', content: 'Level, please?' }];
    let prev = 0;
    for (let turn = 0; turn < TURNS; turn++) {
        const body = { model: 'm', instructions: 'You set levels.', input, tools, store: false,
            max_output_tokens: forced(turn) ? 200 : 24 };
        if (forced(turn)) body.tool_choice = 'required';
        else body.grammar = WORDS;
        const r = await openai.responses.create(body);
        const cached = r.usage.input_tokens_details?.cached_tokens ?? 0;
        if (turn) assert.ok(cached >= prev - 1, `turn ${turn}: cached ${cached} of the previous ${prev}`);
        prev = r.usage.input_tokens + r.usage.output_tokens;
        const calls = r.output.filter((o) => o.type === 'function_call');
        for (const o of r.output) {
            if (o.type === 'message') input.push({ role: 'assistant', content: r.output_text });
            if (o.type === 'function_call')
                input.push({ type: 'function_call', call_id: o.call_id, name: o.name, arguments: o.arguments });
        }
        for (const c of calls) input.push({ type: 'function_call_output', call_id: c.call_id, output: 'done' });
        if (!calls.length) input.push({ role: 'user', content: 'And again?' });
        assert.equal(calls.length > 0, forced(turn), `turn ${turn}: ${JSON.stringify(r.output)}`);
    }
});

test('Messages: a 10-turn tool loop reuses every previous token', async () => {
    const tools = [{ name: 'set_level', description: 'Set the level', input_schema: PARAMS }];
    const messages = [{ role: 'user', content: 'Level, please?' }];
    let prev = 0;
    for (let turn = 0; turn < TURNS; turn++) {
        const body = { model: 'm', system: 'You set levels.', messages, tools, max_tokens: forced(turn) ? 200 : 24 };
        if (forced(turn)) body.tool_choice = { type: 'any' };
        else body.grammar = WORDS;
        const r = await anthropic.messages.create(body);
        const cached = r.usage.cache_read_input_tokens ?? 0;
        if (turn) assert.ok(cached >= prev - 1, `turn ${turn}: cache_read ${cached} of the previous ${prev}`);
        prev = r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0) +
            (r.usage.cache_creation_input_tokens ?? 0) + r.usage.output_tokens;
        messages.push({ role: 'assistant', content: r.content });
        const uses = r.content.filter((b) => b.type === 'tool_use');
        if (uses.length)
            messages.push({ role: 'user', content: uses.map((b) => ({ type: 'tool_result', tool_use_id: b.id, content: 'done' })) });
        else messages.push({ role: 'user', content: 'And again?' });
        assert.equal(uses.length > 0, forced(turn), `turn ${turn}: ${JSON.stringify(r.content)}`);
    }
});
