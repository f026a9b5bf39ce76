/* offload/host_share.c — the CPU's share of updates in backward, and its search (see host_share.h);
 * and the least time the host's memory, shared by the CPU's updates and the link, leaves for a
 * step's work (umt_host_memory_least_seconds, umtrain.h). */
#include "offload/host_share.h"

#include "core/base/error.h"
#include "umtrain.h"

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

/* The time T(x) of umt_host_memory_least_seconds's comment, for x seconds of both at once. */
static double shared_seconds(const umt_host_memory_speed *s, double elements, double bytes, double x) {
    double cpu_left = elements - s->cpu_beside_link * x, link_left = bytes - s->link_beside_cpu_gbps * 1e9 * x;
    double cpu_alone_s = cpu_left > 0 ? cpu_left / s->cpu_alone : 0;
    double link_alone_s = link_left > 0 ? link_left / (s->link_alone_gbps * 1e9) : 0;
    return x + cpu_alone_s + link_alone_s;
}

umt_status umt_host_memory_least_seconds(const umt_host_memory_speed *speed, double elements, double bytes,
                                         double *seconds) {
    if (!speed || !seconds) return umt_fail_null("umt_host_memory_least_seconds", speed ? "seconds" : "speed");
    const struct {
        const char *name;
        double value;
    } rates[] = {{"cpu_alone", speed->cpu_alone},
                 {"cpu_beside_link", speed->cpu_beside_link},
                 {"link_alone_gbps", speed->link_alone_gbps},
                 {"link_beside_cpu_gbps", speed->link_beside_cpu_gbps}};
    for (int i = 0; i < 4; ++i)
        if (!(rates[i].value > 0))
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_host_memory_least_seconds: %s %g (expected > 0)",
                            rates[i].name, rates[i].value);
    if (!(elements >= 0) || !(bytes >= 0))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_host_memory_least_seconds: %s %g (expected >= 0)",
                        elements >= 0 ? "bytes" : "elements", elements >= 0 ? bytes : elements);
    double corners[3] = {0, elements / speed->cpu_beside_link, bytes / (speed->link_beside_cpu_gbps * 1e9)};
    *seconds = shared_seconds(speed, elements, bytes, 0);
    for (int i = 1; i < 3; ++i) {
        double t = shared_seconds(speed, elements, bytes, corners[i]);
        if (t < *seconds) *seconds = t;
    }
    return UMT_OK;
}
