/* memory/plan.c — recording one training step's activations and planning their offsets. */
#include "memory/plan.h"

#include <limits.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "memory/pool.h"

static bool overlap_in_time(const umt_plan_slot *a, const umt_plan_slot *b) {
    return a->birth < b->death && b->birth < a->death;
}

/* Largest first: big tensors placed early leave the gaps that the small ones fill. */
static int larger_first(const void *x, const void *y) {
    const umt_plan_slot *a = *(umt_plan_slot *const *)x, *b = *(umt_plan_slot *const *)y;
    return (a->bytes < b->bytes) - (a->bytes > b->bytes);
}

/* The lowest offset where slot fits beside every already placed slot alive at the same time. */
static size_t lowest_free_offset(umt_plan_slot *slot, umt_plan_slot **placed, int placed_count) {
    size_t offset = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int i = 0; i < placed_count; ++i) {
            umt_plan_slot *p = placed[i];
            bool overlap_in_space = offset < p->offset + p->bytes && p->offset < offset + slot->bytes;
            if (overlap_in_time(slot, p) && overlap_in_space) {
                offset = p->offset + p->bytes;
                moved = true;
            }
        }
    }
    return offset;
}

static umt_status make_plan(umt_arena_plan *plan) {
    umt_plan_slot **order = malloc((size_t)plan->count * sizeof *order);
    if (!order) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "activation plan: no memory for %d slots", plan->count);
    for (int i = 0; i < plan->count; ++i) order[i] = &plan->slots[i];
    qsort(order, (size_t)plan->count, sizeof *order, larger_first);
    plan->planned_peak_bytes = 0;
    for (int i = 0; i < plan->count; ++i) {
        order[i]->offset = lowest_free_offset(order[i], order, i);
        size_t end = order[i]->offset + order[i]->bytes;
        if (end > plan->planned_peak_bytes) plan->planned_peak_bytes = end;
    }
    free(order);
    plan->planned = true;
    return UMT_OK;
}

umt_status umt_plan_begin_step(umt_arena_plan *plan) {
    if (!plan->planned && plan->step_had_deaths && plan->count > 0) UMT_TRY(make_plan(plan));
    if (!plan->planned) {
        /* Not planned yet: record this step afresh. */
        plan->count = 0;
        plan->recorded_total_bytes = 0;
        plan->step_had_deaths = false;
    }
    plan->next = 0;
    plan->following = plan->planned;
    plan->events = 0;
    return UMT_OK;
}

bool umt_plan_next(umt_arena_plan *plan, size_t bytes, size_t *offset, int *slot) {
    *slot = UMT_PLAN_NO_SLOT;
    if (plan->planned) {
        /* The same ops with fewer samples (a short last batch, a micro-batch) ask for no more
         * bytes at the same point among the allocations and deaths: the slot holds them. */
        const umt_plan_slot *s = plan->following && plan->next < plan->count ? &plan->slots[plan->next] : NULL;
        if (s && bytes <= s->bytes && s->birth == plan->events) {
            *offset = s->offset;
            *slot = plan->next++;
            plan->events++;
            return true;
        }
        plan->following = false;
        return false;
    }
    if (plan->count == plan->capacity) {
        int capacity = plan->capacity ? 2 * plan->capacity : 64;
        umt_plan_slot *grown = realloc(plan->slots, (size_t)capacity * sizeof *grown);
        /* Without room to record, this step is simply not recorded in full: the arena still works. */
        if (!grown) return false;
        plan->slots = grown;
        plan->capacity = capacity;
    }
    *slot = plan->count;
    plan->slots[plan->count++] = (umt_plan_slot){.bytes = bytes, .birth = plan->events++, .death = INT_MAX};
    plan->recorded_total_bytes += bytes;
    return false;
}

void umt_plan_end_of_life(umt_arena_plan *plan, int slot) {
    if (slot < 0 || slot >= plan->count) return;
    if (plan->planned) {
        /* A death the plan did not have at this point: the step's lifetimes are no longer the
         * plan's, so its later allocations go past the planned region. */
        if (plan->following && plan->slots[slot].death == plan->events) plan->events++;
        else plan->following = false;
        return;
    }
    plan->slots[slot].death = plan->events++;
    plan->step_had_deaths = true;
}

void umt_plan_release(umt_arena_plan *plan) {
    free(plan->slots);
    *plan = (umt_arena_plan){0};
}
