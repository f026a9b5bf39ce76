/* tests/header_functions.c — the functions a C header declares (see header_functions.h). */
#include "tests/header_functions.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* Blanks comments, preprocessor lines and the C++ guard's lines (between #ifdef __cplusplus and
 * its #endif) out of text, in place. */
static void keep_declarations(char *text) {
    for (char *p = text; *p; ++p) {
        if (p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            end = end ? end + 2 : p + strlen(p);
            memset(p, ' ', (size_t)(end - p));
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
        }
    }
    bool guard = false;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        if (end) *end = '\0';
        char *first = line + strspn(line, " \t");
        bool directive = *first == '#';
        if (directive && strstr(first, "__cplusplus")) guard = true;
        bool guard_ends = guard && directive && strncmp(first, "#endif", 6) == 0;
        if (guard || directive) memset(line, ' ', length);
        if (guard_ends) guard = false;
        if (end) *end = '\n';
        line += length + (end != NULL);
    }
}

/* The names of the functions declared at the top level of the header: in each declaration that
 * is not a typedef, the identifier before its first '('. Returns how many. */
int umt_header_functions(const char *path, char names[][64]) {
    char *text = read_text(path);
    if (!text) return -1;
    keep_declarations(text);
    int count = 0, depth = 0;
    char *start = text;
    for (char *p = text; *p; ++p) {
        if (*p == '{') depth++;
        if (*p == '}') depth--;
        if (*p != ';' || depth != 0) continue;
        *p = '\0';
        char *declaration = start + strspn(start, " \t\n");
        char *paren = strchr(declaration, '(');
        start = p + 1;
        if (strncmp(declaration, "typedef", 7) == 0 || !paren) continue;
        char *end = paren;
        while (end > declaration && end[-1] == ' ') end--;
        char *begin = end;
        while (begin > declaration && (begin[-1] == '_' || isalnum((unsigned char)begin[-1]))) begin--;
        if (count < UMT_HEADER_MAX_FUNCTIONS && end > begin && end - begin < 64)
            snprintf(names[count++], 64, "%.*s", (int)(end - begin), begin);
    }
    return count;
}
