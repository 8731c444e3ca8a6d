/*
 * agent_turns.c - two turns of an agent on libkvpin (kvpin.h): the second
 * prompt is the first prompt, the first answer and the next words, so the
 * second turn reuses the K/V the first one computed (prompt and answer)
 * instead of computing them again, and the cache report says how much it
 * reused and where the prompt left the cache.
 *
 *   turn 1: [ prompt 1 ]                      -> answer 1   (all computed)
 *   turn 2: [ prompt 1 | answer 1 | next ]    -> answer 2   (prompt 1 + answer 1 reused)
 *
 * Generation is greedy, so each answer is what `kvpin run --temp 0 -n N -p
 * PROMPT` prints for the same prompt: stdout gets each turn's text as it is
 * generated, then a newline, exactly as kvpin run writes it. stderr gets
 * each turn's cache report and the memory bill at the end.
 *
 * Usage: agent_turns MODEL.gguf [PROMPT [NEXT [N]]]
 *   the bundled model is installed as $(pkg-config --variable=modeldir kvpin)/stories260K.gguf;
 *   PROMPT defaults to "Once upon a time", NEXT to " Then the sun came out.", N (tokens
 *   per answer) to 32.
 *
 * Build against an installed kvpin:
 *   cc -o agent_turns agent_turns.c $(pkg-config --cflags --libs kvpin)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvpin.h>

/* Streams released text to stdout (the library calls it as text is ready). */
static int print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* go on */
}

static void print_report(int turn, const kp_cache_report *r) {
    fprintf(stderr, "turn %d: %u prompt tokens, %u reused, %u computed, diverged at token %u (byte %zu), cause %s\n",
            turn, r->prompt_tokens, r->reused_tokens, r->computed_tokens, r->diverged_at_token, r->diverged_at_byte,
            r->cause_name);
    if (r->cause != KP_CAUSE_COLD) {
        fprintf(stderr, "  cached : %s\n", r->cached_snippet);
        fprintf(stderr, "  request: %s\n", r->request_snippet);
    }
    if (r->advice[0]) fprintf(stderr, "  advice : %s\n", r->advice);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT [NEXT [N]]]\n", argv[0]);
        return 2;
    }
    const char *model = argv[1];
    const char *prompt1 = argc > 2 ? argv[2] : "Once upon a time";
    const char *next = argc > 3 ? argv[3] : " Then the sun came out.";
    long n = argc > 4 ? strtol(argv[4], NULL, 10) : 32;
    if (n < 1 || n > 4096) {
        fprintf(stderr, "%s: N must be 1..4096\n", argv[0]);
        return 2;
    }

    kp_err err;
    kp_lm *lm = NULL;
    kp_session *s = NULL;
    char *prompt2 = NULL;
    int rc = 1;
    if (kp_lm_open(&lm, model, &err) != KP_RC_OK) goto fail;
    /* the defaults: F16 KV, a context of min(training, 4096), the prefix cache on */
    if (kp_session_new(&s, lm, NULL, &err) != KP_RC_OK) goto fail;

    kp_request rq = kp_request_defaults();
    rq.sampling.temp = 0; /* greedy */
    rq.max_tokens = (uint32_t)n;
    rq.on_text = print_text;
    kp_output out;

    /* turn 1: nothing is cached yet */
    if (kp_generate_text(s, prompt1, strlen(prompt1), &rq, &out, &err) != KP_RC_OK) goto fail;
    putchar('\n');
    fflush(stdout);
    print_report(1, &out.cache);

    /* turn 2: the conversation so far, then the next words */
    size_t l1 = strlen(prompt1), l2 = strlen(next);
    prompt2 = malloc(l1 + out.text_len + l2 + 1);
    if (!prompt2) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        goto done;
    }
    memcpy(prompt2, prompt1, l1);
    memcpy(prompt2 + l1, out.text, out.text_len); /* out.text is the session's until the next call */
    memcpy(prompt2 + l1 + out.text_len, next, l2 + 1);
    if (kp_generate_text(s, prompt2, strlen(prompt2), &rq, &out, &err) != KP_RC_OK) goto fail;
    putchar('\n');
    fflush(stdout);
    print_report(2, &out.cache);

    kp_memory m;
    kp_session_memory(s, &m);
    fprintf(stderr, "memory: %llu bytes per token, budget %llu, used %llu, %llu tokens cached, pinned %llu\n",
            (unsigned long long)m.bytes_per_token, (unsigned long long)m.budget_bytes,
            (unsigned long long)m.used_bytes, (unsigned long long)m.cached_tokens,
            (unsigned long long)m.pinned_bytes);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "%s: %s\n", argv[0], err.msg);
done:
    free(prompt2);
    kp_session_free(s);
    kp_lm_free(lm);
    return rc;
}
