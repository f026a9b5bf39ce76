/*
 * tests/test_example_flags.c — the number flags the example programs share
 * (examples/example_common.h): a value must fill the argument and lie in the range, and a count
 * must be whole ("--epochs 2.5" is refused, not cut to 2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "examples/example_common.h"

static void test_a_number_must_fill_the_argument_and_lie_in_the_range(void **state) {
    (void)state;
    double v = -1;
    assert_int_equal(example_number("test", "--lr", "0.5", 1e-9, 100, &v), 0);
    assert_true(v == 0.5);
    assert_int_equal(example_number("test", "--lr", "0.5x", 1e-9, 100, &v), -1);
    assert_int_equal(example_number("test", "--lr", "", 1e-9, 100, &v), -1);
    assert_int_equal(example_number("test", "--lr", "0", 1e-9, 100, &v), -1);
    assert_int_equal(example_number("test", "--lr", "nan", 1e-9, 100, &v), -1);
    assert_int_equal(example_number("test", "--lr", "1e999", 1e-9, 100, &v), -1);
    assert_true(v == 0.5); /* a refused value leaves the output alone */
}

static void test_a_count_must_be_whole(void **state) {
    (void)state;
    double v = -1;
    assert_int_equal(example_whole_number("test", "--epochs", "14", 1, 1000, &v), 0);
    assert_true(v == 14);
    assert_int_equal(example_whole_number("test", "--epochs", "64.0", 1, 1000, &v), 0);
    assert_true(v == 64);
    assert_int_equal(example_whole_number("test", "--epochs", "2.5", 1, 1000, &v), -1);
    assert_int_equal(example_whole_number("test", "--epochs", "1001", 1, 1000, &v), -1);
    assert_true(v == 64);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_number_must_fill_the_argument_and_lie_in_the_range),
        cmocka_unit_test(test_a_count_must_be_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
