/*
 * tests/fuzz/fuzz_sweep.c — a fuzz target as a cmocka test: its seeds (those it must accept and
 * those it must refuse), every single-bit flip of them and every truncation, through the target's
 * rules (tests/fuzz/fuzz_target.h).
 *
 * Deterministic and quick (a few thousand inputs), so it runs in CI and under the sanitizers;
 * tools/fuzz.sh is the coverage-guided search that goes further. The counts below make sure the
 * sweep did what it claims: bit flips must have been both accepted (flips in tensor or pixel
 * bytes) and refused (flips in headers), and truncations refused; every one of them where the
 * format says how long a file is (fuzz_truncations_refused).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/fuzz/fuzz_target.h"

#define MAX_SEEDS 16

static char dir[64];
/* The seeds to accept, then those to refuse (from accepted_count on). */
static uint8_t *seeds[MAX_SEEDS];
static size_t seed_bytes[MAX_SEEDS];
static int seed_count, accepted_count;

/* Reads dir/<name>-<i> into the next seed and removes it; false when there is no such file. */
static bool take_seed(const char *name, int i) {
    char path[sizeof dir + 32];
    snprintf(path, sizeof path, "%s/%s-%d", dir, name, i);
    if (access(path, F_OK) != 0 || seed_count == MAX_SEEDS) return false;
    seeds[seed_count] = fuzz_read_file(path, &seed_bytes[seed_count]);
    seed_count++;
    return unlink(path) == 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_fuzz_seeds_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    accepted_count = fuzz_write_seeds(dir);
    if (accepted_count <= 0 || accepted_count > MAX_SEEDS) return -1;
    for (int i = 0; i < accepted_count; ++i)
        if (!take_seed("seed", i)) return -1;
    for (int i = 0; take_seed("refused", i); ++i) continue;
    return rmdir(dir);
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < seed_count; ++i) free(seeds[i]);
    return 0;
}

static void test_every_seed_is_accepted_and_every_refused_seed_refused(void **state) {
    (void)state;
    for (int i = 0; i < seed_count; ++i) {
        bool accepted = fuzz_one(seeds[i], seed_bytes[i]);
        if (i < accepted_count && !accepted) fail_msg("fuzz_%s: seed %d refused", fuzz_target_name, i);
        if (i >= accepted_count && accepted)
            fail_msg("fuzz_%s: refused seed %d accepted", fuzz_target_name, i - accepted_count);
    }
}

static void test_every_bit_flip_of_every_seed_keeps_the_rules(void **state) {
    (void)state;
    long accepted = 0, refused = 0;
    for (int i = 0; i < seed_count; ++i)
        for (size_t at = 0; at < seed_bytes[i]; ++at)
            for (int bit = 0; bit < 8; ++bit) {
                seeds[i][at] ^= (uint8_t)(1u << bit);
                if (fuzz_one(seeds[i], seed_bytes[i]))
                    ++accepted;
                else
                    ++refused;
                seeds[i][at] ^= (uint8_t)(1u << bit);
            }
    print_message("fuzz_%s: %ld bit flips accepted, %ld refused\n", fuzz_target_name, accepted, refused);
    assert_true(accepted > 0);
    assert_true(refused > 0);
}

static void test_every_truncation_of_every_seed_keeps_the_rules(void **state) {
    (void)state;
    long accepted = 0, refused = 0;
    for (int i = 0; i < seed_count; ++i)
        for (size_t bytes = 0; bytes < seed_bytes[i]; ++bytes) {
            if (!fuzz_one(seeds[i], bytes)) {
                ++refused;
                continue;
            }
            ++accepted;
            if (fuzz_truncations_refused)
                fail_msg("fuzz_%s: seed %d cut to %zu of %zu bytes was accepted", fuzz_target_name, i, bytes,
                         seed_bytes[i]);
        }
    print_message("fuzz_%s: %ld truncations accepted, %ld refused\n", fuzz_target_name, accepted, refused);
    assert_true(refused > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_seed_is_accepted_and_every_refused_seed_refused),
        cmocka_unit_test(test_every_bit_flip_of_every_seed_keeps_the_rules),
        cmocka_unit_test(test_every_truncation_of_every_seed_keeps_the_rules),
    };
    return cmocka_run_group_tests_name(fuzz_target_name, tests, setup, teardown);
}
