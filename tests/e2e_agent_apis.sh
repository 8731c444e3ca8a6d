#!/bin/sh
# End-to-end tests of `kvpin serve`'s agent APIs: Anthropic's Messages API
# through the official `@anthropic-ai/sdk` npm client
# (tests/node/anthropic.test.mjs), OpenAI's Responses API through the
# official `openai` client and the parity of the three chat APIs
# (tests/node/responses.test.mjs), run with `node --test` from the
# repository root with the binary in $KVPIN (default ./kvpin).
#
# Two servers on free ports, both on the bundled model with F32 KV and the
# chatml template: one with an API key (the client sends it as x-api-key),
# one with a short --pin-ttl-scale so that a cache_control TTL expires
# within the test ("5m" is 6 s). The clients are installed into tests/node/node_modules
# on first use (needs Node 20 and the npm registry); without them this test
# fails, it never passes silently. After the client tests, each server must
# exit 0 on SIGTERM with nothing from the sanitizers in its stderr.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_agent_apis: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
give_up() {
    bad "$*"
    echo "e2e_agent_apis: $pass passed, $fail failed"
    exit 1
}
M=models/stories260K.gguf
KEY=sekret
CTX=2048

# ---- the client
for tool in node npm curl; do
    command -v $tool >/dev/null 2>&1 || give_up "$tool not found: the Anthropic client tests need Node.js 20+ with npm, and curl"
done
node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' ||
    give_up "Node.js $(node --version) is too old: the Anthropic client tests need Node.js 20+"
stale=""
for pkg in @anthropic-ai/sdk openai ajv; do # missing, or another version than package.json pins
    pinned=$(node -p "require('./tests/node/package.json').dependencies['$pkg']")
    installed=$(node -p "require('./tests/node/node_modules/$pkg/package.json').version" 2>/dev/null)
    [ "$installed" = "$pinned" ] || stale="$stale $pkg"
done
if [ -n "$stale" ]; then
    echo "e2e_agent_apis: installing the openai client into tests/node/node_modules (npm ci)"
    npm ci --prefix tests/node --no-audit --no-fund >"$T/npm.log" 2>&1 || {
        cat "$T/npm.log"
        give_up "npm ci --prefix tests/node failed: the Anthropic client tests need the npm registry on first run"
    }
fi

# ---- the servers
start() { # start NAME ARGS...: starts a server; its URL goes to $T/NAME.url
    name=$1; shift
    : >"$T/$name.err"
    # (not the caller's KVPIN_API_KEY: the key is what the arguments say)
    env -u KVPIN_API_KEY "$KVPIN" serve -m $M --port 0 -t 1 --kv-type f32 --quiet "$@" 2>"$T/$name.err" &
    pid=$!
    PIDS="$PIDS $pid"
    echo "$pid" >"$T/$name.pid"
    port=""
    i=0
    while [ $i -lt 200 ]; do # 20 s for the listening line, then for /health
        port=$(sed -n 's|^kvpin serve: listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$T/$name.err")
        if [ -n "$port" ] && curl -sf --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            echo "http://127.0.0.1:$port" >"$T/$name.url"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    cat "$T/$name.err"
    return 1
}
stop() { # stop NAME: SIGTERM, at most 20 s to exit; checks status 0 and a clean stderr
    name=$1
    pid=$(cat "$T/$name.pid")
    kill -TERM "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        bad "$name server did not exit within 20 s of SIGTERM"
    fi
    wait "$pid"
    rc=$?
    check "$name server exits 0 after SIGTERM (got $rc)" test "$rc" -eq 0
    if grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error" "$T/$name.err"; then
        bad "$name server: sanitizer report"
        cat "$T/$name.err"
    else
        ok
    fi
}

start main --chat-template chatml --api-key "$KEY" --ctx $CTX || give_up "the chatml server did not start"
start ttl --chat-template chatml --ctx $CTX --pin-ttl-scale 0.02 || give_up "the short-TTL server did not start"

# ---- the client tests
KVPIN_URL=$(cat "$T/main.url") KVPIN_API_KEY=$KEY KVPIN_TTL_URL=$(cat "$T/ttl.url") \
    timeout 600 node --test --test-concurrency=1 --test-reporter=spec tests/node/anthropic.test.mjs \
    tests/node/responses.test.mjs >"$T/node.log" 2>&1
rc=$?
n_pass=$(sed -n 's/^[^ ]* pass \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1) # the spec reporter's summary
n_fail=$(sed -n 's/^[^ ]* fail \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1)
if [ $rc -eq 0 ] && [ "${n_pass:-0}" -gt 0 ] && [ "${n_fail:-1}" -eq 0 ]; then
    pass=$((pass + n_pass))
else
    cat "$T/node.log"
    bad "node --test tests/node/anthropic.test.mjs responses.test.mjs: ${n_fail:-?} of $((${n_pass:-0} + ${n_fail:-0})) failed (exit $rc)"
fi

stop main
stop ttl
PIDS=""
echo "e2e_agent_apis: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
