/*
 * offload/host_share.h — how many of the streamed parameters CPU threads update during backward
 * (offload/host.c): a first guess from the measured rates, then a search on whole steps. Pure C,
 * no CUDA: tests/test_offload_plan.c checks both on the CPU.
 */
#ifndef UMT_OFFLOAD_HOST_SHARE_H
#define UMT_OFFLOAD_HOST_SHARE_H

/* Updates in backward on the CPU (offload/host.c): the share of the streamed elements that CPU
 * threads should update so that their time equals the link's. Per element a step sends home,
 * through the update ring, its weight and its `states` optimizer values (4 (1 + states) bytes);
 * updated on the CPU, its gradient (4 bytes), at cpu_rate elements a second against link_rate
 * bytes a second each way: s / R = 4 ((1 + m) (1 - s) + s) / B gives 4 (1 + m) R / (B + 4 m R),
 * at most 1. */
double umt_plan_host_share(double cpu_rate, double link_rate, int states);

/* UMT_OFFLOAD_HOST_AUTO: the share above is a first guess (the rates alone leave out when the CPU
 * can start, after forward, and what else the link carries), so the count of parameters that the
 * CPU threads take is then searched on whole steps: from the guess's count up, one more at a time
 * while the step gets faster; if the first step up is slower, down instead; the fastest count
 * timed is kept (the search found faster counts than the share's at both sizes docs/PERF.md
 * records, "Offload tier"). */
typedef struct {
    int count;      /* the count to time next; once settled, the count kept */
    int first;      /* the share's count, where the search starts */
    int most;       /* the most the CPU can take: every streamed parameter */
    int direction;  /* +1 or -1: where the search goes; 0: settled */
    int best;       /* the fastest count timed (-1: none yet), and its step */
    double best_ms;
} umt_host_count_search;

umt_host_count_search umt_plan_host_search_start(int first, int most);
/* The step time (ms) at s->count: s->count moves to the next count to time, or the search settles
 * on the fastest (s->direction 0). */
void umt_plan_host_search_step(umt_host_count_search *s, double step_ms);

#endif /* UMT_OFFLOAD_HOST_SHARE_H */
