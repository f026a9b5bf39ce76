/* memory/fit.c — whether a training step fits, in how many micro-batches, with how much of the
 * offload tier (memory/fit.h). */
#include "memory/fit.h"

#include <stdio.h>

#include "core/base/error.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static size_t state_total(const umt_fit_inputs *in) {
    return in->state_bytes[0] + in->state_bytes[1] + in->state_bytes[2];
}

/* The step's own device bytes: with saved activations offloaded, the arena's peak gives way to a
 * working set of the largest tensors (never more than the peak itself). */
static size_t step_bytes(umt_fit_arrangement arrangement, const umt_fit_measure *m) {
    if (arrangement != UMT_FIT_TIER_ACTIVATIONS) return m->step_bytes;
    size_t working = UMT_FIT_ACTIVATION_WORKING_SET * m->largest_bytes;
    size_t kept = working < m->activation_bytes ? working : m->activation_bytes;
    return m->step_bytes - m->activation_bytes + kept;
}

size_t umt_fit_device_bytes(const umt_fit_inputs *in, umt_fit_arrangement arrangement, const umt_fit_measure *m) {
    size_t state = arrangement == UMT_FIT_IN_MEMORY ? state_total(in) : in->tier_bytes;
    return in->held_bytes + state + step_bytes(arrangement, m);
}

bool umt_fit_ok(const umt_fit_inputs *in, umt_fit_arrangement arrangement, const umt_fit_measure *m) {
    bool budget =
        in->budget_bytes == 0 || umt_fit_device_bytes(in, arrangement, m) + in->margin_bytes <= in->budget_bytes;
    return budget && m->largest_elements <= in->element_limit && !m->refused;
}

/* What stands in the way at a measure: the budget, the element limit, or a library's refusal. */
static void obstacle(const umt_fit_inputs *in, umt_fit_arrangement arrangement, const umt_fit_measure *m, char *out,
                     size_t size) {
    if (m->refused || m->largest_elements > in->element_limit)
        snprintf(out, size, "a tensor of %lld elements (limit %lld)", (long long)m->largest_elements,
                 (long long)in->element_limit);
    else if (in->budget_bytes)
        snprintf(out, size, "%zu device bytes at its peak (budget %zu)", umt_fit_device_bytes(in, arrangement, m),
                 in->budget_bytes);
    else
        snprintf(out, size, "no device budget binds (host memory), its largest tensor %lld elements",
                 (long long)m->largest_elements);
}

/* The choice at micro-batch b in an arrangement, from its measure m: k, the bytes it takes where. */
static void take(const umt_fit_inputs *in, umt_fit_arrangement arrangement, int64_t b, const umt_fit_measure *m,
                 umt_fit_choice *out) {
    out->arrangement = arrangement;
    out->micro_batch = b;
    out->k = ceil_div(in->batch, b);
    out->at = *m;
    out->fits = umt_fit_ok(in, arrangement, m);
    out->device_bytes = umt_fit_device_bytes(in, arrangement, m);
    out->reserve_bytes = step_bytes(arrangement, m) + in->margin_bytes;
    out->host_bytes = arrangement == UMT_FIT_IN_MEMORY ? 0
                      : state_total(in) + (arrangement == UMT_FIT_TIER_ACTIVATIONS ? m->activation_total_bytes : 0);
}

static umt_status settle(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user,
                         umt_fit_arrangement arrangement, int64_t b, umt_fit_choice *out) {
    umt_fit_measure m;
    UMT_TRY(measure(user, b, &m));
    take(in, arrangement, b, &m, out);
    return UMT_OK;
}

/* The smallest k in (low, high] whose micro-batch fits the arrangement, given that high's does and
 * low's does not; then the fewest micro-batches of that size (B = 10, k = 4 gives 3 of 4: k = 3
 * does the same). */
static umt_status bisect(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user,
                         umt_fit_arrangement arrangement, int64_t low, int64_t high, umt_fit_choice *out) {
    while (high - low > 1) {
        int64_t mid = low + (high - low) / 2;
        umt_fit_measure m;
        UMT_TRY(measure(user, ceil_div(in->batch, mid), &m));
        if (umt_fit_ok(in, arrangement, &m)) high = mid;
        else low = mid;
    }
    return settle(in, measure, user, arrangement, ceil_div(in->batch, high), out);
}

/* The last arrangement the inputs allow: the tier needs a budget to plan against, and CUDA. */
static umt_fit_arrangement last_arrangement(const umt_fit_inputs *in) {
    return in->tier && in->budget_bytes ? UMT_FIT_TIER_ACTIVATIONS : UMT_FIT_IN_MEMORY;
}

static const char *const arrangement_text[] = {
    "", " with the offload tier (optimizer state, then weights and gradients)",
    " with the offload tier and saved activations in host memory"};

static const umt_plan_verdict arrangement_verdict[] = {UMT_PLAN_MICRO_BATCHES, UMT_PLAN_OFFLOAD_STATE,
                                                       UMT_PLAN_OFFLOAD_ACTIVATIONS};

static umt_status decide_forced(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out) {
    int64_t b = ceil_div(in->batch, in->forced_k);
    umt_fit_measure m;
    UMT_TRY(measure(user, b, &m));
    bool fits = false;
    for (int a = UMT_FIT_IN_MEMORY; a <= (int)last_arrangement(in) && !fits; ++a) {
        take(in, (umt_fit_arrangement)a, b, &m, out);
        fits = out->fits;
    }
    /* Nowhere: the split as asked, in memory (the caller may train anyway and see). */
    if (!fits) take(in, UMT_FIT_IN_MEMORY, b, &m, out);
    out->verdict = UMT_PLAN_FORCED;
    char why[160];
    obstacle(in, out->arrangement, &out->at, why, sizeof why);
    snprintf(out->why, sizeof out->why, "%lld micro-batches asked for: %s%s, %s", (long long)out->k,
             out->fits ? "it fits" : "it does not fit", arrangement_text[out->arrangement], why);
    return UMT_OK;
}

/* Nothing fits: one sample with everything the tier can take off (or, without a tier, in memory). */
static void say_nothing_fits(const umt_fit_inputs *in, umt_fit_choice *out) {
    out->verdict = UMT_PLAN_OFFLOAD_ACTIVATIONS;
    out->fits = false;
    const umt_fit_measure *m = &out->at;
    if (m->refused || m->largest_elements > in->element_limit) {
        snprintf(out->why, sizeof out->why, "even one sample per micro-batch does not fit: a tensor of %lld elements "
                 "(limit %lld)", (long long)m->largest_elements, (long long)in->element_limit);
        return;
    }
    bool tier = out->arrangement != UMT_FIT_IN_MEMORY;
    size_t state = tier ? in->tier_bytes : state_total(in);
    int n = snprintf(out->why, sizeof out->why,
                     "even one sample per micro-batch does not fit: %zu device bytes (held %zu + %s %zu + the step "
                     "%zu%s) and %zu kept free > budget %zu", out->device_bytes, in->held_bytes,
                     tier ? "the offload tier's least" : "the state", state, out->device_bytes - in->held_bytes - state,
                     tier ? " with its saved activations in host memory" : "", in->margin_bytes, in->budget_bytes);
    if (n > 0 && (size_t)n < sizeof out->why)
        snprintf(out->why + n, sizeof out->why - (size_t)n, "; the state: weights %zu + grads %zu + optim %zu%s",
                 in->state_bytes[0], in->state_bytes[1], in->state_bytes[2], tier ? "" : " (no offload tier: CUDA only)");
}

/* With the tier: host memory must hold the state, which the tier makes there, and the activations. */
static void check_host(const umt_fit_inputs *in, umt_fit_choice *out) {
    bool held = out->arrangement == UMT_FIT_IN_MEMORY || !in->host_available_bytes;
    if (held || out->host_bytes <= in->host_available_bytes) return;
    out->fits = false;
    snprintf(out->why, sizeof out->why,
             "host memory cannot hold what the offload tier keeps there: weights %zu + grads %zu + optim %zu + saved "
             "activations %zu = %zu bytes > %zu available", in->state_bytes[0], in->state_bytes[1], in->state_bytes[2],
             out->host_bytes - state_total(in), out->host_bytes, in->host_available_bytes);
}

/* The first arrangement, in order, where the whole batch or else one sample fits, and the fewest
 * micro-batches there; found false when none does (out then holds one sample in the last). */
static umt_status first_fitting(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user,
                                const umt_fit_measure *whole, bool *found, umt_fit_choice *out) {
    umt_fit_measure one = *whole;
    bool measured_one = in->batch == 1;
    for (int a = UMT_FIT_IN_MEMORY; a <= (int)last_arrangement(in); ++a) {
        umt_fit_arrangement arrangement = (umt_fit_arrangement)a;
        take(in, arrangement, in->batch, whole, out);
        if ((*found = out->fits)) return UMT_OK;
        if (!measured_one) UMT_TRY(measure(user, 1, &one));
        measured_one = true;
        take(in, arrangement, 1, &one, out);
        if (!(*found = out->fits)) continue;
        return in->batch == 1 ? UMT_OK : bisect(in, measure, user, arrangement, 1, in->batch, out);
    }
    return UMT_OK;
}

umt_status umt_fit_choose(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out) {
    *out = (umt_fit_choice){.k = 1, .micro_batch = in->batch};
    if (in->forced_k) {
        UMT_TRY(decide_forced(in, measure, user, out));
        check_host(in, out);
        return UMT_OK;
    }
    umt_fit_measure whole;
    UMT_TRY(measure(user, in->batch, &whole));
    char why_whole[160];
    obstacle(in, UMT_FIT_IN_MEMORY, &whole, why_whole, sizeof why_whole);
    bool found;
    UMT_TRY(first_fitting(in, measure, user, &whole, &found, out));
    if (!found) {
        say_nothing_fits(in, out);
        return UMT_OK;
    }
    if (out->arrangement == UMT_FIT_IN_MEMORY && out->k == 1) {
        out->verdict = UMT_PLAN_FITS;
        snprintf(out->why, sizeof out->why, "the whole batch fits: %s", why_whole);
        return UMT_OK;
    }
    out->verdict = arrangement_verdict[out->arrangement];
    char now[160];
    obstacle(in, out->arrangement, &out->at, now, sizeof now);
    bool one = out->k == 1;
    snprintf(out->why, sizeof out->why, "the whole batch does not fit (%s); %lld micro-batch%s of %lld do%s%s (%s)",
             why_whole, (long long)out->k, one ? "" : "es", (long long)out->micro_batch, one ? "es" : "",
             arrangement_text[out->arrangement], now);
    check_host(in, out);
    return UMT_OK;
}
