/* memory/fit.c — whether a training step fits, and in how many micro-batches (memory/fit.h). */
#include "memory/fit.h"

#include <stdio.h>

#include "core/base/error.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool umt_fit_ok(const umt_fit_inputs *in, const umt_fit_measure *m) {
    bool budget = in->budget_bytes == 0 || m->device_peak_bytes + in->margin_bytes <= in->budget_bytes;
    return budget && m->largest_elements <= in->element_limit && !m->refused;
}

/* What stands in the way at a measure: the budget, the element limit, or a library's refusal. */
static void obstacle(const umt_fit_inputs *in, const umt_fit_measure *m, char *out, size_t size) {
    if (m->refused || m->largest_elements > in->element_limit)
        snprintf(out, size, "a tensor of %lld elements (limit %lld)", (long long)m->largest_elements,
                 (long long)in->element_limit);
    else if (in->budget_bytes)
        snprintf(out, size, "%zu device bytes at its peak (budget %zu)", m->device_peak_bytes, in->budget_bytes);
    else
        snprintf(out, size, "no device budget binds (host memory), its largest tensor %lld elements",
                 (long long)m->largest_elements);
}

static umt_status decide_forced(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out) {
    out->k = in->forced_k;
    out->micro_batch = ceil_div(in->batch, in->forced_k);
    UMT_TRY(measure(user, out->micro_batch, &out->at));
    out->verdict = UMT_PLAN_FORCED;
    out->fits = umt_fit_ok(in, &out->at);
    char why[160];
    obstacle(in, &out->at, why, sizeof why);
    snprintf(out->why, sizeof out->why, "%lld micro-batches asked for: %s, %s", (long long)out->k,
             out->fits ? "it fits" : "it does not fit", why);
    return UMT_OK;
}

/* The smallest k in (low, high] whose micro-batch fits, given that high's does and low's does not. */
static umt_status bisect(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, int64_t low, int64_t high,
                         umt_fit_choice *out) {
    while (high - low > 1) {
        int64_t mid = low + (high - low) / 2;
        umt_fit_measure m;
        UMT_TRY(measure(user, ceil_div(in->batch, mid), &m));
        if (umt_fit_ok(in, &m)) high = mid;
        else low = mid;
    }
    /* The fewest micro-batches of that size (B = 10, k = 4 gives 3 of 4: k = 3 does the same). */
    out->micro_batch = ceil_div(in->batch, high);
    out->k = ceil_div(in->batch, out->micro_batch);
    return measure(user, out->micro_batch, &out->at);
}

umt_status umt_fit_choose(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out) {
    *out = (umt_fit_choice){.k = 1, .micro_batch = in->batch};
    size_t state = in->state_bytes[0] + in->state_bytes[1] + in->state_bytes[2];
    if (in->budget_bytes && state > in->budget_bytes) {
        out->verdict = UMT_PLAN_OFFLOAD_STATE;
        snprintf(out->why, sizeof out->why,
                 "the state alone passes the device budget: weights %zu + grads %zu + optim %zu = %zu bytes > %zu; "
                 "the offload tier is needed (umt_offload_enable, before the model exists)",
                 in->state_bytes[0], in->state_bytes[1], in->state_bytes[2], state, in->budget_bytes);
        return UMT_OK;
    }
    if (in->forced_k) return decide_forced(in, measure, user, out);
    UMT_TRY(measure(user, in->batch, &out->at));
    char why[160];
    obstacle(in, &out->at, why, sizeof why);
    if (umt_fit_ok(in, &out->at)) {
        out->fits = true;
        snprintf(out->why, sizeof out->why, "the whole batch fits: %s", why);
        return UMT_OK;
    }
    umt_fit_choice one = {.k = in->batch, .micro_batch = 1};
    UMT_TRY(measure(user, 1, &one.at));
    if (!umt_fit_ok(in, &one.at) || in->batch == 1) {
        char single[160];
        obstacle(in, &one.at, single, sizeof single);
        *out = one;
        out->verdict = UMT_PLAN_OFFLOAD_ACTIVATIONS;
        snprintf(out->why, sizeof out->why,
                 "even one sample per micro-batch does not fit (%s); the offload tier's saved activations are "
                 "needed (umt_offload_options.activations, enabled before the model exists)", single);
        return UMT_OK;
    }
    UMT_TRY(bisect(in, measure, user, 1, in->batch, out));
    out->verdict = UMT_PLAN_MICRO_BATCHES;
    out->fits = umt_fit_ok(in, &out->at);
    char now[160];
    obstacle(in, &out->at, now, sizeof now);
    snprintf(out->why, sizeof out->why, "the whole batch does not fit (%s); %lld micro-batches of %lld do (%s)", why,
             (long long)out->k, (long long)out->micro_batch, now);
    return UMT_OK;
}
