#!/usr/bin/env python3
"""check_docs.py - the man page and the bash completion against --help
(run by tests/shell/e2e_docs.sh).

The commands are those `kvpin --help` lists, plus `run --prompt-cache`,
which has a --help of its own. A command's options are the lines of its
--help that start an option ("   -m, --model FILE  ...", "       --host HOST
..."; continuation lines are indented further). The check fails (exit 1,
one line per problem) when

  - the man page has no section (.SS NAME) for a command, or a long option
    of a command's --help is not in that section (--help and --version may
    be in "OPTIONS OF EVERY COMMAND" instead);
  - the man page's version (.TH ... "kvpin X.Y.Z") is not KP_VERSION of
    include/kvpin.h;
  - the bash completion (sourced into bash, its _kvpin function called as
    bash calls it) does not offer exactly the commands for `kvpin <TAB>`,
    exactly a command's short and long options for `kvpin CMD -<TAB>`,
    files after -m, or the KV types (f16, f32, q8_0, q4_0) after --kv-type,
    --kv-type-k and --kv-type-v.

Usage: tools/check_docs.py KVPIN docs/kvpin.1 docs/kvpin.bash-completion
"""
import os
import re
import subprocess
import sys
import tempfile

OPTION_LINE = re.compile(r"^ {1,7}(?:(-[a-z]{1,2}), )?(--[a-z0-9-]+)")
EVERY = "OPTIONS OF EVERY COMMAND"


def helptext(kvpin, args):
    r = subprocess.run([kvpin] + args + ["--help"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("check_docs: %s %s --help failed (%d)" % (kvpin, " ".join(args), r.returncode))
    return r.stdout


def commands(kvpin):
    names = re.findall(r"^  ([a-z]+)  ", helptext(kvpin, []), re.M)
    return [[n] for n in names] + [["run", "--prompt-cache"]]


def options(kvpin, cmd):
    shorts, longs = [], []
    for line in helptext(kvpin, cmd).splitlines():
        m = OPTION_LINE.match(line)
        if m:
            if m.group(1):
                shorts.append(m.group(1))
            longs.append(m.group(2))
    return shorts, longs


def man_sections(path):
    """{section title: its text}, for .SH and .SS titles (roff escapes undone)."""
    secs, cur = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r'^\.(SH|SS)\s+"?(.*?)"?\s*$', line)
        if m:
            cur = m.group(2).replace("\\-", "-")
            secs[cur] = ""
        elif cur is not None:
            secs[cur] += line
    return secs


def in_roff(text, opt):
    """opt ("--kv-type") written in roff (\\-\\-kv\\-type), as a whole option."""
    esc = re.escape(opt.replace("-", "\\-"))
    return re.search(esc + r"(?![a-z0-9\\]|\\-)", text) is not None


def complete(completion, words):
    """COMPREPLY of _kvpin for the command line `words` (the last is the one completed)."""
    script = 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _kvpin; ' \
             'printf "%s\\n" "${COMPREPLY[@]}"'
    r = subprocess.run(["bash", "-c", script, "bash", completion] + words, capture_output=True, text=True)
    return [w for w in r.stdout.split("\n") if w]


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    kvpin, man, completion = argv
    errors = []
    cmds = commands(kvpin)
    if len(cmds) < 10:
        errors.append("kvpin --help lists only %d commands" % (len(cmds) - 1))
    secs = man_sections(man)
    for cmd in cmds:
        name = " ".join(cmd)
        shorts, longs = options(kvpin, cmd)
        if not longs:
            errors.append("kvpin %s --help lists no option" % name)
        if name not in secs:
            errors.append("%s: no section '.SS %s'" % (man, name))
            continue
        for opt in longs:
            if not in_roff(secs[name], opt) and not (opt in ("--help", "--version") and in_roff(secs.get(EVERY, ""), opt)):
                errors.append("%s: section '%s' lacks %s (in kvpin %s --help)" % (man, name, opt, name))
        got = set(complete(completion, [kvpin] + cmd + ["-"]))
        want = set(shorts + longs)
        if got != want:
            errors.append("completion of 'kvpin %s -': %s missing, %s extra" %
                          (name, sorted(want - got) or "none", sorted(got - want) or "none"))
    header = open(os.path.join(os.path.dirname(__file__), "..", "include", "kvpin.h"), encoding="utf-8").read()
    version = re.search(r'^#define KP_VERSION "(.*)"', header, re.M).group(1)
    th = re.search(r'^\.TH .*"kvpin ([^"]*)"', open(man, encoding="utf-8").read(), re.M)
    if not th or th.group(1) != version:
        errors.append("%s: .TH names version %s, kvpin.h %s" % (man, th.group(1) if th else "none", version))
    got = set(complete(completion, [kvpin, ""]))
    want = {c[0] for c in cmds} | {"--help", "--version"}
    if got != want:
        errors.append("completion of 'kvpin ': %s missing, %s extra" % (sorted(want - got), sorted(got - want)))
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "model-one.gguf"), "w").close()
        open(os.path.join(d, "model-two.gguf"), "w").close()
        for flag in ("-m", "--model", "-f", "--file"):
            got = complete(completion, [kvpin, "run", flag, os.path.join(d, "model-")])
            if sorted(got) != sorted(os.path.join(d, n) for n in ("model-one.gguf", "model-two.gguf")):
                errors.append("completion after %s: %s, not the two files" % (flag, got))
    for flag in ("--kv-type", "--kv-type-k", "--kv-type-v"):
        got = complete(completion, [kvpin, "serve", flag, ""])
        if sorted(got) != ["f16", "f32", "q4_0", "q8_0"]:
            errors.append("completion after %s: %s" % (flag, got))
    for e in errors:
        print("check_docs: " + e, file=sys.stderr)
    if not errors:
        print("check_docs: %d commands: every --help option in the man page and the completion" % len(cmds))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
