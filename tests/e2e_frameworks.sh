#!/bin/sh
# End-to-end tests of `kvpin serve` through the agent frameworks: the Vercel
# AI SDK (ai + @ai-sdk/openai-compatible) and LangChain JS (@langchain/openai)
# with zod schemas, every structured output validated by ajv against the
# JSON Schema the framework sent (tests/node/frameworks.test.mjs, run with
# `node --test`), from the repository root with the binary in $KVPIN
# (default ./kvpin).
#
# One server on a free port: the bundled model as a new user starts it
# (its default chat template, chatml), with an API key. The packages are
# installed into tests/node/node_modules from tests/node/package-lock.json
# on first use, or when what is installed differs from the lock (needs
# Node 20 and the npm registry); without them this test fails, it never
# passes silently. After the tests, the server must exit 0 on SIGTERM with
# nothing from the sanitizers in its stderr.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
PID=""
cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_frameworks: $*"; }
give_up() {
    bad "$*"
    echo "e2e_frameworks: $pass passed, $fail failed"
    exit 1
}
M=models/stories260K.gguf
KEY=sekret
CTX=2048

# ---- the packages
for tool in node npm curl; do
    command -v $tool >/dev/null 2>&1 || give_up "$tool not found: the agent framework tests need Node.js 20+ with npm, and curl"
done
node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' ||
    give_up "Node.js $(node --version) is too old: the agent framework tests need Node.js 20+"
# every package of the lock installed at its locked version?
node -e '
const fs = require("fs"), dir = "tests/node/";
const lock = JSON.parse(fs.readFileSync(dir + "package-lock.json", "utf8"));
for (const [path, p] of Object.entries(lock.packages)) {
    if (!path || p.optional || p.dev) continue;
    let v;
    try { v = JSON.parse(fs.readFileSync(dir + path + "/package.json", "utf8")).version; } catch { process.exit(1); }
    if (v !== p.version) process.exit(1);
}' || {
    echo "e2e_frameworks: installing tests/node/package-lock.json into tests/node/node_modules (npm ci)"
    npm ci --prefix tests/node --no-audit --no-fund >"$T/npm.log" 2>&1 || {
        cat "$T/npm.log"
        give_up "npm ci --prefix tests/node failed: the agent framework tests need the npm registry on first run"
    }
}

# ---- the server
: >"$T/err"
# (not the caller's KVPIN_API_KEY: the key is what the arguments say)
env -u KVPIN_API_KEY "$KVPIN" serve -m $M --port 0 -t 1 --api-key "$KEY" --ctx $CTX --quiet 2>"$T/err" &
PID=$!
URL=""
i=0
while [ $i -lt 200 ]; do # 20 s for the listening line, then for /health
    port=$(sed -n 's|^kvpin serve: listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$T/err")
    if [ -n "$port" ] && curl -sf --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        URL="http://127.0.0.1:$port"
        break
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
done
[ -n "$URL" ] || { cat "$T/err"; give_up "the server did not start"; }

# ---- the framework tests
KVPIN_URL=$URL KVPIN_API_KEY=$KEY KVPIN_MODEL_ID=$(basename $M) AI_SDK_LOG_WARNINGS=false \
    timeout 300 node --test --test-reporter=spec tests/node/frameworks.test.mjs >"$T/node.log" 2>&1
rc=$?
n_pass=$(sed -n 's/^[^ ]* pass \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1) # the spec reporter's summary
n_fail=$(sed -n 's/^[^ ]* fail \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1)
if [ $rc -eq 0 ] && [ "${n_pass:-0}" -gt 0 ] && [ "${n_fail:-1}" -eq 0 ]; then
    pass=$((pass + n_pass))
else
    cat "$T/node.log"
    pass=$((pass + ${n_pass:-0}))
    bad "node --test tests/node/frameworks.test.mjs: ${n_fail:-?} of $((${n_pass:-0} + ${n_fail:-0})) failed (exit $rc)"
fi

# ---- the server's exit
kill -TERM "$PID" 2>/dev/null
i=0
while kill -0 "$PID" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$PID" 2>/dev/null; then
    kill -9 "$PID" 2>/dev/null
    bad "the server did not exit within 20 s of SIGTERM"
fi
wait "$PID"
rc=$?
PID=""
if [ "$rc" -eq 0 ]; then ok; else bad "the server exits 0 after SIGTERM (got $rc)"; fi
if grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$T/err"; then
    bad "the server: sanitizer report"
    cat "$T/err"
else
    ok
fi
echo "e2e_frameworks: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
