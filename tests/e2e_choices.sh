#!/bin/sh
# End-to-end test of n > 1 and logprobs on `kvpin serve`: the prompt
# computed once for n choices, usage counting it once, choice i equal to
# seed + i alone, streamed choices, logprob values against `kvpin logits`.
# The driver is tests/choices_e2e.py; $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin} exec python3 tests/choices_e2e.py
