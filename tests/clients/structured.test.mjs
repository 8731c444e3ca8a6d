/*
 * structured.test.mjs - constrained decoding through the official `openai`
 * npm client: response_format json_schema / json_object, llama.cpp's
 * `grammar` (GBNF) and `json_schema` fields, and the 400 for a schema
 * keyword kvpin does not support.
 *
 * tests/clients/e2e_openai.sh starts the servers and runs this file with
 * `node --test`; the environment names them:
 *
 *   KVPIN_URL, KVPIN_API_KEY  the bundled stories260K model (chatml)
 *   KVPIN_BPE_URL             a random-weight model with the 49,152-token
 *                             byte-level BPE vocabulary (mkmodel, no key)
 *
 * Expected values come from a real JSON Schema validator (ajv, with
 * ajv-formats for date, date-time and uuid) and JSON.parse, never from
 * kvpin's own output: every answer that ends with finish_reason "stop"
 * must parse and validate against the schema it was asked for, and with
 * the bounded schemas below every answer must end that way.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const URL_MAIN = process.env.KVPIN_URL;
const URL_BPE = process.env.KVPIN_BPE_URL;
const API_KEY = process.env.KVPIN_API_KEY;
if (!URL_MAIN || !URL_BPE || !API_KEY)
    throw new Error('set KVPIN_URL, KVPIN_API_KEY and KVPIN_BPE_URL (tests/clients/e2e_openai.sh does)');

const servers = [
    { name: 'stories260K (SPM, 512 tokens)', url: URL_MAIN, key: API_KEY },
    { name: 'random-weight 49k BPE', url: URL_BPE, key: 'unused' },
];
for (const s of servers) s.client = new OpenAI({ baseURL: s.url + '/v1', apiKey: s.key, maxRetries: 0, timeout: 120_000 });

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

/* The schemas: nested objects, arrays, enums, $ref (recursive too),
 * formats, numeric bounds; bounded (maxLength, maxItems, additionalProperties
 * false) so a random model ends well within max_tokens. */
const SCHEMAS = {
    order: {
        type: 'object',
        properties: {
            id: { type: 'string', format: 'uuid' },
            customer: { $ref: '#/$defs/person' },
            items: {
                type: 'array', minItems: 1, maxItems: 3,
                items: {
                    type: 'object',
                    properties: {
                        sku: { type: 'string', minLength: 1, maxLength: 8 },
                        qty: { type: 'integer', minimum: 1, maximum: 99 },
                        color: { enum: ['red', 'green', 'blue'] },
                    },
                    required: ['sku', 'qty', 'color'], additionalProperties: false,
                },
            },
            status: { enum: ['open', 'paid', 'shipped', null] },
            placed: { type: 'string', format: 'date' },
            gift: { type: 'boolean' },
        },
        required: ['id', 'customer', 'items', 'status', 'placed'],
        additionalProperties: false,
        $defs: {
            person: {
                type: 'object',
                properties: { name: { type: 'string', maxLength: 10 }, age: { type: ['integer', 'null'], minimum: 0, exclusiveMaximum: 150 } },
                required: ['name', 'age'], additionalProperties: false,
            },
        },
    },
    list: { // recursive $ref through definitions
        $ref: '#/definitions/node',
        definitions: {
            node: {
                type: 'object',
                properties: {
                    v: { type: 'number', minimum: -10, exclusiveMaximum: 10 },
                    next: { anyOf: [{ $ref: '#/definitions/node' }, { type: 'null' }] },
                },
                required: ['v', 'next'], additionalProperties: false,
            },
        },
    },
    pick: { type: 'object', properties: { answer: { const: 'yes' }, n: { enum: [1, 2, 3] } }, required: ['answer', 'n'], additionalProperties: false },
};

const chat = (s, extra) => s.client.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'Give me the JSON.' }], max_tokens: 500, ...extra,
});

function validates(schema, text, where) {
    let v;
    assert.doesNotThrow(() => { v = JSON.parse(text); }, `${where}: not JSON: ${JSON.stringify(text)}`);
    const ok = ajv.validate(schema, v);
    assert.ok(ok, `${where}: ${JSON.stringify(text)} does not validate: ${ajv.errorsText()}`);
    return v;
}

for (const s of servers) {
    test(`json_schema on ${s.name}: every answer parses and validates (strict and not)`, async () => {
        let n = 0;
        for (const [name, schema] of Object.entries(SCHEMAS)) {
            for (let seed = 1; seed <= 3; seed++) {
                const strict = seed % 2 === 1;
                const r = await chat(s, { seed, response_format: { type: 'json_schema', json_schema: { name, schema, strict } } });
                const c = r.choices[0];
                assert.equal(c.finish_reason, 'stop', `${name} seed ${seed}: ${JSON.stringify(c.message.content)}`);
                validates(schema, c.message.content, `${name} seed ${seed}`);
                n++;
            }
        }
        assert.equal(n, 9);
    });

    test(`json_schema on ${s.name}: streamed pieces concatenate to a valid document`, async () => {
        const schema = SCHEMAS.order;
        const st = await chat(s, { seed: 11, stream: true, response_format: { type: 'json_schema', json_schema: { name: 'order', schema } } });
        let text = '', finish = null;
        for await (const ch of st) {
            text += ch.choices[0]?.delta?.content ?? '';
            finish = ch.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(finish, 'stop');
        validates(schema, text, 'streamed');
    });

    test(`completions on ${s.name}: llama.cpp's json_schema and grammar fields`, async () => {
        const schema = SCHEMAS.pick;
        const r = await s.client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 60, seed: 5, json_schema: schema });
        assert.equal(r.choices[0].finish_reason, 'stop');
        validates(schema, r.choices[0].text, 'completions json_schema');
        const g = 'root ::= item ("," item){0,3}\nitem ::= [a-z]{1,5} | "yes" | "no"\n';
        for (let seed = 1; seed <= 3; seed++) {
            const q = await s.client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 60, seed, grammar: g });
            assert.equal(q.choices[0].finish_reason, 'stop');
            assert.match(q.choices[0].text, /^[a-z]{1,5}(,[a-z]{1,5}){0,3}$/);
        }
        const c = await chat(s, { seed: 3, grammar: 'root ::= "yes" | "no"' });
        assert.equal(c.choices[0].finish_reason, 'stop');
        assert.ok(['yes', 'no'].includes(c.choices[0].message.content), c.choices[0].message.content);
    });
}

test('json_object on the bundled model: every answer that ends parses as an object', async () => {
    const s = servers[0];
    let ended = 0;
    // temperature 2 flattens the trained model's preference for story text
    // inside strings (any object's strings are unbounded), so most end
    for (let seed = 1; seed <= 6; seed++) {
        const r = await chat(s, { seed, temperature: 2, max_tokens: 1000, response_format: { type: 'json_object' } });
        const c = r.choices[0];
        assert.ok(['stop', 'length'].includes(c.finish_reason));
        if (c.finish_reason !== 'stop') continue;
        ended++;
        const v = JSON.parse(c.message.content);
        assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), c.message.content);
    }
    assert.ok(ended >= 1, 'no json_object answer ended within 1000 tokens');
});

test('errors: an unsupported schema keyword is a 400 naming it and its path', async () => {
    const s = servers[0];
    const cases = [
        [{ type: 'string', pattern: '^a' }, 'pattern', '#'],
        [{ type: 'object', properties: { a: { type: 'integer', multipleOf: 3 } } }, 'multipleOf', '#/properties/a'],
        [{ type: 'object', properties: { a: { type: 'number', maximum: 0.5 } } }, 'maximum', '#/properties/a'],
        [{ type: 'array', items: { type: 'string' }, uniqueItems: true }, 'uniqueItems', '#'],
    ];
    for (const [schema, kw, path] of cases) {
        await assert.rejects(chat(s, { response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } }),
            (e) => {
                assert.ok(e instanceof OpenAI.BadRequestError, String(e));
                assert.equal(e.status, 400);
                assert.equal(e.type, 'invalid_request_error');
                assert.equal(e.param, 'response_format');
                assert.ok(e.message.includes(kw) && e.message.includes(path), e.message);
                return true;
            });
    }
    // a GBNF grammar that does not parse names the field too
    await assert.rejects(chat(s, { grammar: 'root ::= ("a"' }), (e) => e.status === 400 && e.param === 'grammar');
    // two constraints at once
    await assert.rejects(chat(s, { grammar: 'root ::= "a"', response_format: { type: 'json_object' } }),
        (e) => e.status === 400 && /both/.test(e.message));
});

/* Forced tool calls: tool_choice "required" and a named function. The
 * output is decoded under the call grammar, so on every server each answer
 * is a call (finish_reason "tool_calls") of an offered tool (the named one
 * when named) whose arguments validate against that tool's parameters. */
const TOOLS = [
    {
        type: 'function',
        function: {
            name: 'get_weather', description: 'The weather in a city',
            parameters: {
                type: 'object',
                properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
                required: ['city', 'unit'], additionalProperties: false,
            },
        },
    },
    {
        type: 'function',
        function: {
            name: 'add',
            parameters: {
                type: 'object',
                properties: { a: { type: 'integer' }, b: { type: 'integer' } },
                required: ['a', 'b'], additionalProperties: false,
            },
        },
    },
];
const TOOL_CHECK = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

for (const s of servers) {
    for (const choice of ['required', { type: 'function', function: { name: 'add' } }]) {
        const label = typeof choice === 'string' ? choice : 'named add';
        test(`${s.name}: tool_choice ${label} gives a call whose arguments validate`, async () => {
            for (let seed = 1; seed <= 3; seed++) {
                for (const stream of [false, true]) {
                    const body = {
                        model: 'm', max_tokens: 200, temperature: 1, seed, tools: TOOLS, tool_choice: choice,
                        messages: [{ role: 'user', content: 'Call a tool.' }],
                    };
                    let calls, finish;
                    if (!stream) {
                        const r = await s.client.chat.completions.create(body);
                        calls = r.choices[0].message.tool_calls;
                        finish = r.choices[0].finish_reason;
                    } else {
                        const st = await s.client.chat.completions.create({ ...body, stream: true });
                        const acc = [];
                        for await (const ch of st) {
                            const c = ch.choices[0];
                            if (!c) continue;
                            for (const d of c.delta?.tool_calls ?? []) {
                                acc[d.index] ??= { name: '', arguments: '' };
                                if (d.function?.name) acc[d.index].name += d.function.name;
                                if (d.function?.arguments) acc[d.index].arguments += d.function.arguments;
                            }
                            if (c.finish_reason) finish = c.finish_reason;
                        }
                        calls = acc.map((a) => ({ function: a }));
                    }
                    assert.equal(finish, 'tool_calls', `seed ${seed} stream ${stream}`);
                    assert.equal(calls.length, 1, 'one call unless parallel_tool_calls is true');
                    const fn = calls[0].function;
                    if (typeof choice !== 'string') assert.equal(fn.name, 'add');
                    assert.ok(TOOL_CHECK[fn.name], `an offered tool: ${fn.name}`);
                    const args = JSON.parse(fn.arguments);
                    assert.ok(TOOL_CHECK[fn.name](args), `${fn.arguments}: ${ajv.errorsText(TOOL_CHECK[fn.name].errors)}`);
                }
            }
        });
    }
}

test('a forced call without tools, with another constraint or of an unknown name is a 400', async () => {
    const c = servers[0].client;
    const base = { model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] };
    const cases = [
        [{ tool_choice: 'required' }, 'tool_choice'],
        [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
        [{ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice'],
        [{ tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice'],
    ];
    for (const [extra, param] of cases) {
        await assert.rejects(c.chat.completions.create({ ...base, ...extra }), (e) => {
            assert.equal(e.status, 400, JSON.stringify(extra));
            assert.equal(e.param, param, JSON.stringify(extra));
            return true;
        });
    }
});
