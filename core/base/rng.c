/* core/base/rng.c — xoshiro256** (Blackman and Vigna), seeded with splitmix64. */
#include "core/base/rng.h"

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void umt_rng_seed(umt_rng *rng, uint64_t seed) {
    /* splitmix64 spreads any seed (even 0) over the whole 256-bit state. */
    for (int i = 0; i < 4; ++i) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t umt_rng_next(umt_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float umt_rng_uniform(umt_rng *rng) { return (float)(umt_rng_next(rng) >> 40) * (1.0f / 16777216.0f); }

uint64_t umt_rng_below(umt_rng *rng, uint64_t n) {
    /* Reject the top sliver of the 64-bit range that would make some residues more likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = umt_rng_next(rng);
    while (x >= limit);
    return x % n;
}
