/*
 * tok_pretok.c - BPE pre-tokenizers: which regexes a `tokenizer.ggml.pre`
 * name stands for, and splitting text into words with them (PCRE2).
 *
 * Owns, per vocabulary, the compiled regexes of one pre-tokenizer (compiled
 * once at load, JIT-compiled when PCRE2 supports it, then only read).
 *
 * The regex lists are llama.cpp's (llm_tokenizer_bpe in llama-vocab.cpp),
 * and the splitting follows llama.cpp's unicode_regex_split:
 *
 *   text:        "Hello world 123"
 *   pieces:      [--------------]                  start with one piece
 *   regex 1:     [Hello][ world][ 123]              matches and the gaps
 *   regex 2:     each piece is split again on its own (a piece's ends are
 *                the subject's ends for ^, $ and lookarounds)
 *
 * Every match and every non-empty gap between matches becomes a piece; an
 * empty match only marks a boundary. llama.cpp runs std::regex (or a hand
 * written equivalent for the GPT-2 and Llama-3 patterns) on a "collapsed"
 * copy of the text where each non-ASCII code point becomes one byte
 * standing for its Unicode category. With PCRE2 in UTF + UCP mode the same
 * patterns run on the real code points and classify them the same way, with
 * two adjustments made when compiling:
 *
 *   - \s and \S are replaced by an explicit class: ASCII \t\n\v\f\r and
 *     space plus the non-ASCII White_Space characters, which is llama.cpp's
 *     whitespace set (PCRE2's own \s also takes U+180E, which is not
 *     White_Space);
 *   - $ means the end of the piece only (PCRE2_DOLLAR_ENDONLY, as in
 *     ECMAScript), and deepseek-llm's "\s+$" is written "(?<!\s)\s+$"
 *     (same leftmost match) so a long blank run costs linear time.
 *
 * Remaining differences are in the Unicode tables themselves (PCRE2's
 * Unicode version vs llama.cpp's generated tables) and, for \p{S} only,
 * ASCII '~' (llama.cpp's collapsed \p{S} omits it); none of the supported
 * vocabularies' test vectors exercise them.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_impl.h"
#include "base/buf.h"

/* ---- regex lists ---- */

#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                  \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"  \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                   \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"       \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RX_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

/* deepseek-llm's cased-letter class (code points as in llama.cpp's source) */
#define RX_DEEPSEEK_LETTERS                                                                        \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"          \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"        \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}" \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"        \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"       \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"        \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                  \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"        \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                 \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"          \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"

#define MAX_REGEXES 6

static const char *const regex_lists[KP_TOK_PRE_COUNT_][MAX_REGEXES + 1] = {
    [KP_TOK_PRE_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
    [KP_TOK_PRE_LLAMA3] = {RX_LLAMA3, NULL},
    [KP_TOK_PRE_DEEPSEEK_LLM] = {"[\\r\\n]", RX_DEEPSEEK_LETTERS,
                              "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
                              "\\x{3000}-\\x{3002}]+",
                              "(?<!\\s)\\s+$", RX_CJK, "\\p{N}+", NULL},
    [KP_TOK_PRE_DEEPSEEK3_LLM] = {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
                               "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                               "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|"
                               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                               NULL},
    [KP_TOK_PRE_DEEPSEEK_CODER] = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL},
    [KP_TOK_PRE_FALCON] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL},
    [KP_TOK_PRE_STARCODER] = {"\\p{N}", RX_GPT2, NULL},
    [KP_TOK_PRE_GPT2] = {RX_GPT2, NULL},
    [KP_TOK_PRE_QWEN2] = {RX_QWEN2, NULL},
    [KP_TOK_PRE_QWEN35] = {RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                        "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                        NULL},
    [KP_TOK_PRE_PORO] = {RX_PORO, NULL},
    [KP_TOK_PRE_VIKING] = {RX_PORO, "\\p{N}", NULL},
    [KP_TOK_PRE_TEKKEN] = {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
                        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
                        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                        NULL},
    [KP_TOK_PRE_CHAMELEON] = {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                           "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RX_GPT2, NULL},
    [KP_TOK_PRE_GPT4O] = {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RX_CONTRACTIONS
                       "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RX_CONTRACTIONS
                       "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                       NULL},
    [KP_TOK_PRE_SEED_CODER] = {RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
                                            "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                            NULL},
    [KP_TOK_PRE_BAILINGMOE] = {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                            "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
                            NULL},
    [KP_TOK_PRE_UFAKZEKA] = {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                          NULL},
};

/* ---- names (llama.cpp's llama_vocab::impl::load) ---- */

#define IGN KP_TOK_PRE_F_IGNORE_MERGES
#define BOS KP_TOK_PRE_F_ADD_BOS
#define NOC KP_TOK_PRE_F_NO_CLEAN
#define NOB KP_TOK_PRE_F_NO_BOS

static const kp_tok_pre_info pre_names[] = {
    {"default", KP_TOK_PRE_DEFAULT, 0},
    {"llama3", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"llama-v3", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"llama-bpe", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"falcon3", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"falcon-h1", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"pixtral", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"midm-2.0", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"lfm2", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"jina-v5-nano", KP_TOK_PRE_LLAMA3, IGN | BOS},
    {"deepseek-llm", KP_TOK_PRE_DEEPSEEK_LLM, NOC},
    {"deepseek-coder", KP_TOK_PRE_DEEPSEEK_CODER, NOC},
    {"deepseek-v3", KP_TOK_PRE_DEEPSEEK3_LLM, NOC},
    {"hunyuan-dense", KP_TOK_PRE_DEEPSEEK3_LLM, NOC},
    {"joyai-llm", KP_TOK_PRE_DEEPSEEK3_LLM, NOC},
    {"falcon", KP_TOK_PRE_FALCON, 0},
    {"mpt", KP_TOK_PRE_GPT2, 0},
    {"starcoder", KP_TOK_PRE_STARCODER, 0},
    {"gpt-2", KP_TOK_PRE_GPT2, 0},
    {"phi-2", KP_TOK_PRE_GPT2, 0},
    {"jina-es", KP_TOK_PRE_GPT2, 0},
    {"jina-de", KP_TOK_PRE_GPT2, 0},
    {"gigachat", KP_TOK_PRE_GPT2, 0},
    {"jina-v2-es", KP_TOK_PRE_GPT2, 0},
    {"jina-v2-de", KP_TOK_PRE_GPT2, 0},
    {"a.x-4.0", KP_TOK_PRE_GPT2, 0},
    {"mellum", KP_TOK_PRE_GPT2, 0},
    {"modern-bert", KP_TOK_PRE_GPT2, 0},
    {"jina-v1-en", KP_TOK_PRE_GPT2, 0},
    {"jina-v2-code", KP_TOK_PRE_GPT2, 0},
    {"roberta-bpe", KP_TOK_PRE_GPT2, 0},
    {"exaone4", KP_TOK_PRE_GPT2, 0},
    {"olmo", KP_TOK_PRE_GPT2, 0},
    {"jais", KP_TOK_PRE_GPT2, 0},
    {"trillion", KP_TOK_PRE_GPT2, NOC},
    {"granite-docling", KP_TOK_PRE_GPT2, NOC},
    {"refact", KP_TOK_PRE_STARCODER, 0},
    {"command-r", KP_TOK_PRE_STARCODER, NOC},
    {"smollm", KP_TOK_PRE_STARCODER, NOC},
    {"codeshell", KP_TOK_PRE_STARCODER, 0},
    {"exaone", KP_TOK_PRE_STARCODER, 0},
    {"minerva-7b", KP_TOK_PRE_STARCODER, 0},
    {"mellum2", KP_TOK_PRE_STARCODER, 0},
    {"qwen2", KP_TOK_PRE_QWEN2, NOC},
    {"deepseek-r1-qwen", KP_TOK_PRE_QWEN2, NOC},
    {"kormo", KP_TOK_PRE_QWEN2, NOC},
    {"f2llmv2", KP_TOK_PRE_QWEN2, NOC},
    {"megrez", KP_TOK_PRE_QWEN2, 0},
    {"stablelm2", KP_TOK_PRE_QWEN2, 0},
    {"hunyuan", KP_TOK_PRE_QWEN2, NOC},
    {"solar-open", KP_TOK_PRE_QWEN2, NOC},
    {"grok-2", KP_TOK_PRE_QWEN2, NOC},
    {"qwen35", KP_TOK_PRE_QWEN35, NOC},
    {"dbrx", KP_TOK_PRE_LLAMA3, 0},
    {"smaug-bpe", KP_TOK_PRE_LLAMA3, 0},
    {"glm4", KP_TOK_PRE_LLAMA3, NOB},
    {"chatglm-bpe", KP_TOK_PRE_LLAMA3, NOB},
    {"poro-chat", KP_TOK_PRE_PORO, NOC},
    {"bloom", KP_TOK_PRE_PORO, 0},
    {"gpt3-finnish", KP_TOK_PRE_PORO, 0},
    {"viking", KP_TOK_PRE_VIKING, NOC},
    {"tekken", KP_TOK_PRE_TEKKEN, NOC | IGN | BOS},
    {"chameleon", KP_TOK_PRE_CHAMELEON, BOS | NOC},
    {"gpt-4o", KP_TOK_PRE_GPT4O, NOC},
    {"llama4", KP_TOK_PRE_GPT4O, NOC},
    {"kanana2", KP_TOK_PRE_GPT4O, NOC},
    {"talkie", KP_TOK_PRE_GPT4O, NOC},
    {"minimax-m2", KP_TOK_PRE_GPT4O, NOC},
    {"seed-coder", KP_TOK_PRE_SEED_CODER, NOC},
    {"bailingmoe", KP_TOK_PRE_BAILINGMOE, NOC},
    {"bailingmoe2", KP_TOK_PRE_BAILINGMOE, NOC},
    {"llada-moe", KP_TOK_PRE_BAILINGMOE, NOC},
    {"ufakzeka", KP_TOK_PRE_UFAKZEKA, NOC},
};

const kp_tok_pre_info *kp_tok_pre_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, name, len) == 0)
            return &pre_names[i];
    return NULL;
}

/* ---- compiling ---- */

/* The body of llama.cpp's \s class (ASCII \t-\r and space, plus the
 * non-ASCII White_Space code points). */
#define WS_BODY                                                                                    \
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

struct kp_tok_pretok {
    kp_tok_pre_kind kind;
    size_t n;
    pcre2_code *code[MAX_REGEXES];
};

/* Rewrites \s / \S as described at the top. Returns a malloc'd string. */
static char *rewrite_regex(const char *rx) {
    size_t n = strlen(rx), cap = n + 1;
    for (size_t i = 0; i + 1 < n; i++)
        if (rx[i] == '\\') {
            if (rx[i + 1] == 's' || rx[i + 1] == 'S') cap += sizeof("[^" WS_BODY "]");
            i++;
        }
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = rx[i];
        if (c == '\\' && i + 1 < n) {
            char d = rx[i + 1];
            const char *rep = NULL;
            if (d == 's') rep = in_class ? WS_BODY : "[" WS_BODY "]";
            if (d == 'S' && !in_class) rep = "[^" WS_BODY "]";
            if (rep) {
                size_t rl = strlen(rep);
                memcpy(out + o, rep, rl);
                o += rl;
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            out[o++] = c;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && rx[i + 1] == '^') out[o++] = rx[++i];
            if (i + 1 < n && rx[i + 1] == ']') out[o++] = rx[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

void kp_tok_pretok_free(kp_tok_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) pcre2_code_free(p->code[i]);
    free(p);
}

kp_status kp_tok_pretok_new(kp_tok_pretok **out, kp_tok_pre_kind kind, kp_error *err) {
    *out = NULL;
    if ((int)kind < 0 || kind >= KP_TOK_PRE_COUNT_)
        return kp_fail(err, KP_EINVAL, "tokenizer: bad pre-tokenizer kind %d", (int)kind);
    kp_tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    p->kind = kind;
    for (size_t i = 0; regex_lists[kind][i]; i++) {
        char *rx = rewrite_regex(regex_lists[kind][i]);
        if (!rx) {
            kp_tok_pretok_free(p);
            return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
        }
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)rx, PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            kp_fail(err, KP_EFORMAT, "tokenizer: pre-tokenizer regex %zu does not compile at %zu: %s",
                    i, (size_t)eo, (const char *)msg);
            free(rx);
            kp_tok_pretok_free(p);
            return KP_EFORMAT;
        }
        free(rx);
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
        p->code[p->n++] = code;
    }
    *out = p;
    return KP_OK;
}

/* ---- splitting ---- */

typedef struct {
    kp_tok_span *v;
    size_t n, cap;
} span_list;

static int span_push(span_list *l, size_t start, size_t len) {
    if (!kp_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return -1;
    l->v[l->n].start = start;
    l->v[l->n].len = len;
    l->n++;
    return 0;
}

/* Splits one piece with one regex, appending the resulting pieces. */
static kp_status split_piece(const pcre2_code *code, pcre2_match_data *md, const char *text,
                             kp_tok_span piece, span_list *out, kp_error *err) {
    const PCRE2_SPTR subj = (PCRE2_SPTR)(text + piece.start);
    const size_t n = piece.len;
    size_t prev_end = 0; /* end of the last emitted piece */
    size_t pos = 0;      /* where the next search starts */
    uint32_t opts = 0;
    while (pos <= n) {
        int rc = pcre2_match(code, subj, n, pos, opts | PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (opts == 0) break;
            /* no non-empty match at an empty match's position: step one character */
            opts = 0;
            pos++;
            while (pos < n && (subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kp_fail(err, rc == PCRE2_ERROR_NOMEMORY ? KP_ENOMEM : KP_ERANGE,
                           "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev_end && span_push(out, piece.start + prev_end, ms - prev_end))
            return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
        if (me > ms && span_push(out, piece.start + ms, me - ms))
            return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
        prev_end = me;
        pos = me;
        /* after an empty match, look for a non-empty one at the same place */
        opts = me == ms ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
        if (me == ms && pos >= n) break;
    }
    if (prev_end < n && span_push(out, piece.start + prev_end, n - prev_end))
        return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
    return KP_OK;
}

kp_status kp_tok_pretok_split(const kp_tok_pretok *p, const char *text, size_t len, kp_tok_span **words,
                           size_t *n_words, kp_error *err) {
    *words = NULL;
    *n_words = 0;
    if (len == 0) return KP_OK;
    span_list cur = {0}, next = {0};
    kp_status st = KP_OK;
    pcre2_match_data *md = pcre2_match_data_create(32, NULL);
    if (!md || span_push(&cur, 0, len)) {
        st = kp_fail(err, KP_ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (size_t r = 0; r < p->n; r++) {
        next.n = 0;
        for (size_t i = 0; i < cur.n; i++) {
            st = split_piece(p->code[r], md, text, cur.v[i], &next, err);
            if (st != KP_OK) goto done;
        }
        span_list t = cur;
        cur = next;
        next = t;
    }
    *words = cur.v;
    *n_words = cur.n;
    cur.v = NULL;
done:
    free(cur.v);
    free(next.v);
    pcre2_match_data_free(md);
    return st;
}
