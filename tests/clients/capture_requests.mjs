/*
 * capture_requests.mjs - records the HTTP requests the agent frameworks send
 * for each call of frameworks.mjs, into tests/data/requests/NAME.json.
 *
 *   cd tests/clients && npm ci && node capture_requests.mjs [OUTDIR]
 *   node capture_requests.mjs --serve    only the recording server, until killed
 *
 * A recording server on 127.0.0.1 (a free port) stands in for kvpin: it
 * keeps the method, path, headers and body of every request as they came
 * over the wire, and answers with the smallest valid OpenAI chat completion
 * (or stream) that lets the framework's call finish: a tool call to the
 * forced tool (or the first one) with arguments built from its JSON Schema,
 * a JSON document built from response_format's schema, or a short text.
 * Nothing here asserts anything about kvpin; the files are a record of what
 * the pinned package versions send (see tests/data/requests/README.md) and
 * seeds for the request parsers.
 *
 * Each file: { call, about, packages: {name: version}, node, requests: [{
 * method, path, headers, body }] } (one request per call for these calls).
 * The API key sent is the placeholder "capture-key"; the port in the host
 * header is written as PORT, so a run with the same packages and Node
 * writes the same files.
 */
import http from 'node:http';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { z } from 'zod';
import { CALLS, RECORD_ONLY, PET } from './frameworks.mjs';

const here = new URL('.', import.meta.url);
const serveOnly = process.argv[2] === '--serve';
const outdir = process.argv[2] ?? new URL('../data/requests/', import.meta.url).pathname;
const PACKAGES = ['ai', '@ai-sdk/openai-compatible', '@langchain/openai', '@langchain/core', 'openai', 'zod'];

function version(name, from = '') {
    const p = new URL(`node_modules/${from}${name}/package.json`, here);
    return JSON.parse(readFileSync(p, 'utf8')).version;
}

/* A value that validates against a JSON Schema of the subset the frameworks
 * emit here (objects, arrays, strings, booleans, numbers, enums). */
function example(s) {
    if (s.enum) return s.enum[0];
    if (s.const !== undefined) return s.const;
    if (s.anyOf) return example(s.anyOf[0]);
    const type = Array.isArray(s.type) ? s.type[0] : s.type;
    switch (type) {
    case 'object': {
        const o = {};
        for (const [k, v] of Object.entries(s.properties ?? {})) o[k] = example(v);
        return o;
    }
    case 'array': return Array.from({ length: Math.max(1, s.minItems ?? 0) }, () => example(s.items ?? {}));
    case 'string': return 'Tom'.slice(0, s.maxLength ?? 3);
    case 'boolean': return true;
    case 'integer': case 'number': return 1;
    case 'null': return null;
    default: return {};
    }
}

/* What the recording server answers a request body with. */
function answer(body) {
    const tools = body.tools ?? [];
    const tc = body.tool_choice;
    let tool = null;
    if (tools.length && tc !== 'none' && tc !== undefined && tc !== 'auto') {
        const name = typeof tc === 'object' ? tc.function?.name : tools[0].function.name;
        tool = tools.find((t) => t.function.name === name) ?? tools[0];
    }
    if (tool) return { tool_calls: [{ id: 'call_0', type: 'function',
        function: { name: tool.function.name, arguments: JSON.stringify(example(tool.function.parameters)) } }] };
    const rf = body.response_format;
    if (rf?.type === 'json_schema') return { content: JSON.stringify(example(rf.json_schema.schema)) };
    if (rf?.type === 'json_object') return { content: JSON.stringify(example(z.toJSONSchema(PET))) };
    return { content: 'Once upon a time there was a cat.' };
}

function reply(res, body) {
    const a = answer(body);
    const base = { id: 'chatcmpl-capture', created: 1700000000, model: body.model };
    const finish = a.tool_calls ? 'tool_calls' : 'stop';
    const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
    if (!body.stream) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ ...base, object: 'chat.completion', usage, choices: [{ index: 0,
            message: { role: 'assistant', content: a.content ?? null, ...(a.tool_calls ? { tool_calls: a.tool_calls } : {}) },
            finish_reason: finish, logprobs: null }] }));
        return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const send = (o) => res.write(`data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', ...o })}\n\n`);
    const delta = (d, f = null) => send({ choices: [{ index: 0, delta: d, finish_reason: f, logprobs: null }] });
    delta({ role: 'assistant', content: '' });
    if (a.tool_calls) delta({ tool_calls: a.tool_calls.map((t, index) => ({ index, ...t })) });
    else for (const w of a.content.split(/(?<= )/)) delta({ content: w });
    delta({}, finish);
    if (body.stream_options?.include_usage) send({ choices: [], usage });
    res.end('data: [DONE]\n\n');
}

const log = [];
const server = http.createServer((req, res) => {
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => {
        const text = Buffer.concat(parts).toString('utf8');
        let body = text;
        try { body = JSON.parse(text); } catch { /* kept as text */ }
        /* the port varies from run to run: written as PORT */
        const headers = { ...req.headers, host: req.headers.host.replace(/:\d+$/, ':PORT') };
        log.push({ method: req.method, path: req.url, headers, body });
        if (req.method === 'POST' && req.url === '/v1/chat/completions') reply(res, body);
        else { res.writeHead(404, { 'content-type': 'application/json' }); res.end('{"error":{"message":"not found"}}'); }
    });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
if (serveOnly) {
    /* for checking the tests themselves: frameworks.test.mjs pointed here
     * must pass (KVPIN_URL=the printed URL, any key and model id) */
    console.log(`http://127.0.0.1:${server.address().port}`);
    await new Promise(() => {});
}
const ctx = { baseURL: `http://127.0.0.1:${server.address().port}/v1`, apiKey: 'capture-key', model: 'stories260K.gguf', fetch };

const packages = Object.fromEntries(PACKAGES.map((p) => [p, version(p)]));
packages['openai (under @langchain/openai)'] = version('openai', '@langchain/openai/node_modules/');
mkdirSync(outdir, { recursive: true });
let failed = 0;
for (const c of [...CALLS, ...RECORD_ONLY]) {
    log.length = 0;
    try {
        await c.run(ctx);
    } catch (e) {
        failed++;
        console.error(`${c.name}: ${e.message}`);
    }
    writeFileSync(`${outdir}/${c.name}.json`, JSON.stringify({ call: c.name, about: c.about, packages,
        node: process.version, requests: log }, null, 2) + '\n');
    console.log(`${c.name}: ${log.length} request(s)`);
}
server.close();
process.exit(failed ? 1 : 0);
