/* offload/host_share.c — the CPU's share of updates in backward, and its search (see host_share.h). */
#include "offload/host_share.h"

double umt_plan_host_share(double cpu_rate, double link_rate, int states) {
    if (cpu_rate <= 0 || link_rate <= 0) return 0;
    double share = 4 * (1 + states) * cpu_rate / (link_rate + 4 * states * cpu_rate);
    return share < 1 ? share : 1;
}

umt_host_count_search umt_plan_host_search_start(int first, int most) {
    if (first > most) first = most;
    if (first < 0) first = 0;
    return (umt_host_count_search){.count = first, .first = first, .most = most, .direction = most > 0, .best = -1};
}

/* After a slower step, or at the end of the range: turn down once if going up found nothing
 * faster than the first count, else keep the fastest. */
static void turn_or_settle(umt_host_count_search *s) {
    if (s->direction > 0 && s->best == s->first && s->first > 0) {
        s->direction = -1;
        s->count = s->first - 1;
        return;
    }
    s->direction = 0;
    s->count = s->best;
}

void umt_plan_host_search_step(umt_host_count_search *s, double step_ms) {
    if (!s->direction) return;
    if (s->best >= 0 && step_ms >= s->best_ms) {
        turn_or_settle(s);
        return;
    }
    s->best = s->count;
    s->best_ms = step_ms;
    int next = s->count + s->direction;
    if (next < 0 || next > s->most) turn_or_settle(s);
    else s->count = next;
}
