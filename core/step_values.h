/*
 * core/step_values.h — the small host values a training step hands its kernels (batch indices,
 * and under a CUDA graph also dropout seeds and the learning rate), queued without a wait.
 *
 * A blocking upload per step would stop the host from running ahead of the GPU, and cannot be
 * captured into a graph. Instead each step writes its values into one slot of a ring of pinned
 * host buffers (staging pool) and an asynchronous copy on the compute stream moves them into
 * one stable device block (inputs pool), at the same offset every step, so that kernels (and a
 * captured graph) always read the same address. An event per slot, recorded after the slot's
 * copies, guards its reuse: the host waits only when it is a whole ring ahead of the GPU.
 *
 * While a step is captured (core/step/step_graph.c) the values are only written to the slot, each
 * with a record of how a replay makes it again (a copy of the step's input, a fresh RNG draw,
 * the optimizer's learning rate); umt_step_values_flush then copies the slot in one go before
 * the graph is launched.
 */
#ifndef UMT_CORE_STEP_VALUES_H
#define UMT_CORE_STEP_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

#define UMT_STEP_VALUE_SLOTS 16

/* How a replay remakes one value at dst (bytes long); object is the record's. */
typedef void (*umt_step_value_redo)(void *object, void *dst, size_t bytes);

typedef struct {
    size_t offset, bytes;     /* where in the step's block */
    umt_step_value_redo redo; /* NULL: a copy of the step input's bytes at input_offset */
    umt_step_value_redo undo; /* host effects: takes the capture's own effect back (failed capture) */
    void *object;
    size_t input_offset;
} umt_step_value_record;

typedef struct {
    char *host;   /* UMT_STEP_VALUE_SLOTS slots of capacity bytes (pinned on CUDA) */
    char *device; /* capacity bytes; on the CPU the slot itself is what kernels read */
    size_t capacity;
    int slot;
    size_t used; /* bytes of this step's slot handed out */
    void *events[UMT_STEP_VALUE_SLOTS]; /* CUDA: the last copy out of each slot */
    bool recording; /* a capture: write the slot only, and record how to remake each value */
    const void *input;  /* recording: the step's input, the only host bytes a replay has again */
    size_t input_bytes;
    umt_step_value_record *records;
    int record_count, record_slots;
    const char *unreplayable; /* recording: why a replay could not remake this step, or NULL */
    size_t recorded_bytes;    /* the recorded step's bytes */
    /* recording: umt_zero_grad left out the fill of a gradient the last step's update consumed
     * (core/tape.c): a replay is then right only while such gradients are still zero */
    bool skipped_zero_fill;
} umt_step_values;

/* The bytes per slot the ring takes for a step of bytes values (the most it grows to); the
 * memory plan predicts the staging and inputs pools from it. */
size_t umt_step_values_capacity_for(size_t bytes);
/* At each step start: the next slot, once the GPU is done copying out of it. */
umt_status umt_step_values_begin(umt_context *ctx);
/* This step's copy of bytes from src; *device is where the step's kernels read it. While
 * recording, src must lie inside the step's input (else the capture is marked unreplayable). */
umt_status umt_step_values_input(umt_context *ctx, const void *src, size_t bytes, void **device);
/* While recording only: room for a value that redo remakes at each replay (it is made now too). */
umt_status umt_step_values_remade(umt_context *ctx, size_t bytes, umt_step_value_redo redo, void *object,
                                  void **device);
/* While recording only: host work a replay must redo (an optimizer's step count), no bytes;
 * undo takes the capturing step's own effect back if the capture fails. */
umt_status umt_step_values_host_effect(umt_context *ctx, umt_step_value_redo redo, umt_step_value_redo undo,
                                       void *object);
/* After a failed capture: every recorded host effect undone, last first. */
void umt_step_values_undo(umt_context *ctx);
/* While recording only (a no-op otherwise): a replay could not remake this step, for this reason. */
void umt_step_values_unreplayable(umt_context *ctx, const char *why);
/* Starts recording a step whose host data is input (input_bytes long), in a fresh slot. */
umt_status umt_step_values_record_begin(umt_context *ctx, const void *input, size_t input_bytes);
/* Ends the recording; the records stay for the replays. */
void umt_step_values_record_end(umt_context *ctx);
/* One replay of the recorded step with this step's input: the next slot, every value remade
 * (and every host effect redone) in record order, and one copy queued into the device block. */
umt_status umt_step_values_replay(umt_context *ctx, const void *input);
/* Copies the slot's bytes into the device block (queued), and marks the slot's reuse point. */
umt_status umt_step_values_flush(umt_context *ctx);
/* The device block's address (a graph's baked-in address: it must not move between replays). */
const void *umt_step_values_device_block(const umt_context *ctx);
void umt_step_values_release(umt_context *ctx);

#endif /* UMT_CORE_STEP_VALUES_H */
