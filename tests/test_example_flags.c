/*
 * tests/test_example_flags.c — the number flags the example programs share
 * (examples/example_common.h): a value must fill the argument and lie in the range, and a count
 * must be whole ("--epochs 2.5" is refused, not cut to 2); a flag given last without its value is
 * told apart from a mistyped one; --optimizer without --lr takes that optimizer's own default
 * rate; the limits and the banners' counts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

static void usage(FILE *out) { fprintf(out, "usage: test [--mem-report] [--mem MODE]\n                [--lr X]\n"); }

/* What example_missing_value writes to stderr for flag, in out. */
static void missing_value_message(const char *flag, char *out, size_t size) {
    FILE *capture = tmpfile();
    assert_non_null(capture);
    fflush(stderr);
    int saved = dup(fileno(stderr));
    dup2(fileno(capture), fileno(stderr));
    assert_int_equal(example_missing_value("test", flag, usage), -1);
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    rewind(capture);
    size_t n = fread(out, 1, size - 1, capture);
    out[n] = '\0';
    fclose(capture);
}

static void test_a_flag_without_its_value_is_told_from_an_unknown_one(void **state) {
    (void)state;
    char message[512];
    missing_value_message("--mem", message, sizeof message);
    assert_string_equal(message, "test: --mem needs a value\n");
    missing_value_message("--lr", message, sizeof message); /* on the usage's second line */
    assert_string_equal(message, "test: --lr needs a value\n");
    /* Only a whole flag of the usage counts: "--me" starts two of them, "--bogus" none. */
    missing_value_message("--me", message, sizeof message);
    assert_non_null(strstr(message, "test: unknown flag --me\nusage: test"));
    missing_value_message("--bogus", message, sizeof message);
    assert_non_null(strstr(message, "test: unknown flag --bogus\n"));
}

static void test_an_optimizer_without_lr_takes_its_own_default_rate(void **state) {
    (void)state;
    const char *names[] = {"sgd", "adam", "adamw", "adadelta"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
        umt_optimizer_kind kind = UMT_OPT_SGD;
        float lr = -1;
        assert_int_equal(example_optimizer("test", names[i], 0, &kind, &lr), 0);
        /* umt_optimizer_defaults is the one source: Adam's 1e-3 never stays Adadelta's 1.0. */
        assert_true(lr == umt_optimizer_defaults(kind).lr);
        assert_int_equal(example_optimizer("test", names[i], 0.25f, &kind, &lr), 0);
        assert_true(lr == 0.25f);
    }
    umt_optimizer_kind kind = UMT_OPT_SGD;
    float lr = 0;
    assert_int_equal(example_optimizer("test", "adam", 0, &kind, &lr), 0);
    assert_int_equal(kind, UMT_OPT_ADAM);
    assert_true(lr == 1e-3f);
    assert_int_equal(example_optimizer("test", "adagrad", 0, &kind, &lr), -1);
}

static void test_a_limit_keeps_the_first_n_and_the_banner_says_of_how_many(void **state) {
    (void)state;
    assert_int_equal(example_limit(60000, 0), 60000);
    assert_int_equal(example_limit(60000, 64), 64);
    assert_int_equal(example_limit(40, 1000), 40);
    char text[64];
    assert_string_equal(example_count_text(text, sizeof text, 64, 60000), "64 of 60000");
    assert_string_equal(example_count_text(text, sizeof text, 40, 40), "40");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_number_must_fill_the_argument_and_lie_in_the_range),
        cmocka_unit_test(test_a_count_must_be_whole),
        cmocka_unit_test(test_a_flag_without_its_value_is_told_from_an_unknown_one),
        cmocka_unit_test(test_an_optimizer_without_lr_takes_its_own_default_rate),
        cmocka_unit_test(test_a_limit_keeps_the_first_n_and_the_banner_says_of_how_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
