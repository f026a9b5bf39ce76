/* memory/pool.c — per-pool bookkeeping: blocks, arenas, statistics. */
#include "memory/pool.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "memory/placement.h"
#include "memory/trace.h"

/* The smallest arena block: small steps should not allocate many tiny blocks. */
#define UMT_ARENA_MIN_BYTES ((size_t)1 << 20)

static size_t round_up(size_t bytes) { return (bytes + UMT_POOL_ALIGN - 1) / UMT_POOL_ALIGN * UMT_POOL_ALIGN; }

void umt_memory_init(umt_memory *mem, umt_device device, umt_memory_mode mode, int cuda_device) {
    memset(mem, 0, sizeof *mem);
    mem->device = device;
    mem->cuda_device = cuda_device;
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        umt_pool_state *s = &mem->pools[p];
        s->pool = (umt_pool)p;
        s->policy = umt_pool_policy_of((umt_pool)p);
        s->placement = umt_pool_placement((umt_pool)p, device, mode);
        s->advised = umt_pool_advised((umt_pool)p, device, mode);
    }
}

bool umt_placement_uses_device(umt_placement placement) {
    return placement == UMT_PLACE_MANAGED || placement == UMT_PLACE_DEVICE;
}

/* The GPU's ledger (memory/ledger.h) gives back bytes this context freed; a dry step's bytes were
 * never in it. */
static void release_shared(umt_memory *mem, umt_placement placement, size_t bytes) {
    if (mem->ledger && !mem->dry && umt_placement_uses_device(placement)) umt_ledger_release(mem->ledger, bytes);
}

static void release_blocks(umt_memory *mem, umt_pool_state *s) {
    /* In a dry step an arena's blocks are addresses only (memory/dry.h). */
    for (int i = 0; i < s->block_count && !mem->dry; ++i) umt_placement_free(s->placement, s->blocks[i].ptr);
    if (umt_placement_uses_device(s->placement)) mem->device_bytes -= s->capacity_bytes;
    release_shared(mem, s->placement, s->capacity_bytes);
    s->block_count = 0;
    s->capacity_bytes = 0;
}

void umt_memory_release(umt_memory *mem) {
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        release_blocks(mem, &mem->pools[p]);
        umt_plan_release(&mem->pools[p].plan);
        free(mem->pools[p].dead);
        mem->pools[p].dead = NULL;
        mem->pools[p].dead_count = mem->pools[p].dead_slots = 0;
        free(mem->pools[p].blocks);
        mem->pools[p].blocks = NULL;
        mem->pools[p].block_slots = 0;
    }
    umt_ledger_close(mem->ledger);
    mem->ledger = NULL;
}

/* The trace's counter track: every pool's bytes in use, after each change. */
static void trace_pools(const umt_memory *mem) {
    if (!mem->trace) return;
    size_t in_use[UMT_POOL_COUNT];
    for (int p = 0; p < UMT_POOL_COUNT; ++p) in_use[p] = mem->pools[p].in_use_bytes;
    umt_trace_counters(mem->trace, in_use);
}

static int more_held_first(const void *a, const void *b) {
    const umt_pool_state *x = *(const umt_pool_state *const *)a, *y = *(const umt_pool_state *const *)b;
    return x->capacity_bytes < y->capacity_bytes ? 1 : x->capacity_bytes > y->capacity_bytes ? -1 : 0;
}

void umt_memory_print_contents(const umt_memory *mem, FILE *out) {
    const umt_pool_state *order[UMT_POOL_COUNT];
    for (int p = 0; p < UMT_POOL_COUNT; ++p) order[p] = &mem->pools[p];
    qsort(order, UMT_POOL_COUNT, sizeof *order, more_held_first);
    fprintf(out, "pools, largest first (device budget %zu bytes, %zu held on the device):\n", mem->budget_bytes,
            mem->device_bytes);
    for (int k = 0; k < UMT_POOL_COUNT && order[k]->capacity_bytes; ++k) {
        const umt_pool_state *s = order[k];
        fprintf(out, "  %-12s %-8s %14zu bytes held, %14zu in use, %d block(s); largest:", s->policy->name,
                umt_placement_name(s->placement), s->capacity_bytes, s->in_use_bytes, s->block_count);
        /* The three largest blocks, by selection: pools hold few blocks. */
        size_t shown = SIZE_MAX;
        for (int r = 0; r < 3; ++r) {
            size_t best = 0;
            for (int i = 0; i < s->block_count; ++i)
                if (s->blocks[i].bytes < shown && s->blocks[i].bytes > best) best = s->blocks[i].bytes;
            if (!best) break;
            fprintf(out, " %zu", best);
            shown = best;
        }
        fputc('\n', out);
    }
}

/* Device bytes the budget has left (0 once a dry step has passed it). */
static size_t budget_left(const umt_memory *mem) {
    return mem->budget_bytes > mem->device_bytes ? mem->budget_bytes - mem->device_bytes : 0;
}

/* What the GPU's ledger leaves this context now, where there is one (SIZE_MAX otherwise). */
static size_t shared_left(const umt_memory *mem) {
    umt_ledger_view v;
    if (!mem->ledger || mem->dry || umt_ledger_look(mem->ledger, &v) != UMT_OK) return SIZE_MAX;
    size_t held = v.others_bytes + v.own_bytes;
    if (held < v.others_bytes) return 0; /* the others' count is hostile: nothing is left */
    return v.capacity_bytes > held ? v.capacity_bytes - held : 0;
}

/* The other umtrain holders of the GPU, for a refusal: "; beside this context on the GPU (ledger
 * PATH): pid 12: 300 bytes", or nothing where there is no ledger or no other holder. */
static void note_others(const umt_memory *mem, char *text, size_t size) {
    umt_ledger_view view;
    text[0] = 0;
    if (!mem->ledger || umt_ledger_look(mem->ledger, &view) != UMT_OK || !view.other_count) return;
    char others[448];
    umt_ledger_describe_others(&view, others, sizeof others);
    snprintf(text, size, "; beside this context on the GPU (ledger %s): %s", umt_ledger_path(mem->ledger), others);
}

/* This context's entry in the GPU's ledger grows by bytes where the other holders and the GPU's
 * free memory allow it (memory/ledger.h, rules (b) and (c)). */
static umt_status reserve_shared(umt_memory *mem, const umt_pool_state *s, size_t bytes) {
    if (!mem->ledger) return UMT_OK;
    size_t free_bytes = SIZE_MAX;
    if (mem->measure_free) UMT_TRY(mem->measure_free(mem->cuda_device, &free_bytes));
    if (umt_ledger_reserve(mem->ledger, bytes, free_bytes, mem->guard_bytes) == UMT_OK) return UMT_OK;
    umt_memory_print_contents(mem, stderr);
    return umt_fail(umt_last_status(), "pool %s: %s", s->policy->name, umt_last_error());
}

/* The hard rule: GPU memory past the budget, or past what the other processes on the GPU leave,
 * is never asked for (it can hang a shared card). */
static umt_status check_budget(umt_memory *mem, const umt_pool_state *s, size_t bytes) {
    /* A dry step asks nothing of the GPU: its device peak (memory/dry.h) shows how far past it went. */
    if (!umt_placement_uses_device(s->placement) || mem->dry) return UMT_OK;
    if (bytes <= budget_left(mem)) return reserve_shared(mem, s, bytes);
    umt_memory_print_contents(mem, stderr);
    char others[640];
    note_others(mem, others, sizeof others);
    return umt_fail(UMT_ERR_BUDGET,
                    "pool %s: request of %zu bytes refused: device budget %zu bytes, %zu in use, %zu left "
                    "(UMT_DEVICE_BUDGET lowers the budget, never raises it past the GPU's free memory)%s",
                    s->policy->name, bytes, mem->budget_bytes, mem->device_bytes, budget_left(mem), others);
}

/* Device bytes held grow by bytes (a dry step also keeps their high-water mark). */
static void hold_device(umt_memory *mem, const umt_pool_state *s, size_t bytes) {
    if (!umt_placement_uses_device(s->placement)) return;
    mem->device_bytes += bytes;
    if (mem->dry && mem->device_bytes > mem->dry->device_peak_bytes) mem->dry->device_peak_bytes = mem->device_bytes;
}

/* A block from the pool's placement, advised; in a dry step an address no byte lies behind. */
static umt_status place_block(umt_memory *mem, umt_pool_state *s, size_t bytes, void **out) {
    *out = NULL;
    if (mem->dry) {
        *out = umt_memory_dry_address(mem->dry, bytes);
        return UMT_OK;
    }
    void *ptr = NULL;
    umt_status st = umt_placement_alloc(s->placement, bytes, UMT_POOL_ALIGN, &ptr);
    if (st == UMT_OK && s->advised)
        st = umt_placement_advise(ptr, bytes, s->policy->advice, s->policy->prefetch, mem->cuda_device, mem->stream);
    if (st != UMT_OK) {
        umt_placement_free(s->placement, ptr);
        return umt_fail(st, "pool %s (%s): request of %zu bytes refused (%zu bytes in use): %s", s->policy->name,
                        umt_placement_name(s->placement), bytes, s->in_use_bytes, umt_last_error());
    }
    umt_trace_alloc(mem->trace, s->pool, bytes, false);
    *out = ptr;
    return UMT_OK;
}

/* Allocates a block from the pool's placement, advises it, and appends it to the pool's list. */
static umt_status push_block(umt_memory *mem, umt_pool_state *s, size_t bytes) {
    if (s->block_count == s->block_slots) {
        int slots = s->block_slots ? 2 * s->block_slots : 16;
        umt_block *grown = realloc(s->blocks, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "pool %s: no room to track another block", s->policy->name);
        s->blocks = grown;
        s->block_slots = slots;
    }
    UMT_TRY(check_budget(mem, s, bytes));
    void *ptr = NULL;
    umt_status st = place_block(mem, s, bytes, &ptr);
    if (st != UMT_OK) {
        release_shared(mem, s->placement, bytes); /* reserved by check_budget, never allocated */
        return st;
    }
    s->blocks[s->block_count++] = (umt_block){ptr, bytes};
    s->capacity_bytes += bytes;
    hold_device(mem, s, bytes);
    return UMT_OK;
}

/* A RUN-pool block in a dry step: counted as a real one, kept off the pool's list, so that the
 * pool's real blocks are untouched when the dry step ends. */
static umt_status dry_run_block(umt_memory *mem, umt_pool_state *s, size_t bytes, void **out) {
    UMT_TRY(check_budget(mem, s, bytes));
    UMT_TRY(place_block(mem, s, bytes, out));
    UMT_TRY(umt_memory_dry_keep(mem->dry, s->pool, *out, bytes));
    s->capacity_bytes += bytes;
    hold_device(mem, s, bytes);
    return UMT_OK;
}

/* An arena's bytes in use are its high-water mark this step: with a plan, freed activations
 * are reused, so the mark can stay far below the sum of the sizes handed out. */
static void count(umt_pool_state *s, size_t bytes, size_t high_water) {
    s->in_use_bytes = s->policy->lifetime == UMT_LIFETIME_STEP ? (high_water > s->in_use_bytes ? high_water : s->in_use_bytes)
                                                               : s->in_use_bytes + bytes;
    if (s->in_use_bytes > s->peak_bytes) s->peak_bytes = s->in_use_bytes;
    s->allocations++;
}

/* Recycling while recording: the first dead range large enough, its front part. */
static bool take_dead(umt_pool_state *s, size_t bytes, void **out) {
    for (int i = 0; i < s->dead_count; ++i) {
        umt_block *d = &s->dead[i];
        if (d->bytes < bytes) continue;
        *out = d->ptr;
        d->ptr = (char *)d->ptr + bytes;
        d->bytes -= bytes;
        if (!d->bytes) *d = s->dead[--s->dead_count];
        return true;
    }
    return false;
}

static umt_status arena_alloc(umt_memory *mem, umt_pool_state *s, size_t bytes, void **out, int *slot) {
    size_t offset = 0;
    if (umt_plan_next(&s->plan, bytes, &offset, slot)) {
        /* umt_memory_reset sized blocks[0] to hold the whole plan. */
        *out = (char *)s->blocks[0].ptr + offset;
        count(s, bytes, offset + bytes);
        trace_pools(mem);
        return UMT_OK;
    }
    if (*slot != UMT_PLAN_NO_SLOT && take_dead(s, bytes, out)) {
        s->plan.slots[*slot].ptr = *out;
        count(s, bytes, s->in_use_bytes);
        trace_pools(mem);
        return UMT_OK;
    }
    umt_block *top = s->block_count ? &s->blocks[s->block_count - 1] : NULL;
    if (!top || s->arena_offset + bytes > top->bytes) {
        /* Overflow: a new block at least as large as all before it, so overflows stay rare, but
         * never more than the request where that would pass the device budget (the first step
         * of a model tight in its budget needs every byte), or past what the other processes on
         * the GPU leave (memory/ledger.h). */
        size_t want = bytes > s->capacity_bytes ? bytes : s->capacity_bytes;
        bool device = umt_placement_uses_device(s->placement);
        if (device && want > bytes && (want > budget_left(mem) || want > shared_left(mem))) want = bytes;
        UMT_TRY(push_block(mem, s, want > UMT_ARENA_MIN_BYTES ? want : UMT_ARENA_MIN_BYTES));
        top = &s->blocks[s->block_count - 1];
        s->arena_offset = 0;
    }
    *out = (char *)top->ptr + s->arena_offset;
    if (*slot != UMT_PLAN_NO_SLOT) s->plan.slots[*slot].ptr = *out;
    s->arena_offset += bytes;
    count(s, bytes, s->capacity_bytes - top->bytes + s->arena_offset);
    trace_pools(mem);
    return UMT_OK;
}

umt_status umt_memory_alloc(umt_memory *mem, umt_pool pool, size_t bytes, void **out) {
    int slot;
    return umt_memory_alloc_slot(mem, pool, bytes, out, &slot);
}

umt_status umt_memory_alloc_slot(umt_memory *mem, umt_pool pool, size_t bytes, void **out, int *slot) {
    *out = NULL;
    *slot = UMT_PLAN_NO_SLOT;
    if ((unsigned)pool >= UMT_POOL_COUNT) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "unknown pool %d", (int)pool);
    umt_pool_state *s = &mem->pools[pool];
    if (bytes == 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "pool %s: request of 0 bytes", s->policy->name);
    bytes = round_up(bytes);
    if (s->policy->lifetime == UMT_LIFETIME_STEP) return arena_alloc(mem, s, bytes, out, slot);
    if (mem->dry) {
        UMT_TRY(dry_run_block(mem, s, bytes, out));
    } else {
        UMT_TRY(push_block(mem, s, bytes));
        *out = s->blocks[s->block_count - 1].ptr;
    }
    count(s, bytes, 0);
    trace_pools(mem);
    return UMT_OK;
}

void umt_memory_end_of_life(umt_memory *mem, umt_pool pool, int slot) {
    if ((unsigned)pool >= UMT_POOL_COUNT) return;
    umt_pool_state *s = &mem->pools[pool];
    bool recorded = !s->plan.planned && slot >= 0 && slot < s->plan.count;
    umt_plan_end_of_life(&s->plan, slot);
    if (!s->recycle || !recorded) return;
    if (s->dead_count == s->dead_slots) {
        int slots = s->dead_slots ? 2 * s->dead_slots : 64;
        umt_block *grown = realloc(s->dead, (size_t)slots * sizeof *grown);
        if (!grown) return; /* not recycled: the arena grows instead, nothing is lost */
        s->dead = grown;
        s->dead_slots = slots;
    }
    s->dead[s->dead_count++] = (umt_block){s->plan.slots[slot].ptr, s->plan.slots[slot].bytes};
}

void umt_memory_set_recycle(umt_memory *mem, umt_pool pool, bool on) {
    if ((unsigned)pool < UMT_POOL_COUNT) mem->pools[pool].recycle = on;
}

void umt_memory_rerecord(umt_memory *mem, umt_pool pool) {
    umt_pool_state *s = &mem->pools[pool];
    if (s->policy->lifetime != UMT_LIFETIME_STEP) return;
    umt_plan_release(&s->plan);
    umt_plan_begin_step(&s->plan); /* nothing planned: cannot fail */
    s->arena_offset = 0;
    s->dead_count = 0;
}

/* A free in a dry step: its bytes leave the counts, but a real block stays where it is (the
 * dry step ends by putting every pool back). */
static void dry_free(umt_memory *mem, umt_pool_state *s, void *ptr) {
    size_t bytes = umt_memory_dry_forget(mem->dry, ptr);
    for (int i = 0; i < s->block_count && !bytes; ++i)
        if (s->blocks[i].ptr == ptr) bytes = s->blocks[i].bytes;
    s->in_use_bytes -= bytes;
    s->capacity_bytes -= bytes;
    if (umt_placement_uses_device(s->placement)) mem->device_bytes -= bytes;
}

void umt_memory_free(umt_memory *mem, umt_pool pool, void *ptr) {
    if (!ptr || (unsigned)pool >= UMT_POOL_COUNT) return;
    umt_pool_state *s = &mem->pools[pool];
    if (s->policy->lifetime == UMT_LIFETIME_STEP) return;
    if (mem->dry) {
        dry_free(mem, s, ptr);
        return;
    }
    for (int i = 0; i < s->block_count; ++i) {
        if (s->blocks[i].ptr != ptr) continue;
        umt_placement_free(s->placement, ptr);
        s->in_use_bytes -= s->blocks[i].bytes;
        s->capacity_bytes -= s->blocks[i].bytes;
        if (umt_placement_uses_device(s->placement)) mem->device_bytes -= s->blocks[i].bytes;
        release_shared(mem, s->placement, s->blocks[i].bytes);
        umt_trace_alloc(mem->trace, s->pool, s->blocks[i].bytes, true);
        s->blocks[i] = s->blocks[--s->block_count];
        trace_pools(mem);
        return;
    }
}

umt_status umt_memory_reset(umt_memory *mem, umt_pool pool) {
    umt_pool_state *s = &mem->pools[pool];
    if (s->policy->lifetime != UMT_LIFETIME_STEP) return UMT_OK;
    bool was_planned = s->plan.planned;
    UMT_TRY(umt_plan_begin_step(&s->plan));
    size_t needed = s->capacity_bytes;
    /* A new plan needs only its peak: the recorded step's block was the sum of all sizes. */
    if (s->plan.planned && !was_planned) needed = s->plan.planned_peak_bytes;
    if (s->block_count > 1 || needed != s->capacity_bytes) {
        /* The step overflowed, or the plan shrinks the arena: one block of the size needed. */
        release_blocks(mem, s);
        if (needed) UMT_TRY(push_block(mem, s, needed));
    }
    /* Allocations that depart from the plan go after the planned region. */
    s->arena_offset = s->plan.planned ? s->plan.planned_peak_bytes : 0;
    s->dead_count = 0;
    s->in_use_bytes = 0;
    trace_pools(mem);
    return UMT_OK;
}

void umt_memory_stats(const umt_memory *mem, umt_pool pool, umt_pool_stats *out) {
    const umt_pool_state *s = &mem->pools[pool];
    *out = (umt_pool_stats){s->in_use_bytes, s->peak_bytes, s->capacity_bytes, s->allocations,
                            s->plan.planned_peak_bytes, s->plan.planned ? s->plan.recorded_total_bytes : 0};
}
