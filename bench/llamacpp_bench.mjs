#!/usr/bin/env node
// llamacpp_bench.mjs - the llama.cpp side of kvpin's side-by-side benchmark.
//
// Measures llama.cpp (the prebuilt CPU build shipped in the npm package
// @node-llama-cpp/linux-x64, driven through node-llama-cpp) on a GGUF file with the
// same test shapes as llama-bench, so its numbers can be printed next to `kvpin bench`:
//
//   pp<P> @ d<D>  fill the sequence with D tokens (not timed), then time ONE
//                 llama_decode of a P-token batch (batchSize = ubatch = max(P, 1)),
//                 logits requested for the last token only (as llama-bench's
//                 llama_batch_get_one does). tokens/s = P / seconds.
//   tg<N> @ d<D>  fill with D tokens (not timed), then time N single-token decodes;
//                 each step requests the logits of its one token, takes the greedy
//                 (argmax) token and feeds it to the next step. tokens/s = N / seconds.
//
// Timing: performance.now() immediately before and after the awaited
// sequence.controlledEvaluate(...) call(s); for tg the window spans the whole loop of
// N awaited calls, so it includes node-llama-cpp's per-call JS/N-API overhead and the
// greedy sampling of each step (llama-bench itself samples nothing). Next to it the
// script reports llama.cpp's own decode timer (llama_perf_context: time inside
// llama_decode + llama_synchronize) as tps_median_in_decode, which leaves that overhead
// out.
//
// Per (flash-attention mode, depth) one context is made with contextSize >= D+max(P,N)+2,
// batchSize = max(P, 1), threads = T for batch and generation. It is warmed up once
// (a P-token decode and a 1-token decode, as llama-bench does), the D-token fill is
// evaluated once, and between repetitions the tokens after position D are erased from
// the KV cache (llama_memory_seq_rm), so each repetition starts from exactly D cached
// tokens. Tokens are pseudo-random ids in [0, n_vocab) from a fixed seed; the first
// token of the sequence is BOS when the model asks for one.
//
// Flash attention: "auto" is llama.cpp's default (llama_context_default_params); what it
// resolved to is read from llama.cpp's own log line at context creation. "off" forces it
// disabled, "on" forces it enabled. Default: --fa auto,off.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import process from "node:process";
import { performance } from "node:perf_hooks";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

// node-llama-cpp runs every llama_decode on a libuv pool thread. With the default pool of
// 4 threads, consecutive decodes land on different pool threads, and on a 2-vCPU VM the
// thread that ggml starts for each graph is then often placed on the same vCPU as the
// decoding thread: the two share one core for a scheduler tick while the other core
// idles. Measured on this machine with a 135M-shaped Q8_0 model and 2 threads: 17-23
// ms/token with the default pool, 12.1 ms with one pool thread, 11.0 ms for a plain C loop
// over the same libllama. So the script runs itself with UV_THREADPOOL_SIZE=1 unless the
// caller set that variable (the pool size is read once, when the pool starts, and the
// module loader may already have started it, hence a fresh process).
if (process.env.UV_THREADPOOL_SIZE === undefined) {
    const child = spawnSync(process.execPath,
        [...process.execArgv, fileURLToPath(import.meta.url), ...process.argv.slice(2)],
        { stdio: "inherit", env: { ...process.env, UV_THREADPOOL_SIZE: "1" } });
    if (child.error) {
        process.stderr.write(`llamacpp_bench: cannot re-run with UV_THREADPOOL_SIZE=1: ${child.error.message}\n`);
        process.exit(2);
    }
    process.exit(child.status ?? 1);
}
const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");

const USAGE = `usage: node bench/llamacpp_bench.mjs -m MODEL.gguf [options]
  -m, --model PATH     GGUF file (required)
  -p, --n-prompt P     prompt tokens for the pp test (default 512; 0 skips pp)
  -n, --n-gen N        generated tokens for the tg test (default 128; 0 skips tg)
  -d, --n-depth D      context depth before the test; repeat or comma-separate (default 0)
  -r, --reps R         repetitions (default 5)
  -t, --threads T      threads for batch and generation (default: cores reported by llama.cpp)
  --fa LIST            flash attention modes: comma list of auto,on,off (default auto,off)
  --seed S             token id seed (default 42)
  --json               one JSON object per line instead of a table
  -v, --verbose        print llama.cpp's info log to stderr
  -h, --help           this text`;

function fail(msg) {
    process.stderr.write(`llamacpp_bench: ${msg}\n`);
    process.exit(2);
}

function parseIntArg(name, value, min) {
    if (value === undefined)
        fail(`${name} needs a value`);
    if (!/^\d+$/.test(value))
        fail(`${name}: not a non-negative integer: ${value}`);
    const v = Number(value);
    if (v < min)
        fail(`${name}: must be >= ${min}`);
    return v;
}

function parseArgs(argv) {
    const o = { model: null, nPrompt: 512, nGen: 128, depths: [], reps: 5, threads: null,
        fa: ["auto", "off"], seed: 42, json: false, verbose: false };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const next = () => argv[++i];
        switch (a) {
            case "-m": case "--model": o.model = next(); if (!o.model) fail("-m needs a path"); break;
            case "-p": case "--n-prompt": o.nPrompt = parseIntArg(a, next(), 0); break;
            case "-n": case "--n-gen": o.nGen = parseIntArg(a, next(), 0); break;
            case "-d": case "--n-depth": {
                const v = next();
                if (v === undefined) fail(`${a} needs a value`);
                for (const part of v.split(","))
                    o.depths.push(parseIntArg(a, part, 0));
                break;
            }
            case "-r": case "--reps": o.reps = parseIntArg(a, next(), 1); break;
            case "-t": case "--threads": o.threads = parseIntArg(a, next(), 1); break;
            case "--fa": {
                const v = next();
                if (v === undefined) fail("--fa needs a value");
                o.fa = v.split(",");
                for (const m of o.fa)
                    if (!["auto", "on", "off"].includes(m))
                        fail(`--fa: unknown mode ${m} (auto, on, off)`);
                break;
            }
            case "--seed": o.seed = parseIntArg(a, next(), 0); break;
            case "--json": o.json = true; break;
            case "-v": case "--verbose": o.verbose = true; break;
            case "-h": case "--help": process.stdout.write(USAGE + "\n"); process.exit(0); break;
            default: fail(`unknown argument ${a}\n${USAGE}`);
        }
    }
    if (!o.model)
        fail(`-m MODEL.gguf is required\n${USAGE}`);
    if (!fs.existsSync(o.model))
        fail(`model file not found: ${o.model}`);
    if (o.depths.length === 0)
        o.depths = [0];
    if (o.nPrompt === 0 && o.nGen === 0)
        fail("nothing to do: -p 0 and -n 0");
    return o;
}

// Small deterministic PRNG (mulberry32) so runs are repeatable.
function makeRng(seed) {
    let s = seed >>> 0;
    return () => {
        s = (s + 0x6d2b79f5) >>> 0;
        let t = s;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

function randomTokens(rng, count, nVocab) {
    const out = new Array(count);
    for (let i = 0; i < count; i++)
        out[i] = Math.floor(rng() * nVocab);
    return out;
}

function stats(values) {
    const s = [...values].sort((a, b) => a - b);
    const m = s.length >> 1;
    const median = s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
    return { median, min: s[0], max: s[s.length - 1] };
}

// CPU time of the whole machine from /proc/stat (Linux), to tell how much of the
// machine other processes took while a test ran. Returns null where unreadable.
function machineCpu() {
    try {
        const line = fs.readFileSync("/proc/stat", "utf8").split("\n")[0];
        const f = line.trim().split(/\s+/).slice(1).map(Number);
        const [user, nice, system, , , irq, softirq, steal = 0] = f;
        const hz = 100; // USER_HZ
        return { busyUs: (user + nice + system + irq + softirq) / hz * 1e6, stealUs: steal / hz * 1e6 };
    } catch {
        return null;
    }
}

function ownCpuUs() {
    const u = process.cpuUsage();
    return u.user + u.system;
}

function vocabSize(model) {
    const md = model.fileInfo?.metadata;
    const toks = md?.tokenizer?.ggml?.tokens;
    if (Array.isArray(toks) && toks.length > 0)
        return toks.length;
    const arch = md?.general?.architecture;
    const v = arch ? md?.[arch]?.vocab_size : undefined;
    if (typeof v === "number" && v > 0)
        return v;
    throw new Error("cannot tell the vocabulary size from the GGUF metadata");
}

// Bring the sequence back to exactly `depth` cached tokens.
async function truncateTo(seq, depth) {
    if (seq.nextTokenIndex <= depth)
        return;
    if (depth === 0)
        await seq.clearHistory();
    else
        await seq.eraseContextTokenRanges([{ start: depth, end: seq.nextTokenIndex }]);
    if (seq.nextTokenIndex !== depth)
        throw new Error(`sequence did not truncate to depth ${depth} (at ${seq.nextTokenIndex})`);
}

// One llama_decode of `tokens` (all in one batch because batchSize >= tokens.length),
// with logits and a greedy pick for the last token only.
function evalPrompt(seq, tokens) {
    const items = tokens.slice(0, -1);
    items.push([tokens[tokens.length - 1], { generateNext: { token: true } }]);
    return seq.controlledEvaluate(items);
}

// N single-token decodes, greedy feedback. Returns the tokens picked.
async function generate(seq, first, n) {
    let tok = first;
    const picked = [];
    for (let i = 0; i < n; i++) {
        const res = await seq.controlledEvaluate([[tok, { generateNext: { token: true } }]]);
        const next = res[0]?.next?.token;
        if (next == null)
            throw new Error("no token produced by a decode step");
        picked.push(next);
        tok = next;
    }
    return picked;
}

async function main() {
    const opt = parseArgs(process.argv.slice(2));

    // llama.cpp's own log: flash-attention resolution lines are always captured; the
    // rest goes to stderr only with --verbose.
    const logState = { faLines: [], capture: false, buf: "" };
    const logger = (level, message) => {
        const text = String(message);
        if (/Flash Attention|flash_attn/i.test(text))
            logState.faLines.push(text.trim());
        if (logState.capture) {
            logState.buf += text.endsWith("\n") ? text : text + "\n";
            return;
        }
        if (opt.verbose)
            process.stderr.write(`[llama.cpp ${level}] ${text}${text.endsWith("\n") ? "" : "\n"}`);
    };

    // llama.cpp's own decode timer (llama_perf_context): the time spent inside
    // llama_decode + llama_synchronize since the last reset, split like llama.cpp does
    // into multi-token decodes ("prompt eval") and single-token decodes ("eval").
    // printTimings() prints and then resets it.
    const readPerf = async (context) => {
        logState.buf = "";
        logState.capture = true;
        try {
            await context.printTimings();
        } finally {
            logState.capture = false;
        }
        const grab = (re) => {
            const m = logState.buf.match(re);
            return m ? { ms: Number(m[1]), count: Number(m[2]) } : null;
        };
        return {
            prompt: grab(/prompt eval time =\s*([\d.]+) ms \/\s*(\d+) tokens/),
            gen: grab(/\beval time =\s*([\d.]+) ms \/\s*(\d+) runs/),
        };
    };

    const llama = await getLlama({
        gpu: false,
        build: "never",
        usePrebuiltBinaries: true,
        skipDownload: true,
        maxThreads: opt.threads ?? 0,
        logLevel: LlamaLogLevel.info,
        logger,
    });
    const threads = opt.threads ?? llama.cpuMathCores;
    if (opt.verbose)
        process.stderr.write(`llama.cpp system info: ${llama.systemInfo}\n`);

    const model = await llama.loadModel({ modelPath: opt.model, gpuLayers: 0 });
    const nVocab = vocabSize(model);
    const bos = model.tokens.shouldPrependBosToken ? model.tokens.bos : null;
    const modelName = path.basename(opt.model);
    const batchSize = Math.max(opt.nPrompt, 1);
    const maxTest = Math.max(opt.nPrompt, opt.nGen);

    const rows = [];
    const emit = (row) => {
        rows.push(row);
        if (opt.json)
            process.stdout.write(JSON.stringify(row) + "\n");
    };

    if (!opt.json) {
        const rel = llama.llamaCppRelease;
        process.stdout.write(`llama.cpp ${rel?.release ?? "?"} (${llama.buildType}, node-llama-cpp), ` +
            `model ${modelName}, n_vocab ${nVocab}, threads ${threads}, reps ${opt.reps}, ` +
            `batch=ubatch=${batchSize}, UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE}\n`);
    }

    for (const faMode of opt.fa) {
        for (const depth of opt.depths) {
            const rng = makeRng(opt.seed + depth);
            const fill = randomTokens(rng, depth, nVocab);
            if (depth > 0 && bos != null)
                fill[0] = bos;
            const prompt = opt.nPrompt > 0 ? randomTokens(rng, opt.nPrompt, nVocab) : [];
            if (depth === 0 && bos != null && prompt.length > 0)
                prompt[0] = bos;
            const genFirst = depth === 0 && bos != null ? bos : Math.floor(rng() * nVocab);

            logState.faLines = [];
            const context = await model.createContext({
                contextSize: depth + maxTest + 2,
                batchSize,
                sequences: 1,
                threads: { ideal: threads, min: threads },
                performanceTracking: true,
                flashAttention: faMode === "auto" ? "auto" : faMode === "on",
                failedCreationRemedy: false,
            });
            // llama.cpp's log lines reach JS asynchronously: give them a moment to arrive.
            for (let i = 0; i < 20 && faMode === "auto" &&
                !logState.faLines.some((l) => /Flash Attention (enabled|not supported|.*disabled)/i.test(l)); i++)
                await new Promise((resolve) => setTimeout(resolve, 10));
            let faResolved;
            if (faMode === "off")
                faResolved = false;
            else if (faMode === "on")
                faResolved = true;
            else if (logState.faLines.some((l) => /Flash Attention enabled/i.test(l)))
                faResolved = true;
            else if (logState.faLines.some((l) => /Flash Attention.*(disabled|not supported)/i.test(l)))
                faResolved = false;
            else
                faResolved = null; // could not tell from the log
            try {
                const seq = context.getSequence();

                // Warmup: one prompt-sized decode and one single-token decode.
                if (prompt.length > 0)
                    await evalPrompt(seq, prompt);
                await generate(seq, genFirst, 1);
                await truncateTo(seq, 0);

                if (depth > 0)
                    await seq.controlledEvaluate(fill);
                if (seq.nextTokenIndex !== depth)
                    throw new Error(`fill left ${seq.nextTokenIndex} tokens, expected ${depth}`);

                const tests = [];
                if (opt.nPrompt > 0)
                    tests.push({ name: `pp${opt.nPrompt}`, count: opt.nPrompt,
                        perfKey: opt.nPrompt > 1 ? "prompt" : "gen", perfCount: opt.nPrompt > 1 ? opt.nPrompt : 1,
                        run: () => evalPrompt(seq, prompt) });
                if (opt.nGen > 0)
                    tests.push({ name: `tg${opt.nGen}`, count: opt.nGen, perfKey: "gen", perfCount: opt.nGen,
                        run: () => generate(seq, genFirst, opt.nGen) });

                for (const test of tests) {
                    const tps = [];
                    const tpsPerf = [];
                    const cpu0 = machineCpu(), own0 = ownCpuUs(), w0 = performance.now();
                    for (let r = 0; r < opt.reps; r++) {
                        await truncateTo(seq, depth);
                        await readPerf(context); // reset llama.cpp's counters
                        const t0 = performance.now();
                        await test.run();
                        const t1 = performance.now();
                        const perf = await readPerf(context);
                        if (seq.nextTokenIndex !== depth + test.count)
                            throw new Error(`${test.name}: sequence at ${seq.nextTokenIndex}, expected ${depth + test.count}`);
                        tps.push(test.count / ((t1 - t0) / 1000));
                        const pe = perf[test.perfKey];
                        if (pe && pe.count === test.perfCount && pe.ms > 0)
                            tpsPerf.push(test.count / (pe.ms / 1000));
                    }
                    const cpu1 = machineCpu(), own1 = ownCpuUs(), w1 = performance.now();
                    let otherPct = null, stealPct = null;
                    if (cpu0 && cpu1) {
                        const capUs = (w1 - w0) * 1000 * os.cpus().length;
                        otherPct = Math.max(0, (cpu1.busyUs - cpu0.busyUs - (own1 - own0)) / capUs * 100);
                        stealPct = (cpu1.stealUs - cpu0.stealUs) / capUs * 100;
                    }
                    const st = stats(tps);
                    const stPerf = tpsPerf.length === opt.reps ? stats(tpsPerf) : null;
                    const used = context.currentThreads;
                    if (used !== threads)
                        throw new Error(`context used ${used} threads, asked for ${threads}`);
                    emit({
                        engine: "llama.cpp",
                        model: modelName,
                        test: test.name,
                        depth,
                        n_threads: threads,
                        flash_attn: faResolved,
                        flash_attn_mode: faMode,
                        tps_median: Number(st.median.toFixed(2)),
                        tps_min: Number(st.min.toFixed(2)),
                        tps_max: Number(st.max.toFixed(2)),
                        reps: opt.reps,
                        tps_median_in_decode: stPerf ? Number(stPerf.median.toFixed(2)) : null,
                        other_cpu_pct: otherPct === null ? null : Number(otherPct.toFixed(1)),
                        steal_pct: stealPct === null ? null : Number(stealPct.toFixed(1)),
                    });
                    if (otherPct !== null && otherPct > 10)
                        process.stderr.write(`llamacpp_bench: warning: other processes used ${otherPct.toFixed(0)}% ` +
                            `of the machine during ${test.name} @ d${depth}; its numbers are not clean\n`);
                }
            } finally {
                await context.dispose();
            }
        }
    }

    if (!opt.json) {
        const head = ["model", "fa", "threads", "test", "t/s median", "min", "max", "in-decode t/s", "other cpu %"];
        const body = rows.map((r) => [
            r.model,
            `${r.flash_attn_mode}${r.flash_attn_mode === "auto" ? `=${r.flash_attn === null ? "?" : r.flash_attn ? "on" : "off"}` : ""}`,
            String(r.n_threads),
            r.depth > 0 ? `${r.test} @ d${r.depth}` : r.test,
            r.tps_median.toFixed(2), r.tps_min.toFixed(2), r.tps_max.toFixed(2),
            r.tps_median_in_decode === null ? "-" : r.tps_median_in_decode.toFixed(2),
            r.other_cpu_pct === null ? "-" : r.other_cpu_pct.toFixed(1),
        ]);
        const w = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i].length)));
        const line = (cells) => "| " + cells.map((c, i) => (i >= 4 ? c.padStart(w[i]) : c.padEnd(w[i]))).join(" | ") + " |";
        process.stdout.write(line(head) + "\n");
        process.stdout.write("| " + w.map((n, i) => (i >= 4 ? "-".repeat(n - 1) + ":" : "-".repeat(n))).join(" | ") + " |\n");
        for (const b of body)
            process.stdout.write(line(b) + "\n");
    }

    await model.dispose();
    await llama.dispose();
}

main().catch((err) => {
    process.stderr.write(`llamacpp_bench: ${err?.stack ?? err}\n`);
    process.exit(1);
});
