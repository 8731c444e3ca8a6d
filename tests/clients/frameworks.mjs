/*
 * frameworks.mjs - the agent-framework calls that frameworks.test.mjs sends
 * to `kvpin serve` and capture_requests.mjs sends to a recording server:
 * one definition, so the recorded requests are the tested ones.
 *
 * Each entry of CALLS is { name, about, run(ctx) }: run makes one framework
 * call through the packages pinned in package.json and returns what the
 * framework returned. ctx is { baseURL, apiKey, model, fetch }: baseURL ends
 * in /v1, fetch is the fetch the framework must use (the callers pass one
 * that records each request body, so a test can read the JSON Schema the
 * framework actually sent).
 *
 * The frameworks are configured as their documentation says to point them
 * at an OpenAI-compatible server: the Vercel AI SDK through
 * @ai-sdk/openai-compatible with supportsStructuredOutputs (without it,
 * generateObject sends response_format json_object and no schema; that call
 * is recorded too, as RECORD_ONLY) and includeUsage; LangChain's ChatOpenAI
 * with configuration.baseURL. Retries are off, so an error is the server's
 * first answer.
 */
import { z } from 'zod';
import { generateObject, generateText, streamText, stepCountIs, tool as aiTool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { tool as lcTool } from '@langchain/core/tools';
import { AIMessage, HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';

/* ---- schemas -------------------------------------------------------------- */

/* A nested object, an array and enums, with string and array bounds so a
 * constrained answer of a tiny model ends within max_tokens. */
export const PET = z.object({
    name: z.string().min(1).max(20),
    species: z.enum(['cat', 'dog', 'bird']),
    owner: z.object({
        name: z.string().max(20),
        adult: z.boolean(),
    }),
    toys: z.array(z.string().max(12)).min(1).max(3),
});
export const PET_DESCRIPTION = 'A pet from the story';

export const WEATHER_ARGS = z.object({
    city: z.string().min(1).max(20),
    unit: z.enum(['celsius', 'fahrenheit']),
});
export const TIME_ARGS = z.object({
    zone: z.string().max(20),
});

const SYSTEM = 'You are a helpful assistant who tells short stories.';
const STORY = 'Tell me about the little cat who lived in the park.';
const WEATHER_Q = 'What is the weather like in Paris today?';
const MAX_TOKENS = 200; /* room for a whole constrained PET */

/* ---- Vercel AI SDK -------------------------------------------------------- */

function vercelModel(ctx, options = {}) {
    const provider = createOpenAICompatible({
        name: 'kvpin',
        baseURL: ctx.baseURL,
        apiKey: ctx.apiKey,
        fetch: ctx.fetch,
        supportsStructuredOutputs: true,
        includeUsage: true,
        ...options,
    });
    return provider.chatModel(ctx.model);
}

/* Tools without execute: generateText returns the calls and stops. */
const vercelTools = {
    get_weather: aiTool({ description: 'Get the current weather in a city', inputSchema: WEATHER_ARGS }),
    get_time: aiTool({ description: 'Get the current time in a time zone', inputSchema: TIME_ARGS }),
};

/* The same tools with execute, for a two-step agent loop. */
export const WEATHER_RESULT = { city: 'Paris', sky: 'sunny', temperature: 20 };
const vercelLoopTools = {
    get_weather: aiTool({ ...vercelTools.get_weather, execute: async () => WEATHER_RESULT }),
    get_time: aiTool({ ...vercelTools.get_time, execute: async () => ({ time: '12:00' }) }),
};

const vercelCommon = { maxRetries: 0, temperature: 0, maxOutputTokens: MAX_TOKENS };

/* ---- LangChain JS --------------------------------------------------------- */

function langchainModel(ctx, options = {}) {
    return new ChatOpenAI({
        model: ctx.model,
        apiKey: ctx.apiKey,
        configuration: { baseURL: ctx.baseURL, fetch: ctx.fetch },
        temperature: 0,
        maxTokens: MAX_TOKENS,
        maxRetries: 0,
        ...options,
    });
}

const lcWeather = lcTool(async () => 'sunny', {
    name: 'get_weather', description: 'Get the current weather in a city', schema: WEATHER_ARGS,
});
const lcTime = lcTool(async () => 'noon', {
    name: 'get_time', description: 'Get the current time in a time zone', schema: TIME_ARGS,
});

const lcMessages = (q) => [new SystemMessage(SYSTEM), new HumanMessage(q)];

/* ---- the calls ------------------------------------------------------------ */

export const CALLS = [
    {
        name: 'vercel.generateObject',
        about: 'ai generateObject with a zod schema (nested object, array, enum), supportsStructuredOutputs: true',
        run: (ctx) => generateObject({
            ...vercelCommon, model: vercelModel(ctx), schema: PET, schemaName: 'pet',
            schemaDescription: PET_DESCRIPTION, system: SYSTEM, prompt: STORY,
        }),
    },
    {
        name: 'vercel.generateText.tools',
        about: 'ai generateText with two zod-typed tools, toolChoice auto (the default)',
        run: (ctx) => generateText({
            ...vercelCommon, model: vercelModel(ctx), tools: vercelTools, system: SYSTEM, prompt: WEATHER_Q,
        }),
    },
    {
        name: 'vercel.generateText.required',
        about: "ai generateText with two zod-typed tools, toolChoice 'required'",
        run: (ctx) => generateText({
            ...vercelCommon, model: vercelModel(ctx), tools: vercelTools, toolChoice: 'required',
            system: SYSTEM, prompt: WEATHER_Q,
        }),
    },
    {
        name: 'vercel.generateText.named',
        about: "ai generateText with two zod-typed tools, toolChoice { type: 'tool', toolName: 'get_weather' }",
        run: (ctx) => generateText({
            ...vercelCommon, model: vercelModel(ctx), tools: vercelTools,
            toolChoice: { type: 'tool', toolName: 'get_weather' }, system: SYSTEM, prompt: WEATHER_Q,
        }),
    },
    {
        name: 'vercel.generateText.loop',
        about: "ai generateText agent loop: step 1 toolChoice 'required', the tool runs, step 2 toolChoice 'none' answers with the tool result in the conversation",
        run: (ctx) => generateText({
            ...vercelCommon, model: vercelModel(ctx), tools: vercelLoopTools, stopWhen: stepCountIs(2),
            prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
            system: SYSTEM, prompt: WEATHER_Q,
        }),
    },
    {
        name: 'vercel.generateText',
        about: 'ai generateText, plain text (the non-streamed twin of vercel.streamText)',
        run: (ctx) => generateText({ ...vercelCommon, maxOutputTokens: 48, model: vercelModel(ctx), system: SYSTEM, prompt: STORY }),
    },
    {
        name: 'vercel.streamText',
        about: 'ai streamText, plain text; the stream is read to its end',
        run: async (ctx) => {
            const r = streamText({ ...vercelCommon, maxOutputTokens: 48, model: vercelModel(ctx), system: SYSTEM, prompt: STORY });
            const pieces = [];
            for await (const p of r.textStream) pieces.push(p);
            return { pieces, text: await r.text, finishReason: await r.finishReason, usage: await r.usage };
        },
    },
    {
        name: 'langchain.invoke',
        about: 'ChatOpenAI.invoke with a system and a human message',
        run: (ctx) => langchainModel(ctx, { maxTokens: 48 }).invoke(lcMessages(STORY)),
    },
    {
        name: 'langchain.withStructuredOutput',
        about: 'ChatOpenAI.withStructuredOutput(zod schema), the default method (jsonSchema for a model not named gpt-3*/gpt-4-*/gpt-4)',
        run: (ctx) => langchainModel(ctx).withStructuredOutput(PET, { name: 'pet' }).invoke(lcMessages(STORY)),
    },
    {
        name: 'langchain.withStructuredOutput.functionCalling',
        about: "ChatOpenAI.withStructuredOutput(zod schema, { method: 'functionCalling' })",
        run: (ctx) => langchainModel(ctx).withStructuredOutput(PET, { name: 'pet', method: 'functionCalling' })
            .invoke(lcMessages(STORY)),
    },
    {
        name: 'langchain.bindTools.named',
        about: "ChatOpenAI.bindTools([two zod-typed tools], { tool_choice: 'get_weather' })",
        run: (ctx) => langchainModel(ctx).bindTools([lcWeather, lcTime], { tool_choice: 'get_weather' })
            .invoke(lcMessages(WEATHER_Q)),
    },
    {
        name: 'langchain.bindTools.required',
        about: "ChatOpenAI.bindTools([two zod-typed tools], { tool_choice: 'required' })",
        run: (ctx) => langchainModel(ctx).bindTools([lcWeather, lcTime], { tool_choice: 'required' })
            .invoke(lcMessages(WEATHER_Q)),
    },
    {
        name: 'langchain.toolResult',
        about: 'ChatOpenAI.bindTools([two zod-typed tools]).invoke after an assistant tool call and its ToolMessage (the second turn of an agent loop)',
        run: (ctx) => langchainModel(ctx).bindTools([lcWeather, lcTime]).invoke([
            ...lcMessages(WEATHER_Q),
            new AIMessage({ content: '', tool_calls: [{ id: 'call_1', name: 'get_weather', args: { city: 'Paris', unit: 'celsius' } }] }),
            new ToolMessage({ tool_call_id: 'call_1', content: JSON.stringify(WEATHER_RESULT) }),
        ]),
    },
];

/* Recorded by capture_requests.mjs for reference, not tested: what the
 * frameworks send when configured otherwise. */
export const RECORD_ONLY = [
    {
        name: 'vercel.generateObject.default',
        about: 'ai generateObject with the provider defaults (no supportsStructuredOutputs, no includeUsage)',
        run: (ctx) => generateObject({
            ...vercelCommon,
            model: vercelModel(ctx, { supportsStructuredOutputs: undefined, includeUsage: undefined }),
            schema: PET, schemaName: 'pet', schemaDescription: PET_DESCRIPTION, system: SYSTEM, prompt: STORY,
        }),
    },
    {
        name: 'langchain.withStructuredOutput.jsonMode',
        about: "ChatOpenAI.withStructuredOutput(zod schema, { method: 'jsonMode' })",
        run: (ctx) => langchainModel(ctx).withStructuredOutput(PET, { name: 'pet', method: 'jsonMode' })
            .invoke(lcMessages(STORY + ' Answer in JSON.')),
    },
    {
        name: 'langchain.stream',
        about: 'ChatOpenAI.stream, read to its end',
        run: async (ctx) => {
            const chunks = [];
            for await (const c of await langchainModel(ctx, { maxTokens: 48 }).stream(lcMessages(STORY))) chunks.push(c);
            return chunks;
        },
    },
];

/* A fetch that records each request's URL and JSON body into `log` and then
 * sends it. */
export function recordingFetch(log) {
    return async (url, init = {}) => {
        let body = init.body;
        if (typeof body === 'string') {
            try { body = JSON.parse(body); } catch { /* not JSON: kept as text */ }
        }
        log.push({ url: String(url), method: init.method ?? 'GET', body });
        return fetch(url, init);
    };
}
