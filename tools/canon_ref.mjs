// canon_ref.mjs - reference data for tests/unit/test_canon.c, computed by V8.
//
//   node tools/canon_ref.mjs [OUTDIR]        (default tests/data/canon)
//
// RFC 8785 defines canonical JSON through ECMAScript: numbers are printed by
// Number::toString (JSON.stringify), member names are sorted as UTF-16
// code-unit arrays (Array.prototype.sort's default order), strings are
// escaped as JSON.stringify escapes them. So the reference canonicalizer
// here is five lines of JavaScript on top of V8, independent of kvpin's C.
//
// It writes, from a fixed seed (the output is the same on every run):
//
//   numbers.txt     "<16 hex digits of the IEEE-754 bits>,<JSON.stringify>"
//                   per line: every power of two, powers of ten and their
//                   neighbours, the format boundaries (1e21, 1e-6, 1e-7),
//                   integers near 2^53, short decimals, random bit patterns
//   doc-NN.json     random documents written the non-canonical way a client
//                   might: members shuffled, whitespace everywhere, strings
//                   with \u escapes (surrogate pairs included) and \/,
//                   numbers as 1E2, 100.0, 17 significant digits...
//   doc-NN.canon    the canonical bytes of JSON.parse(doc-NN.json)
//
// Every document is checked to parse back (JSON.parse) to the value it was
// written from before it is kept.
import fs from "node:fs";
import path from "node:path";

const outDir = process.argv[2] || "tests/data/canon";
fs.mkdirSync(outDir, { recursive: true });

// ---------------------------------------------------------------- PRNG
// xorshift128, 32-bit lanes: small, seeded, the same on every platform.
let s0 = 0x9e3779b9, s1 = 0x243f6a88, s2 = 0xb7e15162, s3 = 0x8765432;
function u32() {
  let t = s0 ^ (s0 << 11);
  s0 = s1; s1 = s2; s2 = s3;
  s3 = (s3 ^ (s3 >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
  return s3;
}
const rnd = () => u32() / 4294967296;
const below = (n) => Math.floor(rnd() * n);
const pick = (a) => a[below(a.length)];

// ---------------------------------------------------------------- reference JCS
function jcs(v) {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(jcs).join(",") + "]";
  return "{" + Object.keys(v).sort().map((k) => JSON.stringify(k) + ":" + jcs(v[k])).join(",") + "}";
}

// ---------------------------------------------------------------- numbers
const buf = new DataView(new ArrayBuffer(8));
function fromBits(hi, lo) { buf.setUint32(0, hi); buf.setUint32(4, lo); return buf.getFloat64(0); }
function bitsHex(x) {
  buf.setFloat64(0, x);
  return buf.getUint32(0).toString(16).padStart(8, "0") + buf.getUint32(4).toString(16).padStart(8, "0");
}
function neighbours(x) {
  buf.setFloat64(0, x);
  const hi = buf.getUint32(0), lo = buf.getUint32(4);
  const up = lo === 0xffffffff ? fromBits(hi + 1, 0) : fromBits(hi, lo + 1);
  const down = lo === 0 ? fromBits(hi - 1, 0xffffffff) : fromBits(hi, lo - 1);
  return [up, down].filter((y) => Number.isFinite(y) && y > 0);
}

const numbers = [];
for (let e = -1074; e <= 1023; e++) numbers.push(2 ** e);
for (let e = -323; e <= 308; e++) {
  const x = Number("1e" + e);
  numbers.push(x, ...neighbours(x));
}
for (const x of [1e21, 1e-6, 1e-7, 2 ** 53, 2 ** 53 + 2, 2 ** 63, 2 ** 64, Number.MAX_VALUE,
                 Number.MIN_VALUE, 2.2250738585072014e-308, 0.1, 0.2, 0.3, 1 / 3, 2 / 3, Math.PI, Math.E])
  numbers.push(x, ...neighbours(x));
for (let i = 0; i < 300; i++) numbers.push(2 ** 53 - 150 + i);
for (let i = 0; i < 1500; i++) numbers.push(Number(String(below(1000000)) + "e" + (below(60) - 30)));
for (let i = 0; i < 3000; i++) {
  const x = fromBits(u32(), u32());
  if (Number.isFinite(x)) numbers.push(x);
}
const numberLines = [];
for (const x of numbers) {
  const y = below(4) === 0 ? -x : x;
  numberLines.push(bitsHex(y) + "," + JSON.stringify(y));
}
numberLines.push(bitsHex(-0) + ",0", bitsHex(0) + ",0");
fs.writeFileSync(path.join(outDir, "numbers.txt"), numberLines.join("\n") + "\n");

// ---------------------------------------------------------------- documents
const pools = [
  () => 0x20 + below(0x5f),            // printable ASCII
  () => below(0x20),                   // controls
  () => pick([0x7f, 0x22, 0x5c, 0x2f]), // DEL, quote, backslash, slash
  () => 0x80 + below(0x780),           // two-byte UTF-8
  () => pick([0x2028, 0x2029, 0x20ac, 0xfb33, 0xfeff, 0xfffd, 0xffff]),
  () => 0x4e00 + below(0x5000),        // CJK
  () => 0xe000 + below(0x1ffe),        // private use and up to U+FFFD
  () => 0x10000 + below(0x100000),     // astral: surrogate pairs in UTF-16
];
function randomString(maxLen, isName) {
  let s = "";
  const n = below(maxLen + 1);
  for (let i = 0; i < n; i++) {
    const cp = pick(pools)();
    if (cp !== 0 || !isName) s += String.fromCodePoint(cp); // jansson refuses U+0000 in names
  }
  return s;
}
function randomNumber() {
  switch (below(5)) {
  case 0: return below(2000) - 1000;
  case 1: return pick(numbers);
  case 2: return -pick(numbers);
  case 3: return Number((rnd() * 100).toFixed(below(6)));
  default: return pick([0, -0, 1e21, 1e-7, 1e-6, 9007199254740992, 5e-324, 1.7976931348623157e308]);
  }
}
function randomValue(depth) {
  const r = depth === 0 ? 7 + below(2) : below(depth > 3 ? 6 : 9);
  if (r === 0) return null;
  if (r === 1) return rnd() < 0.5;
  if (r <= 3) return randomNumber();
  if (r <= 5) return randomString(12);
  if (r <= 6) return Array.from({ length: below(depth === 0 ? 12 : 6) }, () => randomValue(depth + 1));
  const o = {};
  const n = depth === 0 ? 4 + below(9) : below(7);
  for (let i = 0; i < n; i++) {
    const k = randomString(4, true);
    if (k !== "__proto__") o[k] = randomValue(depth + 1);
  }
  return o;
}

// the non-canonical writer
const ws = () => pick(["", "", " ", "\n", "\t", "  ", "\r\n  "]);
const hex4 = (u) => { const h = u.toString(16).padStart(4, "0"); return below(2) ? h : h.toUpperCase(); };
const shortEsc = { 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r" };
function writeString(s) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (cp === 0x22) out += below(4) ? '\\"' : "\\u" + hex4(cp);
    else if (cp === 0x5c) out += below(4) ? "\\\\" : "\\u" + hex4(cp);
    else if (cp < 0x20) out += shortEsc[cp] && below(2) ? shortEsc[cp] : "\\u" + hex4(cp);
    else if (cp === 0x2f && below(2)) out += "\\/";
    else if (below(6) === 0) for (let i = 0; i < ch.length; i++) out += "\\u" + hex4(ch.charCodeAt(i));
    else out += ch;
  }
  return out + '"';
}
function writeNumber(x) {
  if (Object.is(x, -0)) return pick(["-0", "-0.0", "-0e0", "-0E+5"]);
  const forms = [JSON.stringify(x), x.toPrecision(17), x.toExponential(), x.toExponential().toUpperCase()];
  if (Number.isInteger(x) && Math.abs(x) < 1e21) forms.push(x + ".0", x + ".000", x + "e0", x + "E-0");
  return pick(forms).replace("e+", pick(["e+", "e", "E+"]));
}
function write(v) {
  if (v === null || typeof v === "boolean") return String(v);
  if (typeof v === "number") return writeNumber(v);
  if (typeof v === "string") return writeString(v);
  if (Array.isArray(v)) return "[" + ws() + v.map((x) => write(x) + ws()).join("," + ws()) + "]";
  const keys = Object.keys(v);
  for (let i = keys.length - 1; i > 0; i--) { const j = below(i + 1); [keys[i], keys[j]] = [keys[j], keys[i]]; }
  return "{" + ws() + keys.map((k) => writeString(k) + ws() + ":" + ws() + write(v[k]) + ws()).join("," + ws()) + "}";
}

function sameValue(a, b) {
  if (typeof a !== typeof b) return false;
  if (a === null || typeof a !== "object") return Object.is(a, b);
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && sameValue(a[k], b[k]));
}

const fixed = [
  // RFC 8785 section 3.2.3 (sorting) and 3.2.2 (the main example), written as in the RFC
  '{\n  "\\u20ac": "Euro Sign",\n  "\\r": "Carriage Return",\n  "\\ufb33": "Hebrew Letter Dalet With Dagesh",\n' +
  '  "1": "One",\n  "\\ud83d\\ude00": "Emoji: Grinning Face",\n  "\\u0080": "Control",\n  "\\u00f6": "Latin Small Letter O With Diaeresis"\n}\n',
  '{\n  "numbers": [333333333.33333329, 1E30, 4.50,\n              2e-3, 0.000000000000000000000000001],\n' +
  '  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n  "literals": [null, true, false]\n}\n',
  // integers beyond 2^53 become the nearest double
  '[9007199254740993, 18446744073709551616, 100000000000000000000000, -0.00000099999999999999995]',
  '"top-level string with \\u2028 and \\/"',
  "  -0.0  ",
];
let docNo = 0;
function emit(text) {
  const name = "doc-" + String(docNo++).padStart(2, "0");
  fs.writeFileSync(path.join(outDir, name + ".json"), text);
  fs.writeFileSync(path.join(outDir, name + ".canon"), jcs(JSON.parse(text)));
}
for (const text of fixed) emit(text);
while (docNo < 40) {
  const v = randomValue(0);
  const text = write(v);
  if (!sameValue(JSON.parse(text), v)) throw new Error("writer bug: " + text);
  emit(text);
}
console.log(`wrote ${numberLines.length} numbers and ${docNo} documents to ${outDir}`);
