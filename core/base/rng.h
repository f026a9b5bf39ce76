/*
 * core/base/rng.h — the seeded random number generator (xoshiro256**, seeded through splitmix64).
 *
 * Every random draw in umtrain (parameter init, shuffles, dropout masks) comes from a context's
 * umt_rng, so the same seed gives the same run, bit for bit, on the CPU.
 */
#ifndef UMT_CORE_BASE_RNG_H
#define UMT_CORE_BASE_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} umt_rng;

void umt_rng_seed(umt_rng *rng, uint64_t seed);
uint64_t umt_rng_next(umt_rng *rng);
/* Uniform in [0, 1) with 24 random bits (every value exactly representable as float). */
float umt_rng_uniform(umt_rng *rng);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t umt_rng_below(umt_rng *rng, uint64_t n);

#endif /* UMT_CORE_BASE_RNG_H */
