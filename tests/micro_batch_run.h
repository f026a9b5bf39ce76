/*
 * tests/micro_batch_run.h — a small CNN trained a few steps with its batch whole or as
 * micro-batches (core/micro_batch.h), on the CPU or a GPU: what the micro-batching tests of both
 * compare.
 */
#ifndef UMT_TESTS_MICRO_BATCH_RUN_H
#define UMT_TESTS_MICRO_BATCH_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "umtrain.h"

#define MB_STEPS 5
#define MB_SAMPLES 48

typedef struct {
    umt_device device;
    umt_precision precision;
    int micro_batches; /* 1: the batch whole, no umt_micro_batch_begin */
    float dropout;     /* p of both dropouts (0: none) */
    bool graph;        /* steps through a captured step graph (CUDA) */
    bool batch_norm;   /* a batch norm after the convolution */
    umt_optimizer_kind optimizer;
    uint64_t seed;               /* the context's seed (0: 7) */
    float lr;                    /* the optimizer's rate (0: 0.05 for SGD, 0.002 otherwise) */
    const umt_dataset *shared;   /* the data as a share of this dataset (umt_dataset_share), or NULL: loaded */
} mb_run;

typedef struct {
    double losses[MB_STEPS];
    float *params; /* every parameter after the steps, one after another (free it) */
    int64_t count;
    int64_t grad_ready_calls; /* the gradient hook's calls over the run (without a step graph) */
    int64_t replayed_steps;   /* steps the step graph replayed */
    size_t dataset_bytes;     /* the run's context's dataset pool, in use at the end */
} mb_result;

/* Writes the run's data (a fixed random IDX pair) into the scratch folder (tests/scratch.h; once
 * per program, after scratch_make). */
void mb_write_data(void);
/* Trains run's model MB_STEPS steps on MB_SAMPLES samples per step; asserts every call (several
 * runs may train at once on their own threads, each with its own context: a failed assertion
 * there ends the test program, which fails it too). */
void mb_train(const mb_run *run, const char *folder, mb_result *out);
/* mb_train of runs[0..count) at once, each on a host thread of its own (its own context, and on
 * CUDA its own stream), started together; out[i] is run i's. */
void mb_train_at_once(const mb_run *runs, int count, const char *folder, mb_result *out);
/* The same runs' steps together from this thread, as the members of one step group
 * (umt_step_group: one CUDA graph for all where it can capture); out[i] is run i's, and
 * *group_stats the group's counts. */
void mb_train_grouped(const mb_run *runs, int count, const char *folder, mb_result *out,
                      umt_step_graph_stats *group_stats);
/* Asserts that b's losses and parameters are a's, bit for bit; what names the comparison. */
void mb_expect_same_bits(const mb_result *a, const mb_result *b, const char *what);
/* Asserts that b's losses and parameters equal a's within rel, relative to each tensor's
 * largest magnitude (losses: to themselves); what names the comparison in a failure. */
void mb_expect_close(const mb_result *a, const mb_result *b, double rel, const char *what);
/* Whether some parameter or loss differs by more than rel (the same measure). */
bool mb_differ(const mb_result *a, const mb_result *b, double rel);

#endif /* UMT_TESTS_MICRO_BATCH_RUN_H */
