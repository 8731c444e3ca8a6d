/*
 * frameworks.test.mjs - `kvpin serve` driven by the agent frameworks: the
 * Vercel AI SDK (ai + @ai-sdk/openai-compatible) and LangChain JS
 * (@langchain/openai), with zod schemas, through the calls of
 * frameworks.mjs.
 *
 * tests/clients/e2e_frameworks.sh starts the server (the bundled model with its
 * default chat template, as a new user starts it) and runs this file with
 * `node --test`; the environment names it:
 *
 *   KVPIN_URL        the server
 *   KVPIN_API_KEY    its key
 *   KVPIN_MODEL_ID   the model id to send
 *
 * What is checked comes from the frameworks and the JSON Schema standard,
 * never from kvpin's output: each call must succeed; every structured
 * output (generateObject's object, withStructuredOutput's result, every
 * tool call's arguments) must validate, with ajv, against the JSON Schema
 * the framework sent in that very request (read from the request body
 * through a recording fetch), and a forced tool choice must produce a call
 * of the forced tool. Streamed text must equal the non-streamed text of the
 * same greedy request.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import Ajv2020 from 'ajv/dist/2020.js';
import { CALLS, PET, WEATHER_RESULT, recordingFetch } from './frameworks.mjs';

const URL_MAIN = process.env.KVPIN_URL;
const API_KEY = process.env.KVPIN_API_KEY;
const MODEL = process.env.KVPIN_MODEL_ID;
if (!URL_MAIN || !API_KEY || !MODEL)
    throw new Error('set KVPIN_URL, KVPIN_API_KEY and KVPIN_MODEL_ID (tests/clients/e2e_frameworks.sh does)');

const PET_KEYS = Object.keys(PET.shape);
const byName = Object.fromEntries(CALLS.map((c) => [c.name, c]));

/* Runs the named call against kvpin; returns its result and the bodies of
 * the requests it sent. */
async function run(name) {
    const log = [];
    const ctx = { baseURL: URL_MAIN + '/v1', apiKey: API_KEY, model: MODEL, fetch: recordingFetch(log) };
    const result = await byName[name].run(ctx);
    const bodies = log.filter((r) => r.url.endsWith('/chat/completions')).map((r) => r.body);
    assert.ok(bodies.length >= 1, `${name} sent no chat completion request`);
    return { result, bodies, body: bodies[bodies.length - 1] };
}

/* Validates value against schema with ajv (draft-07, or 2020-12 when the
 * schema says so; strict, so a keyword ajv does not know is an error too). */
function validate(schema, value, what) {
    assert.equal(typeof schema, 'object', `${what}: no JSON Schema in the request`);
    const Class = String(schema.$schema ?? '').includes('2020-12') ? Ajv2020 : Ajv;
    const ajv = new Class({ strict: true, allErrors: true });
    const check = ajv.compile(schema);
    assert.ok(check(value), `${what}: ${JSON.stringify(value)} does not validate: ${ajv.errorsText(check.errors)}`);
}

/* The schema the framework sent for PET must describe it (so validation
 * against it can fail). */
function checkPetSchema(schema) {
    assert.equal(schema?.type, 'object');
    assert.deepEqual(Object.keys(schema.properties).sort(), [...PET_KEYS].sort());
}

function toolSchema(body, name) {
    const t = (body.tools ?? []).find((x) => x.function?.name === name);
    assert.ok(t, `tool ${name} is not among the tools sent (${(body.tools ?? []).map((x) => x.function?.name)})`);
    return t.function.parameters;
}

/* Every call of an AI SDK step: a tool that was sent, arguments that
 * validate against that tool's schema as sent. */
function checkVercelCalls(calls, body, what) {
    for (const c of calls) {
        assert.notEqual(c.invalid, true, `${what}: the SDK marked ${c.toolName}'s call invalid: ${c.error}`);
        validate(toolSchema(body, c.toolName), c.input, `${what}: ${c.toolName} arguments`);
    }
}

function checkLangchainCalls(msg, body, what) {
    assert.deepEqual(msg.invalid_tool_calls ?? [], [], `${what}: invalid tool calls`);
    for (const c of msg.tool_calls ?? []) validate(toolSchema(body, c.name), c.args, `${what}: ${c.name} arguments`);
}

/* ---- Vercel AI SDK -------------------------------------------------------- */

test('vercel generateObject: a zod schema (nested object, array, enum) gives an object that validates', async () => {
    const { result, body } = await run('vercel.generateObject');
    assert.equal(body.response_format?.type, 'json_schema');
    const schema = body.response_format.json_schema.schema;
    checkPetSchema(schema);
    validate(schema, result.object, 'generateObject');
    assert.equal(result.finishReason, 'stop');
});

test('vercel generateText with zod tools (toolChoice auto) succeeds; any call validates', async () => {
    const { result, body } = await run('vercel.generateText.tools');
    assert.ok(['stop', 'length', 'tool-calls'].includes(result.finishReason), `finishReason ${result.finishReason}`);
    checkVercelCalls(result.toolCalls, body, 'auto');
    if (result.toolCalls.length === 0) assert.equal(typeof result.text, 'string');
});

test("vercel generateText with toolChoice 'required': a call that validates", async () => {
    const { result, body } = await run('vercel.generateText.required');
    assert.ok(result.toolCalls.length >= 1, `no tool call (finishReason ${result.finishReason}, text ${JSON.stringify(result.text)})`);
    checkVercelCalls(result.toolCalls, body, 'required');
    assert.equal(result.finishReason, 'tool-calls');
});

test('vercel generateText with a named toolChoice: a call of that tool that validates', async () => {
    const { result, body } = await run('vercel.generateText.named');
    assert.ok(result.toolCalls.length >= 1, `no tool call (finishReason ${result.finishReason}, text ${JSON.stringify(result.text)})`);
    for (const c of result.toolCalls) assert.equal(c.toolName, 'get_weather');
    checkVercelCalls(result.toolCalls, body, 'named');
});

test('vercel generateText agent loop: a forced call, the tool result sent back, an answer', async () => {
    const { result, bodies } = await run('vercel.generateText.loop');
    assert.equal(result.steps.length, 2, `steps ${result.steps.length}`);
    assert.equal(bodies.length, 2);
    const [first, second] = result.steps;
    assert.ok(first.toolCalls.length >= 1, 'step 1 has a tool call');
    checkVercelCalls(first.toolCalls, bodies[0], 'loop step 1');
    /* the second request carries the call and its result back */
    const roles = bodies[1].messages.map((m) => m.role);
    assert.ok(roles.includes('tool'), `roles ${roles}`);
    assert.equal(second.toolCalls.length, 0, "toolChoice 'none' gives no call");
    assert.ok(['stop', 'length'].includes(second.finishReason), `step 2 finishReason ${second.finishReason}`);
    assert.equal(typeof second.text, 'string');
});

test('vercel streamText: the stream ends, its pieces equal the non-streamed greedy text, usage', async () => {
    const streamed = (await run('vercel.streamText')).result;
    const plain = (await run('vercel.generateText')).result;
    assert.ok(streamed.text.length > 0, 'streamed text is empty');
    assert.equal(streamed.pieces.join(''), streamed.text);
    assert.equal(streamed.text, plain.text);
    assert.ok(['stop', 'length'].includes(streamed.finishReason), `finishReason ${streamed.finishReason}`);
    assert.equal(streamed.finishReason, plain.finishReason);
    assert.ok(streamed.usage.inputTokens > 0 && streamed.usage.outputTokens > 0, `usage ${JSON.stringify(streamed.usage)}`);
    assert.equal(streamed.usage.outputTokens, plain.usage.outputTokens);
});

/* ---- LangChain JS --------------------------------------------------------- */

test('langchain ChatOpenAI invoke: text, finish_reason, usage', async () => {
    const { result } = await run('langchain.invoke');
    assert.equal(typeof result.content, 'string');
    assert.ok(result.content.length > 0, 'empty content');
    assert.ok(['stop', 'length'].includes(result.response_metadata.finish_reason), `finish_reason ${result.response_metadata.finish_reason}`);
    assert.ok(result.usage_metadata.input_tokens > 0 && result.usage_metadata.output_tokens > 0,
        `usage ${JSON.stringify(result.usage_metadata)}`);
});

test('langchain withStructuredOutput (default method: response_format json_schema) validates', async () => {
    const { result, body } = await run('langchain.withStructuredOutput');
    assert.equal(body.response_format?.type, 'json_schema', 'the default method sends response_format json_schema');
    assert.equal(body.tools, undefined);
    const schema = body.response_format.json_schema.schema;
    checkPetSchema(schema);
    validate(schema, result, 'withStructuredOutput');
});

test("langchain withStructuredOutput method 'functionCalling': a forced call whose arguments validate", async () => {
    const { result, body } = await run('langchain.withStructuredOutput.functionCalling');
    assert.deepEqual(body.tool_choice, { type: 'function', function: { name: 'pet' } });
    const schema = toolSchema(body, 'pet');
    checkPetSchema(schema);
    validate(schema, result, 'withStructuredOutput functionCalling');
});

test('langchain bindTools with a named tool_choice: a call of that tool that validates', async () => {
    const { result, body } = await run('langchain.bindTools.named');
    assert.ok(result.tool_calls.length >= 1, `no tool call: ${JSON.stringify(result.content)}`);
    for (const c of result.tool_calls) assert.equal(c.name, 'get_weather');
    checkLangchainCalls(result, body, 'named');
});

test("langchain bindTools with tool_choice 'required': a call that validates", async () => {
    const { result, body } = await run('langchain.bindTools.required');
    assert.ok(result.tool_calls.length >= 1, `no tool call: ${JSON.stringify(result.content)}`);
    checkLangchainCalls(result, body, 'required');
});

test('langchain bindTools after a tool call and its ToolMessage: succeeds; any call validates', async () => {
    const { result, body } = await run('langchain.toolResult');
    assert.ok(body.messages.some((m) => m.role === 'tool' && m.content === JSON.stringify(WEATHER_RESULT)));
    assert.ok(['stop', 'length', 'tool_calls'].includes(result.response_metadata.finish_reason),
        `finish_reason ${result.response_metadata.finish_reason}`);
    checkLangchainCalls(result, body, 'tool result turn');
});
