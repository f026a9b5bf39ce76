/* memory/offload_plan.c — the placement planner (see offload_plan.h for the order and why). */
#include "memory/offload_plan.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "memory/pool.h"

static size_t align_up(size_t bytes) { return (bytes + UMT_POOL_ALIGN - 1) / UMT_POOL_ALIGN * UMT_POOL_ALIGN; }

static bool is_parameter_pool(umt_pool pool) { return pool == UMT_POOL_WEIGHTS || pool == UMT_POOL_GRADS; }

/* The bytes a streaming buffer holds of the items of one group and pool class (parameter pools, or
 * activations). */
static size_t group_bytes(const umt_plan_item *items, int count, int group, bool activations) {
    size_t sum = 0;
    for (int i = 0; i < count; ++i)
        if (items[i].group == group && (activations ? items[i].pool == UMT_POOL_ACTIVATIONS : is_parameter_pool(items[i].pool)))
            sum += align_up(items[i].stream_bytes ? items[i].stream_bytes : items[i].bytes);
    return sum;
}

/* The update ring's chunk per array and bytes: one chunk of the weights and of each state array
 * of the parameter with the most state (Adam: two), per entry, counting every parameter that
 * streams its weights or has state offloaded (a resident parameter's state comes through the
 * ring too; its weights array goes unused). */
static size_t ring_chunk_bytes(size_t weight_slot) {
    size_t sixteenth = weight_slot / 16 / UMT_POOL_ALIGN * UMT_POOL_ALIGN;
    return sixteenth < UMT_OFFLOAD_RING_CHUNK_BYTES ? sixteenth : UMT_OFFLOAD_RING_CHUNK_BYTES;
}

static int ring_arrays(const umt_plan_item *items, int count) {
    int arrays = 0;
    for (int i = 0; i < count; ++i) {
        if (!items[i].offloaded || items[i].pool == UMT_POOL_ACTIVATIONS) continue;
        int states = 0;
        for (int j = 0; j < count; ++j) states += items[j].pool == UMT_POOL_OPTIM && items[j].group == items[i].group;
        if (1 + states > arrays) arrays = 1 + states;
    }
    return arrays;
}

void umt_plan_deepen_ring(umt_placement_plan *plan) {
    if (!plan->ring_bytes || plan->ring_entries != UMT_OFFLOAD_RING_ENTRIES || plan->device_bytes >= plan->budget_bytes)
        return;
    size_t entry = (size_t)plan->ring_arrays * plan->ring_chunk_bytes;
    size_t extra = (plan->budget_bytes - plan->device_bytes) / entry;
    if (extra > UMT_OFFLOAD_RING_MAX_ENTRIES - UMT_OFFLOAD_RING_ENTRIES)
        extra = UMT_OFFLOAD_RING_MAX_ENTRIES - UMT_OFFLOAD_RING_ENTRIES;
    plan->ring_entries += (int)extra;
    plan->ring_bytes += extra * entry;
    plan->device_bytes += extra * entry;
}

size_t umt_plan_device_bytes(const umt_plan_item *items, int count, size_t fixed_bytes, bool update_in_backward,
                             umt_placement_plan *buffers) {
    size_t resident = 0, weight_slot = 0, activation_slot = 0;
    bool any_streamed = false;
    for (int i = 0; i < count; ++i) {
        const umt_plan_item *it = &items[i];
        if (!it->offloaded) {
            resident += align_up(it->bytes);
            continue;
        }
        if (it->pool == UMT_POOL_ACTIVATIONS) {
            size_t g = group_bytes(items, count, it->group, true);
            if (g > activation_slot) activation_slot = g;
            continue;
        }
        any_streamed = true;
        if (is_parameter_pool(it->pool)) {
            size_t g = group_bytes(items, count, it->group, false);
            if (g > weight_slot) weight_slot = g;
        }
    }
    /* Offloaded optimizer state streams through the weight slots in chunks: they must exist. */
    if (any_streamed && weight_slot < UMT_OFFLOAD_MIN_SLOT_BYTES) weight_slot = UMT_OFFLOAD_MIN_SLOT_BYTES;
    buffers->weight_slot_bytes = weight_slot;
    buffers->activation_slot_bytes = activation_slot;
    buffers->ring_chunk_bytes = update_in_backward ? ring_chunk_bytes(weight_slot) : 0;
    buffers->ring_arrays = update_in_backward ? ring_arrays(items, count) : 0;
    buffers->ring_bytes = (size_t)buffers->ring_arrays * UMT_OFFLOAD_RING_ENTRIES * buffers->ring_chunk_bytes;
    return fixed_bytes + resident + 2 * weight_slot + 2 * activation_slot + buffers->ring_bytes;
}

/* ----------------------------------------------------------------------------------------- */
/* The three stages */

typedef struct {
    int key;      /* an item index (stage 1) or a group number (stages 2 and 3) */
    int rank;     /* among equal sizes, the lower rank moves first (see offload_plan.h) */
    size_t bytes;
} candidate;

static int larger_first(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    if (x->rank != y->rank) return x->rank - y->rank;
    return x->key - y->key; /* the same rank too: the earlier item first, so plans are reproducible */
}

/* Equal sizes: a parameter's state, weights and gradients move latest parameter first (updated
 * first in backward, needed last in forward: their copies hide under the rest of the step), a
 * layer's saved activations earliest layer first (out first, back last). */
static int rank_of(int group, bool activations) { return activations ? group : -group; }

/* What the stages share: the budget, the fixed bytes, whether the ring is needed, a parameter
 * that stays on the GPU whole (held; NO_GROUP: none), and where the least device bytes seen go
 * (NULL: nowhere). */
typedef struct {
    size_t budget, fixed;
    bool update_in_backward;
    int held;
    size_t *least;
} limits;

#define NO_GROUP INT_MIN

static bool fits(const umt_plan_item *items, int count, const limits *l) {
    umt_placement_plan buffers;
    size_t bytes = umt_plan_device_bytes(items, count, l->fixed, l->update_in_backward, &buffers);
    if (l->least && bytes < *l->least) *l->least = bytes;
    return bytes <= l->budget;
}

/* Stage 1: optimizer state items, largest first. */
static bool offload_optimizer_state(umt_plan_item *items, int count, const limits *l, candidate *c) {
    int n = 0;
    for (int i = 0; i < count; ++i)
        if (items[i].pool == UMT_POOL_OPTIM && items[i].group != l->held)
            c[n++] = (candidate){i, rank_of(items[i].group, false), items[i].bytes};
    qsort(c, (size_t)n, sizeof *c, larger_first);
    for (int k = 0; k < n; ++k) {
        items[c[k].key].offloaded = true;
        if (fits(items, count, l)) return true;
    }
    return false;
}

/* Stages 2 and 3: whole groups (a parameter's weights and gradients, or a layer's saved
 * activations), largest group first. */
static bool offload_groups(umt_plan_item *items, int count, const limits *l, bool activations, candidate *c) {
    int n = 0;
    for (int i = 0; i < count; ++i) {
        bool member = activations ? items[i].pool == UMT_POOL_ACTIVATIONS : is_parameter_pool(items[i].pool);
        if (!member || (!activations && items[i].group == l->held)) continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; ++k) seen = c[k].key == items[i].group;
        if (!seen)
            c[n++] = (candidate){items[i].group, rank_of(items[i].group, activations),
                                 group_bytes(items, count, items[i].group, activations)};
    }
    qsort(c, (size_t)n, sizeof *c, larger_first);
    for (int k = 0; k < n; ++k) {
        if (!activations && c[k].bytes < UMT_OFFLOAD_MIN_STREAM_BYTES) break; /* sorted: the rest are smaller */
        for (int i = 0; i < count; ++i) {
            bool member = activations ? items[i].pool == UMT_POOL_ACTIVATIONS : is_parameter_pool(items[i].pool);
            if (member && items[i].group == c[k].key) items[i].offloaded = true;
        }
        if (fits(items, count, l)) return true;
    }
    return false;
}

/* Stages 1, 2 and 3, each only as far as needed; the last stage needed (0: none, 4: not even all). */
static int run_stages(umt_plan_item *items, int count, const limits *l, candidate *c) {
    for (int i = 0; i < count; ++i) items[i].offloaded = false;
    if (fits(items, count, l)) return 0;
    if (offload_optimizer_state(items, count, l, c)) return 1;
    if (offload_groups(items, count, l, false, c)) return 2;
    return offload_groups(items, count, l, true, c) ? 3 : 4;
}

/* The first parameter (lowest group) that has optimizer state: the last updated in backward. */
static int first_with_state(const umt_plan_item *items, int count) {
    int first = NO_GROUP;
    for (int i = 0; i < count; ++i)
        if (items[i].pool == UMT_POOL_OPTIM && items[i].group >= 0 && (first == NO_GROUP || items[i].group < first))
            first = items[i].group;
    return first;
}

static void fill_plan(const umt_plan_item *items, int count, const limits *l, int stage, umt_placement_plan *plan) {
    *plan = (umt_placement_plan){.budget_bytes = l->budget, .fixed_bytes = l->fixed, .stage = stage};
    plan->device_bytes = umt_plan_device_bytes(items, count, l->fixed, l->update_in_backward, plan);
    plan->ring_entries = plan->ring_bytes ? UMT_OFFLOAD_RING_ENTRIES : 0;
    for (int i = 0; i < count; ++i)
        if (items[i].offloaded) plan->offloaded_bytes += align_up(items[i].bytes);
}

umt_status umt_plan_placement(umt_plan_item *items, int count, size_t budget_bytes, size_t fixed_bytes,
                              bool update_in_backward, umt_placement_plan *plan) {
    if (count < 0 || (count > 0 && !items) || !plan)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_plan_placement: %d items at %p", count, (const void *)items);
    for (int i = 0; i < count; ++i) {
        umt_pool p = items[i].pool;
        if (p != UMT_POOL_WEIGHTS && p != UMT_POOL_GRADS && p != UMT_POOL_OPTIM && p != UMT_POOL_ACTIVATIONS)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_plan_placement: item %d (%s) is in pool %s (expected weights, "
                            "grads, optim or activations)", i, items[i].name ? items[i].name : "?", umt_pool_name(p));
    }
    candidate *c = malloc(((size_t)count + 1) * sizeof *c);
    if (!c) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_plan_placement: no memory for %d items", count);
    limits l = {budget_bytes, fixed_bytes, update_in_backward, NO_GROUP, NULL};
    int stage = run_stages(items, count, &l, c);
    /* Weights stream anyway, and updates run in backward: see offload_plan.h for why the first
     * parameter then stays whole if streaming others makes room for it. */
    l.held = update_in_backward && stage == 2 ? first_with_state(items, count) : NO_GROUP;
    if (l.held != NO_GROUP && run_stages(items, count, &l, c) != 2) {
        l.held = NO_GROUP;
        stage = run_stages(items, count, &l, c);
    }
    free(c);
    fill_plan(items, count, &l, stage > 3 ? 3 : stage, plan);
    if (stage <= 3) return UMT_OK;
    return umt_fail(UMT_ERR_BUDGET,
                    "placement plan: even with every weight, gradient, optimizer state and saved activation offloaded "
                    "the GPU needs %zu bytes (fixed %zu, two weight buffers of %zu, two activation buffers of %zu, an "
                    "update ring of %zu) against a device budget of %zu bytes", plan->device_bytes, fixed_bytes,
                    plan->weight_slot_bytes, plan->activation_slot_bytes, plan->ring_bytes, budget_bytes);
}

size_t umt_plan_least_device_bytes(umt_plan_item *items, int count, bool update_in_backward) {
    size_t least = SIZE_MAX;
    candidate *c = malloc(((size_t)count + 1) * sizeof *c);
    if (!c) return least; /* no memory to plan: as if nothing fitted */
    /* A budget of 0 fits nothing (but an empty model): every stage runs to its end. */
    limits l = {0, 0, update_in_backward, NO_GROUP, &least};
    run_stages(items, count, &l, c);
    free(c);
    return least;
}

/* ----------------------------------------------------------------------------------------- */
/* Printing */

static double gib(size_t bytes) { return (double)bytes / (double)((size_t)1 << 30); }

void umt_plan_print(FILE *out, const umt_plan_item *items, int count, const umt_placement_plan *plan) {
    static const umt_pool pools[] = {UMT_POOL_WEIGHTS, UMT_POOL_GRADS, UMT_POOL_OPTIM, UMT_POOL_ACTIVATIONS};
    fprintf(out, "placement plan (stage %d of 3): %-11s %6s %12s %8s %12s\n", plan->stage, "pool", "on GPU", "GiB",
            "offload", "GiB");
    for (int k = 0; k < 4; ++k) {
        int on = 0, off = 0;
        size_t on_bytes = 0, off_bytes = 0;
        for (int i = 0; i < count; ++i) {
            if (items[i].pool != pools[k]) continue;
            if (items[i].offloaded) off++, off_bytes += align_up(items[i].bytes);
            else on++, on_bytes += align_up(items[i].bytes);
        }
        if (!on && !off) continue; /* a pool the model has nothing in */
        fprintf(out, "placement plan:              %-11s %6d %12.3f %8d %12.3f\n", umt_pool_name(pools[k]), on,
                gib(on_bytes), off, gib(off_bytes));
    }
    fprintf(out, "placement plan: streaming buffers 2 x %.3f GiB (weights+grads, optimizer chunks), 2 x %.3f GiB "
            "(activations), %.3f GiB (update ring of %d entries); fixed %.3f GiB; on GPU %.3f of %.3f GiB budget; "
            "offloaded %.3f GiB\n", gib(plan->weight_slot_bytes), gib(plan->activation_slot_bytes),
            gib(plan->ring_bytes), plan->ring_entries, gib(plan->fixed_bytes), gib(plan->device_bytes),
            gib(plan->budget_bytes), gib(plan->offloaded_bytes));
}
