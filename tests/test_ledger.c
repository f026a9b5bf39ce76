/*
 * tests/test_ledger.c — the GPU's ledger (memory/ledger.h) on the CPU: one budget per GPU across
 * processes. Holders are forked children, each with its own handle, reserving at once: the sum
 * never passes the capacity, and each child's grants are what the ledger holds for it. A killed
 * holder's bytes are free for the next; a full card is refused naming the holders, the request
 * and the capacity, and allocates nothing; rule (c), the free memory measured now, shrinks what
 * is left; the pools reserve every device block in the ledger first and give back what they free
 * or fail to allocate. Hostile ledger files (truncated, garbage, huge counts, a symbolic link, a
 * FIFO) are rebuilt or refused, never a crash or a hang (tag bad-input: run under ASan + UBSan).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "memory/budget.h"
#include "memory/dry.h"
#include "memory/ledger.h"
#include "memory/pool.h"
#include "tests/forked.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* Sizes in units of 1000 bytes: the capacity of the ledgers below is FREE - HEADROOM. */
#define UNIT ((size_t)1000)
#define FREE (110 * UNIT)
#define HEADROOM (10 * UNIT)
#define CAPACITY (100 * UNIT)
#define LAYOUT_BYTES (64 + 32 * UMT_LEDGER_SLOTS)

static int setup(void **state) {
    (void)state;
    return scratch_make("ledger");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

static umt_ledger *join(const char *key, size_t free_bytes, umt_ledger_view *view) {
    umt_ledger *l = NULL;
    umt_ledger_view ignored;
    umt_status st = umt_ledger_open(scratch_folder(), key, free_bytes, HEADROOM, &l, view ? view : &ignored);
    if (st != UMT_OK) fail_msg("umt_ledger_open(%s): %s", key, umt_last_error());
    return l;
}

static umt_ledger_view look(umt_ledger *l) {
    umt_ledger_view v;
    assert_int_equal(umt_ledger_look(l, &v), UMT_OK);
    return v;
}

static const char *ledger_file(const char *key) {
    static char path[512];
    snprintf(path, sizeof path, "%s/umtrain-ledger-%s", scratch_folder(), key);
    return path;
}

/* ----------------------------------------------------------------------------------------- */
/* Holders: forked children (tests/forked.h), each with a handle of its own */

typedef struct {
    int status; /* of the child's last ledger call */
    int grants;
    size_t own_bytes;
    char message[1024];
} report;

typedef struct {
    const char *key;
    size_t request_bytes; /* asked for tries times */
    int tries;
    int start_fd; /* -1, or read to its end before the first request: the start line of a race */
} holding;

/* In the child: joins, waits at the start line, reserves, reports. */
static void hold(const void *arg, void *out) {
    const holding *h = arg;
    report *r = out;
    umt_ledger *l = NULL;
    umt_ledger_view v;
    r->status = umt_ledger_open(scratch_folder(), h->key, FREE, HEADROOM, &l, &v);
    char byte;
    if (h->start_fd >= 0)
        while (read(h->start_fd, &byte, 1) > 0) continue;
    for (int i = 0; r->status == UMT_OK && i < h->tries; ++i) {
        umt_status st = umt_ledger_reserve(l, h->request_bytes, SIZE_MAX, 0);
        if (st == UMT_OK) r->grants++;
        else snprintf(r->message, sizeof r->message, "%s", umt_last_error());
    }
    if (r->status != UMT_OK) snprintf(r->message, sizeof r->message, "%s", umt_last_error());
    if (l && umt_ledger_look(l, &v) == UMT_OK) r->own_bytes = v.own_bytes;
}

static forked_child spawn(const holding *h) { return forked_spawn(hold, h, sizeof(report), h->start_fd); }

static report report_of(forked_child *c) {
    report r;
    forked_report(c, &r, sizeof r);
    return r;
}

static forked_child spawn_holding(const char *key, size_t bytes, report *r) {
    holding h = {key, bytes, 1, -1};
    forked_child c = spawn(&h);
    *r = report_of(&c);
    if (r->status != UMT_OK || r->grants != 1) fail_msg("child %d: %s", (int)c.pid, r->message);
    return c;
}

static bool mentions_holder(const char *message, pid_t pid, size_t bytes) {
    char text[96];
    snprintf(text, sizeof text, "pid %d: %zu bytes", (int)pid, bytes);
    return strstr(message, text) != NULL;
}

/* ----------------------------------------------------------------------------------------- */
/* The rule */

static void test_the_first_holder_records_the_capacity_and_later_ones_keep_it(void **state) {
    (void)state;
    umt_ledger_view v;
    umt_ledger *first = join("capacity", FREE, &v);
    assert_int_equal(v.capacity_bytes, CAPACITY);
    assert_int_equal(v.other_count, 0);
    assert_int_equal(umt_ledger_reserve(first, 30 * UNIT, SIZE_MAX, 0), UMT_OK);
    /* A second holder measures less free memory (the first's pages): the capacity stays. */
    umt_ledger *second = join("capacity", 50 * UNIT, &v);
    assert_int_equal(v.capacity_bytes, CAPACITY);
    assert_int_equal(v.other_count, 1);
    assert_int_equal(v.others_bytes, 30 * UNIT);
    assert_int_equal(v.others[0].pid, getpid());
    assert_int_equal(umt_budget_shared(40 * UNIT, v.capacity_bytes, v.others_bytes), 40 * UNIT);
    assert_int_equal(umt_budget_shared(90 * UNIT, v.capacity_bytes, v.others_bytes), 70 * UNIT);
    umt_ledger_close(first);
    umt_ledger_close(second);
    /* Nobody left: the next holder records the capacity from its own measure. */
    umt_ledger *third = join("capacity", 60 * UNIT, &v);
    assert_int_equal(v.capacity_bytes, 50 * UNIT);
    umt_ledger_close(third);
}

static void test_released_bytes_lower_the_entry_others_see(void **state) {
    (void)state;
    umt_ledger *a = join("release", FREE, NULL), *b = join("release", FREE, NULL);
    assert_int_equal(umt_ledger_reserve(a, 70 * UNIT, SIZE_MAX, 0), UMT_OK);
    assert_int_equal(umt_ledger_reserve(b, 40 * UNIT, SIZE_MAX, 0), UMT_ERR_BUDGET);
    umt_ledger_release(a, 20 * UNIT);
    assert_int_equal(look(b).others_bytes, 50 * UNIT);
    assert_int_equal(umt_ledger_reserve(b, 40 * UNIT, SIZE_MAX, 0), UMT_OK);
    umt_ledger_release(a, 1000 * UNIT); /* more than it holds: to zero, no wrap */
    assert_int_equal(look(a).own_bytes, 0);
    assert_int_equal(look(b).others_bytes, 0);
    umt_ledger_close(a);
    umt_ledger_close(b);
}

static void test_the_free_memory_measured_now_bounds_each_request(void **state) {
    (void)state;
    umt_ledger *l = join("free-now", FREE, NULL);
    /* 35 units free now, 10 kept free: another program took memory since the capacity was measured. */
    assert_int_equal(umt_ledger_reserve(l, 30 * UNIT, 35 * UNIT, 10 * UNIT), UMT_ERR_BUDGET);
    assert_non_null(strstr(umt_last_error(), "35000 bytes free now"));
    assert_non_null(strstr(umt_last_error(), "10000 are kept free"));
    assert_non_null(strstr(umt_last_error(), "request of 30000 bytes"));
    assert_int_equal(look(l).own_bytes, 0);
    assert_int_equal(umt_ledger_reserve(l, 25 * UNIT, 35 * UNIT, 10 * UNIT), UMT_OK);
    assert_int_equal(umt_ledger_reserve(l, 1, 5 * UNIT, 10 * UNIT), UMT_ERR_BUDGET); /* free below the guard */
    assert_int_equal(look(l).own_bytes, 25 * UNIT);
    umt_ledger_close(l);
    assert_int_equal(umt_budget_guard((size_t)80 << 30), umt_budget_headroom((size_t)80 << 30) / 4);
    assert_int_equal(umt_budget_shared(5, 10, 20), 0); /* others past the capacity: nothing left */
}

/* ----------------------------------------------------------------------------------------- */
/* Processes */

static void test_concurrent_reservations_from_eight_processes_never_pass_the_capacity(void **state) {
    (void)state;
    /* Small requests, many of them: the children's turns interleave. */
    enum { CHILDREN = 8, TRIES = 300, PIECE = 100 };
    int start[2];
    assert_int_equal(pipe(start), 0);
    holding h = {"race", PIECE, TRIES, start[0]};
    forked_child c[CHILDREN];
    for (int i = 0; i < CHILDREN; ++i) c[i] = spawn(&h);
    close(start[0]);
    close(start[1]); /* the start: every child reads the end of the pipe at once */
    report r[CHILDREN];
    int grants = 0, refused = 0;
    for (int i = 0; i < CHILDREN; ++i) {
        r[i] = report_of(&c[i]);
        assert_int_equal(r[i].status, UMT_OK);
        assert_int_equal(r[i].own_bytes, (size_t)r[i].grants * PIECE);
        /* 2400 tries for 1000 pieces: a child that did not get all it asked met a full card, and said so. */
        if (r[i].grants < TRIES) assert_non_null(strstr(r[i].message, "capacity on this GPU is 100000 bytes"));
        refused += r[i].grants < TRIES;
        grants += r[i].grants;
    }
    assert_true(refused > 0);
    print_message("grants of 8 children racing for 1000 pieces:");
    for (int i = 0; i < CHILDREN; ++i) print_message(" %d", r[i].grants);
    print_message("\n");
    /* A refusal comes only when the card is full, and entries only grew: exactly the capacity. */
    assert_int_equal(grants, CAPACITY / PIECE);
    umt_ledger_view v;
    umt_ledger *parent = join("race", FREE, &v);
    assert_int_equal(v.other_count, CHILDREN);
    assert_int_equal(v.others_bytes, CAPACITY);
    for (int i = 0; i < CHILDREN; ++i) {
        int found = 0;
        for (int k = 0; k < CHILDREN; ++k)
            found += v.others[k].pid == c[i].pid && v.others[k].bytes == (size_t)r[i].grants * PIECE;
        assert_int_equal(found, 1);
    }
    assert_int_equal(umt_ledger_reserve(parent, 1, SIZE_MAX, 0), UMT_ERR_BUDGET);
    for (int i = 0; i < CHILDREN; ++i) forked_finish(&c[i], false);
    assert_int_equal(look(parent).other_count, 0);
    umt_ledger_close(parent);
}

static void test_a_killed_holders_bytes_are_free_for_the_next(void **state) {
    (void)state;
    report r;
    forked_child c = spawn_holding("killed", 80 * UNIT, &r);
    umt_ledger_view v;
    umt_ledger *l = join("killed", 30 * UNIT, &v);
    assert_int_equal(v.others_bytes, 80 * UNIT);
    assert_int_equal(umt_ledger_reserve(l, 50 * UNIT, SIZE_MAX, 0), UMT_ERR_BUDGET);
    assert_true(mentions_holder(umt_last_error(), c.pid, 80 * UNIT));
    forked_finish(&c, true); /* SIGKILL: no chance to leave the ledger */
    assert_int_equal(umt_ledger_reserve(l, 50 * UNIT, SIZE_MAX, 0), UMT_OK);
    v = look(l);
    assert_int_equal(v.other_count, 0);
    assert_int_equal(v.capacity_bytes, CAPACITY);
    umt_ledger_close(l);
    /* A killed sole holder: the next one records the capacity afresh. */
    c = spawn_holding("killed-alone", 10 * UNIT, &r);
    forked_finish(&c, true);
    l = join("killed-alone", 40 * UNIT, &v);
    assert_int_equal(v.capacity_bytes, 30 * UNIT);
    assert_int_equal(v.other_count, 0);
    umt_ledger_close(l);
}

static void test_a_full_card_refuses_naming_the_holders_the_request_and_the_capacity(void **state) {
    (void)state;
    report r1, r2;
    forked_child c1 = spawn_holding("full", 40 * UNIT, &r1), c2 = spawn_holding("full", 50 * UNIT, &r2);
    umt_ledger *l = join("full", FREE, NULL);
    assert_int_equal(umt_ledger_reserve(l, 20 * UNIT, SIZE_MAX, 0), UMT_ERR_BUDGET);
    const char *why = umt_last_error();
    print_message("refusal: %s\n", why);
    assert_true(mentions_holder(why, c1.pid, 40 * UNIT));
    assert_true(mentions_holder(why, c2.pid, 50 * UNIT));
    assert_non_null(strstr(why, "request of 20000 bytes"));
    assert_non_null(strstr(why, "capacity on this GPU is 100000 bytes"));
    assert_non_null(strstr(why, ledger_file("full")));
    assert_non_null(strstr(why, "10000 left"));
    /* Nothing was taken: the entry is as it was, and what is left still fits. */
    umt_ledger_view v = look(l);
    assert_int_equal(v.own_bytes, 0);
    assert_int_equal(v.others_bytes, 90 * UNIT);
    assert_int_equal(umt_ledger_reserve(l, 10 * UNIT, SIZE_MAX, 0), UMT_OK);
    /* The report's line lists them too. */
    char line[1024] = "";
    FILE *f = tmpfile();
    assert_non_null(f);
    umt_ledger_print(l, f);
    rewind(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_true(mentions_holder(line, c1.pid, 40 * UNIT));
    assert_non_null(strstr(line, "capacity 100000 bytes, this context 10000"));
    forked_finish(&c1, false);
    forked_finish(&c2, false);
    umt_ledger_close(l);
}

static void test_every_slot_held_refuses_one_more_holder(void **state) {
    (void)state;
    umt_ledger *held[UMT_LEDGER_SLOTS];
    for (int i = 0; i < UMT_LEDGER_SLOTS; ++i) held[i] = join("slots", FREE, NULL);
    umt_ledger *one_more = NULL;
    umt_ledger_view v;
    assert_int_equal(umt_ledger_open(scratch_folder(), "slots", FREE, HEADROOM, &one_more, &v), UMT_ERR_BUDGET);
    assert_null(one_more);
    assert_non_null(strstr(umt_last_error(), "all 256 slots"));
    umt_ledger_close(held[7]);
    one_more = join("slots", FREE, NULL);
    umt_ledger_close(one_more);
    for (int i = 0; i < UMT_LEDGER_SLOTS; ++i)
        if (i != 7) umt_ledger_close(held[i]);
}

/* ----------------------------------------------------------------------------------------- */
/* The pools: every device block reserved first (a CPU build cannot back managed memory, so a
 * granted block fails at the allocator: its reservation must come back) */

static void test_the_pools_reserve_device_blocks_and_give_back_what_failed_or_was_dry(void **state) {
    (void)state;
    report r;
    forked_child c = spawn_holding("pools", 80 * UNIT, &r);
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    mem.pools[UMT_POOL_OPTIM].placement = UMT_PLACE_MANAGED;
    mem.budget_bytes = 50 * UNIT;
    mem.ledger = join("pools", FREE, NULL);
    void *p = NULL;
    /* Within the context's budget, past what the other holder leaves: refused naming it. */
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_OPTIM, 30 * UNIT, &p), UMT_ERR_BUDGET);
    assert_non_null(strstr(umt_last_error(), "pool optim"));
    assert_true(mentions_holder(umt_last_error(), c.pid, 80 * UNIT));
    /* Past the context's own budget: the refusal names the other holder too. */
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_OPTIM, 60 * UNIT, &p), UMT_ERR_BUDGET);
    assert_non_null(strstr(umt_last_error(), "device budget 50000 bytes"));
    assert_true(mentions_holder(umt_last_error(), c.pid, 80 * UNIT));
    /* Granted by the ledger: the allocator's answer, and the entry holds what the pools hold. */
    umt_status st = umt_memory_alloc(&mem, UMT_POOL_OPTIM, 10 * UNIT, &p);
    assert_true(st == UMT_OK || st == UMT_ERR_UNSUPPORTED);
    assert_int_equal(look(mem.ledger).own_bytes, mem.device_bytes);
    if (st == UMT_OK) umt_memory_free(&mem, UMT_POOL_OPTIM, p);
    assert_int_equal(look(mem.ledger).own_bytes, 0);
    /* A dry step's blocks are addresses only: never in the ledger. */
    umt_memory_dry dry;
    assert_int_equal(umt_memory_dry_begin(&mem, &dry), UMT_OK);
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_OPTIM, 40 * UNIT, &p), UMT_OK);
    assert_int_equal(look(mem.ledger).own_bytes, 0);
    umt_memory_free(&mem, UMT_POOL_OPTIM, p);
    umt_memory_dry_end(&mem, &dry, NULL);
    assert_int_equal(look(mem.ledger).own_bytes, 0);
    forked_finish(&c, false);
    mem.pools[UMT_POOL_OPTIM].placement = UMT_PLACE_HOST;
    umt_memory_release(&mem); /* leaves the ledger */
    assert_null(mem.ledger);
}

/* ----------------------------------------------------------------------------------------- */
/* Hostile files: rebuilt when nobody lives in them, refused while someone does, never a crash */

static void write_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

/* A ledger file of the right layout and header with every slot's fields set to pid and bytes. */
static void write_layout(const char *path, uint32_t slot_count, uint64_t capacity, int64_t pid, uint64_t bytes) {
    uint8_t *table = calloc(1, LAYOUT_BYTES);
    assert_non_null(table);
    memcpy(table, "umtledg1", 8);
    uint32_t version = 1;
    memcpy(table + 8, &version, 4);
    memcpy(table + 12, &slot_count, 4);
    memcpy(table + 16, &capacity, 8);
    for (int i = 0; i < UMT_LEDGER_SLOTS; ++i) {
        memcpy(table + 64 + 32 * i, &pid, 8);
        memcpy(table + 64 + 32 * i + 8, &bytes, 8);
    }
    write_file(path, table, LAYOUT_BYTES);
    free(table);
}

/* Opens on a file left as it is after each of several damages, with nobody alive in it. */
static void test_a_damaged_ledger_without_live_holders_is_rebuilt(void **state) {
    (void)state;
    const char *path = ledger_file("damaged");
    uint8_t *garbage = malloc(1 << 20);
    assert_non_null(garbage);
    srand(5);
    for (int i = 0; i < 1 << 20; ++i) garbage[i] = (uint8_t)rand();
    for (int damage = 0; damage < 6; ++damage) {
        if (damage == 0) write_file(path, garbage, 100);                  /* truncated garbage */
        if (damage == 1) write_file(path, garbage, 1 << 20);              /* a megabyte of garbage */
        if (damage == 2) write_file(path, garbage, 0);                    /* empty */
        if (damage == 3) write_file(path, garbage, LAYOUT_BYTES);         /* the right size, no magic */
        if (damage == 4) write_layout(path, UINT32_MAX, UINT64_MAX, 1, 1); /* a huge slot count */
        /* The right layout, every slot a dead holder of SIZE_MAX bytes, the capacity huge. */
        if (damage == 5) write_layout(path, UMT_LEDGER_SLOTS, UINT64_MAX, -1, UINT64_MAX);
        umt_ledger_view v;
        umt_ledger *l = join("damaged", FREE, &v);
        assert_int_equal(v.capacity_bytes, CAPACITY);
        assert_int_equal(v.other_count, 0);
        assert_int_equal(v.others_bytes, 0);
        assert_int_equal(file_size(path), LAYOUT_BYTES);
        assert_int_equal(umt_ledger_reserve(l, CAPACITY, SIZE_MAX, 0), UMT_OK);
        assert_int_equal(umt_ledger_reserve(l, 1, SIZE_MAX, 0), UMT_ERR_BUDGET);
        umt_ledger_close(l);
    }
    free(garbage);
}

/* The slot of pid in the file (its offset), -1 when none. */
static long slot_of(const char *path, pid_t pid) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    long offset = -1;
    for (int i = 0; i < UMT_LEDGER_SLOTS && offset < 0; ++i) {
        int64_t value = 0;
        fseek(f, 64 + 32 * i, SEEK_SET);
        if (fread(&value, 8, 1, f) == 1 && value == (int64_t)pid) offset = 64 + 32 * i;
    }
    fclose(f);
    return offset;
}

static void overwrite(const char *path, long offset, const void *bytes, size_t size) {
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, size, offset), (ssize_t)size);
    close(fd);
}

static void test_huge_counts_of_live_holders_saturate_and_refuse(void **state) {
    (void)state;
    const char *path = ledger_file("huge");
    report r;
    forked_child c1 = spawn_holding("huge", UNIT, &r), c2 = spawn_holding("huge", UNIT, &r);
    uint64_t huge = UINT64_MAX - 5;
    overwrite(path, slot_of(path, c1.pid) + 8, &huge, sizeof huge);
    overwrite(path, slot_of(path, c2.pid) + 8, &huge, sizeof huge);
    umt_ledger_view v;
    umt_ledger *l = join("huge", FREE, &v);
    assert_int_equal(v.others_bytes, SIZE_MAX); /* added up without wrapping */
    assert_int_equal(umt_budget_shared(CAPACITY, v.capacity_bytes, v.others_bytes), 0);
    assert_int_equal(umt_ledger_reserve(l, 1, SIZE_MAX, 0), UMT_ERR_BUDGET);
    assert_true(mentions_holder(umt_last_error(), c1.pid, (size_t)huge));
    assert_int_equal(look(l).own_bytes, 0);
    forked_finish(&c1, true);
    forked_finish(&c2, true);
    assert_int_equal(umt_ledger_reserve(l, CAPACITY, SIZE_MAX, 0), UMT_OK);
    umt_ledger_close(l);
}

static void test_a_damaged_ledger_with_a_live_holder_is_refused_then_rebuilt_once_it_dies(void **state) {
    (void)state;
    const char *path = ledger_file("damaged-live");
    report r;
    forked_child c = spawn_holding("damaged-live", 30 * UNIT, &r);
    overwrite(path, 0, "garbage!", 8);
    umt_ledger *l = NULL;
    umt_ledger_view v;
    assert_int_equal(umt_ledger_open(scratch_folder(), "damaged-live", FREE, HEADROOM, &l, &v), UMT_ERR_FORMAT);
    assert_null(l);
    assert_non_null(strstr(umt_last_error(), path));
    assert_non_null(strstr(umt_last_error(), "another process holds a slot"));
    /* Truncated under a live holder: the same. */
    assert_int_equal(truncate(path, 10), 0);
    assert_int_equal(umt_ledger_open(scratch_folder(), "damaged-live", FREE, HEADROOM, &l, &v), UMT_ERR_FORMAT);
    forked_finish(&c, true);
    l = join("damaged-live", FREE, &v);
    assert_int_equal(v.capacity_bytes, CAPACITY);
    assert_int_equal(file_size(path), LAYOUT_BYTES);
    umt_ledger_close(l);
}

static void test_a_path_that_is_not_a_regular_file_is_refused_at_once(void **state) {
    (void)state;
    umt_ledger *l = NULL;
    umt_ledger_view v;
    /* A symbolic link to a file of the user's: refused, and the file untouched. */
    const char *target = scratch_write("precious", (const uint8_t *)"keep me", 7);
    assert_int_equal(symlink(target, ledger_file("link")), 0);
    assert_int_equal(umt_ledger_open(scratch_folder(), "link", FREE, HEADROOM, &l, &v), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), "symbolic link"));
    assert_int_equal(file_size(target), 7);
    /* A FIFO: refused within a second (an alarm turns a hang into a failure). */
    assert_int_equal(mkfifo(ledger_file("fifo"), 0600), 0);
    alarm(5);
    time_t before = time(NULL);
    assert_int_equal(umt_ledger_open(scratch_folder(), "fifo", FREE, HEADROOM, &l, &v), UMT_ERR_IO);
    alarm(0);
    assert_true(time(NULL) - before <= 1);
    assert_non_null(strstr(umt_last_error(), "a FIFO"));
    assert_int_equal(mkdir(ledger_file("dir"), 0700), 0);
    assert_int_equal(umt_ledger_open(scratch_folder(), "dir", FREE, HEADROOM, &l, &v), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), ledger_file("dir")));
    assert_int_equal(umt_ledger_open("/nonexistent/umt", "x", FREE, HEADROOM, &l, &v), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), "/nonexistent/umt/umtrain-ledger-x"));
    assert_null(l);
    unlink(ledger_file("link"));
    unlink(ledger_file("fifo"));
    rmdir(ledger_file("dir"));
}

static void test_keys_that_would_leave_the_directory_are_refused(void **state) {
    (void)state;
    const char *bad[] = {"../escape", "a/b", "", ".hidden", "x y", "0123456789012345678901234567890123456789"
                         "0123456789012345678901234"};
    umt_ledger *l = NULL;
    umt_ledger_view v;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        assert_int_equal(umt_ledger_open(scratch_folder(), bad[i], FREE, HEADROOM, &l, &v), UMT_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(umt_last_error(), "key"));
    }
    assert_int_equal(umt_ledger_open(scratch_folder(), NULL, FREE, HEADROOM, &l, &v), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_ledger_open("", "x", FREE, HEADROOM, &l, &v), UMT_ERR_INVALID_ARGUMENT);
    assert_null(l);
    l = join("GPU-0a1b2c3d-0000-1111-2222-333344445555", FREE, NULL);
    umt_ledger_close(l);
}

static void test_the_directory_is_the_variables_else_dev_shm(void **state) {
    (void)state;
    setenv("UMT_LEDGER_DIR", scratch_folder(), 1);
    assert_string_equal(umt_ledger_dir(), scratch_folder());
    setenv("UMT_LEDGER_DIR", "", 1);
    struct stat st;
    bool shm = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode);
    assert_string_equal(umt_ledger_dir(), shm ? "/dev/shm" : "/tmp");
    unsetenv("UMT_LEDGER_DIR");
    assert_string_equal(umt_ledger_dir(), shm ? "/dev/shm" : "/tmp");
}

/* A process stopped while it holds the file's lock: the others fail within seconds, naming it. */
static void test_a_holder_stuck_with_the_lock_fails_the_others_within_seconds(void **state) {
    (void)state;
    umt_ledger_close(join("stuck", FREE, NULL)); /* the file exists */
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(ledger_file("stuck"), O_RDWR);
        struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 64};
        if (fd < 0 || fcntl(fd, F_SETLK, &lock) != 0 || write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    forked_track(pid);
    char byte;
    assert_int_equal(read(ready[0], &byte, 1), 1);
    umt_ledger *l = NULL;
    umt_ledger_view v;
    time_t before = time(NULL);
    assert_int_equal(umt_ledger_open(scratch_folder(), "stuck", FREE, HEADROOM, &l, &v), UMT_ERR_IO);
    assert_true(time(NULL) - before <= 10);
    assert_non_null(strstr(umt_last_error(), "held its lock"));
    assert_non_null(strstr(umt_last_error(), ledger_file("stuck")));
    forked_kill_all(NULL);
    close(ready[0]);
    close(ready[1]);
    umt_ledger_close(join("stuck", FREE, NULL));
}

/* Every test kills the children a failure left alive. */
#define TEST(test) cmocka_unit_test_teardown(test, forked_kill_all)

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST(test_the_first_holder_records_the_capacity_and_later_ones_keep_it),
        TEST(test_released_bytes_lower_the_entry_others_see),
        TEST(test_the_free_memory_measured_now_bounds_each_request),
        TEST(test_concurrent_reservations_from_eight_processes_never_pass_the_capacity),
        TEST(test_a_killed_holders_bytes_are_free_for_the_next),
        TEST(test_a_full_card_refuses_naming_the_holders_the_request_and_the_capacity),
        TEST(test_every_slot_held_refuses_one_more_holder),
        TEST(test_the_pools_reserve_device_blocks_and_give_back_what_failed_or_was_dry),
        TEST(test_a_damaged_ledger_without_live_holders_is_rebuilt),
        TEST(test_huge_counts_of_live_holders_saturate_and_refuse),
        TEST(test_a_damaged_ledger_with_a_live_holder_is_refused_then_rebuilt_once_it_dies),
        TEST(test_a_path_that_is_not_a_regular_file_is_refused_at_once),
        TEST(test_keys_that_would_leave_the_directory_are_refused),
        TEST(test_the_directory_is_the_variables_else_dev_shm),
        TEST(test_a_holder_stuck_with_the_lock_fails_the_others_within_seconds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
