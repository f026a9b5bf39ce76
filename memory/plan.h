/*
 * memory/plan.h — planning the activation arena from the first training step.
 *
 * With static shapes, every training step asks the arena for the same sizes in the same
 * order. The first step that runs backward is recorded: each allocation's size, when it was
 * made and, for gradients of activations, when backward was done with it (after the op that
 * produced the activation has run its backward, nothing reads or writes that gradient again).
 * Everything else lives to the end of the step: forward outputs may be read by the caller
 * until the next umt_step_begin.
 *
 * From the record, each allocation gets an offset such that allocations alive at the same
 * time never overlap (largest first, lowest offset that fits). Later steps that ask for the
 * same sequence get the planned offsets, as do the same ops on fewer samples (a short last
 * batch, a micro-batch: core/micro_batch.h), whose sizes are no larger; a step that departs
 * from it (an evaluation step on a larger batch) takes its remaining allocations past the
 * planned region.
 */
#ifndef UMT_MEMORY_PLAN_H
#define UMT_MEMORY_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "umtrain.h"

#define UMT_PLAN_NO_SLOT (-1)

typedef struct {
    size_t bytes;
    size_t offset;
    void *ptr; /* while recording: where the arena put it (for umt_memory_end_of_life's recycling) */
    int birth; /* event count when allocated */
    int death; /* event count when backward was done with it; INT_MAX: end of step */
} umt_plan_slot;

typedef struct {
    umt_plan_slot *slots; /* the step being recorded, then the plan */
    int count;
    int capacity;
    bool planned;
    bool step_had_deaths; /* the recorded step ran backward */
    int next;             /* the next slot this step, while it follows the plan */
    bool following;
    int events;
    size_t planned_peak_bytes;
    size_t recorded_total_bytes; /* what the recorded step allocated, all sizes added up */
} umt_arena_plan;

/* At each step start: makes the plan once a recorded step has run backward. */
umt_status umt_plan_begin_step(umt_arena_plan *plan);
/* The planned offset of the next allocation if this step still follows the plan (returns
 * true; *slot its planned slot): the allocations and deaths so far came in the recorded order
 * and this one asks for no more than the recorded size. Otherwise false, and *slot is where
 * the recording keeps it (UMT_PLAN_NO_SLOT when nothing records it). */
bool umt_plan_next(umt_arena_plan *plan, size_t bytes, size_t *offset, int *slot);
/* Backward is done with the allocation in slot: recorded while recording; once planned, a death
 * the plan does not have at this point ends the step's following. */
void umt_plan_end_of_life(umt_arena_plan *plan, int slot);
void umt_plan_release(umt_arena_plan *plan);

#endif /* UMT_MEMORY_PLAN_H */
