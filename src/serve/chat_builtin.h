/*
 * chat_builtin.h - the built-in chat templates (floor 7): kvpin's own
 * Jinja text for each family of chat.h, compiled into the library.
 *
 * The texts are src/serve/templates/NAME.jinja (NAME a family's name,
 * "chatml" ... "zephyr"); the Makefile turns them into the table below
 * (tools/embed.py --table -> build/gen/chat_templates.c). They are
 * rendered like any other template, by chat_tmpl.h
 * (kp_chat_tmpl_builtin); tests/unit/test_chat.c compares their
 * renderings with jinja2's renderings of the real templates.
 */
#ifndef KP_CHAT_BUILTIN_H
#define KP_CHAT_BUILTIN_H

#include <stddef.h>

typedef struct {
    const char *name;          /* the file's name without ".jinja": "qwen2.5" */
    const unsigned char *bytes; /* the text, NUL after its size bytes */
    size_t size;
} kp_embedded;

/* One entry per template, closed by {NULL, NULL, 0}. */
extern const kp_embedded kp_chat_builtins[];

#endif
