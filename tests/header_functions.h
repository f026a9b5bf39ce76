/*
 * tests/header_functions.h — the names of the functions a C header declares at its top level, read
 * from the file itself: what tests/test_api_sweep.c compares its table with, so that a function
 * added to include/umtrain.h without a row fails the test. A simple reader, enough for umtrain.h:
 * comments, preprocessor lines and the C++ guard are left out; in each declaration outside braces
 * that is not a typedef, the identifier before its first '(' is a function's name.
 */
#ifndef UMT_TESTS_HEADER_FUNCTIONS_H
#define UMT_TESTS_HEADER_FUNCTIONS_H

#define UMT_HEADER_MAX_FUNCTIONS 512

/* Fills names (at most UMT_HEADER_MAX_FUNCTIONS) and returns how many; -1 when path cannot be read. */
int umt_header_functions(const char *path, char names[][64]);

#endif /* UMT_TESTS_HEADER_FUNCTIONS_H */
