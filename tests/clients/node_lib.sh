# node_lib.sh - what the end-to-end tests through the Node clients share
# (sourced by tests/clients/e2e_openai.sh, e2e_agent_apis.sh, e2e_frameworks.sh
# after they set SUITE, their name in messages):
#
#   T, PIDS, cleanup   a scratch folder and the servers to kill on exit
#   ok bad check give_up   the pass / fail counters and their messages
#   node_deps WHAT     Node.js 20+, npm and curl, and every package of
#                      tests/clients/package-lock.json installed at its locked
#                      version (npm ci on first use; needs the npm registry;
#                      without it the suite fails, it never passes silently)
#   start NAME ARGS... a `kvpin serve` on a free port ($KVPIN, model $M,
#                      -t 1, --quiet, then $SERVE_ARGS and ARGS); its URL
#                      goes to $T/NAME.url
#   stop NAME          SIGTERM, at most 20 s to exit; checks status 0 and a
#                      stderr without sanitizer reports
#   run_node SECS FILE...  node --test (spec reporter, one file at a time) on
#                      the files within SECS, in the environment the caller
#                      exported; its passes count, a failure shows its log
#   finish             the closing line and the exit status
KVPIN=${KVPIN:-./kvpin}
M=${M:-models/stories260K.gguf}
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
bad() { fail=$((fail + 1)); echo "FAIL $SUITE: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
finish() {
    echo "$SUITE: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
give_up() {
    bad "$*"
    finish
    exit 1
}

node_deps() { # node_deps WHAT: WHAT names the tests in messages
    for tool in node npm curl; do
        command -v $tool >/dev/null 2>&1 || give_up "$tool not found: the $1 tests need Node.js 20+ with npm, and curl"
    done
    node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' ||
        give_up "Node.js $(node --version) is too old: the $1 tests need Node.js 20+"
    # every package of the lock installed at its locked version?
    node -e '
const fs = require("fs"), dir = "tests/clients/";
const lock = JSON.parse(fs.readFileSync(dir + "package-lock.json", "utf8"));
for (const [path, p] of Object.entries(lock.packages)) {
    if (!path || p.optional || p.dev) continue;
    let v;
    try { v = JSON.parse(fs.readFileSync(dir + path + "/package.json", "utf8")).version; } catch { process.exit(1); }
    if (v !== p.version) process.exit(1);
}' || {
        echo "$SUITE: installing tests/clients/package-lock.json into tests/clients/node_modules (npm ci)"
        npm ci --prefix tests/clients --no-audit --no-fund >"$T/npm.log" 2>&1 || {
            cat "$T/npm.log"
            give_up "npm ci --prefix tests/clients failed: the $1 tests need the npm registry on first run"
        }
    }
}

start() { # start NAME ARGS...: starts a server; its URL goes to $T/NAME.url
    name=$1; shift
    : >"$T/$name.err"
    # (not the caller's KVPIN_API_KEY: the key is what the arguments say)
    # shellcheck disable=SC2086 # SERVE_ARGS: words
    env -u KVPIN_API_KEY "$KVPIN" serve -m "$M" --port 0 -t 1 --quiet $SERVE_ARGS "$@" 2>"$T/$name.err" &
    pid=$!
    PIDS="$PIDS $pid"
    echo "$pid" >"$T/$name.pid"
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

stop() { # stop NAME
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

run_node() { # run_node TIMEOUT FILE...: the spec reporter's summary decides
    limit=$1; shift
    timeout "$limit" node --test --test-concurrency=1 --test-reporter=spec "$@" >"$T/node.log" 2>&1
    rc=$?
    n_pass=$(sed -n 's/^[^ ]* pass \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1)
    n_fail=$(sed -n 's/^[^ ]* fail \([0-9]*\)$/\1/p' "$T/node.log" | tail -n 1)
    if [ $rc -eq 0 ] && [ "${n_pass:-0}" -gt 0 ] && [ "${n_fail:-1}" -eq 0 ]; then
        pass=$((pass + n_pass))
    else
        cat "$T/node.log"
        pass=$((pass + ${n_pass:-0}))
        bad "node --test $*: ${n_fail:-?} of $((${n_pass:-0} + ${n_fail:-0})) failed (exit $rc)"
    fi
}
