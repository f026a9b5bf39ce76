/*
 * tests/test_dist.c — data parallelism without a GPU: the bucket plan (a cap asked for, or sized
 * by the model), batch shards, the --gpus launcher (fork, the id through the pipe, a failing rank
 * stopping the others) and the environment bootstrap's id file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dist/bootstrap.h"
#include "dist/buckets.h"
#include "dist/umt_dist.h"

/* ----------------------------------------------------------------------------------------- */
/* Buckets */

static void test_buckets_fill_in_reverse_creation_order_up_to_the_cap(void **state) {
    (void)state;
    int64_t numel[] = {10, 20, 30, 40};
    umt_bucket_plan plan;
    assert_int_equal(umt_bucket_plan_make(numel, 4, 50, &plan), UMT_OK);
    /* 40 | 30 + 20 | 10: the last parameter made is the first gradient finished. */
    assert_int_equal(plan.bucket_count, 3);
    assert_int_equal(plan.bucket_of[3], 0);
    assert_int_equal(plan.bucket_of[2], 1);
    assert_int_equal(plan.bucket_of[1], 1);
    assert_int_equal(plan.bucket_of[0], 2);
    assert_int_equal(plan.elements[1], 50);
    assert_int_equal(plan.offset[2], 0);
    assert_int_equal(plan.offset[1], 30);
    assert_int_equal(umt_bucket_size(&plan, 1), 2);
    assert_int_equal(plan.order[plan.first[1]], 2);
    umt_bucket_plan_free(&plan);
}

static void test_a_parameter_over_the_cap_gets_a_bucket_of_its_own(void **state) {
    (void)state;
    int64_t numel[] = {5, 1000, 5};
    umt_bucket_plan plan;
    assert_int_equal(umt_bucket_plan_make(numel, 3, 100, &plan), UMT_OK);
    assert_int_equal(plan.bucket_count, 3);
    assert_int_equal(plan.elements[1], 1000);
    umt_bucket_plan_free(&plan);
    assert_int_equal(umt_bucket_plan_make(numel, 3, 1 << 20, &plan), UMT_OK);
    assert_int_equal(plan.bucket_count, 1);
    assert_int_equal(plan.elements[0], 1010);
    umt_bucket_plan_free(&plan);
}

static void test_a_bucket_starts_when_its_last_gradient_is_announced(void **state) {
    (void)state;
    int64_t numel[] = {10, 20, 30, 40};
    umt_bucket_plan plan;
    umt_status st;
    int first = -1;
    assert_int_equal(umt_bucket_plan_make(numel, 4, 50, &plan), UMT_OK);
    assert_int_equal(umt_bucket_plan_announce(&plan, 3, &first, &st), 1);
    assert_int_equal(st, UMT_OK);
    assert_int_equal(first, 0);
    assert_int_equal(umt_bucket_plan_announce(&plan, 2, &first, &st), 0); /* bucket 1 waits for parameter 1 */
    assert_int_equal(umt_bucket_plan_announce(&plan, 1, &first, &st), 1);
    assert_int_equal(first, 1);
    assert_int_equal(umt_bucket_plan_announce(&plan, 0, &first, &st), 1);
    assert_int_equal(first, 2);
    umt_bucket_plan_free(&plan);
}

static void test_buckets_start_in_order_even_when_completed_out_of_order(void **state) {
    (void)state;
    int64_t numel[] = {10, 20, 30, 40};
    umt_bucket_plan plan;
    umt_status st;
    int first = -1;
    assert_int_equal(umt_bucket_plan_make(numel, 4, 50, &plan), UMT_OK);
    /* Bucket 2 (parameter 0) completes first, but must wait for buckets 0 and 1. */
    assert_int_equal(umt_bucket_plan_announce(&plan, 0, &first, &st), 0);
    assert_int_equal(umt_bucket_plan_announce(&plan, 1, &first, &st), 0);
    assert_int_equal(umt_bucket_plan_announce(&plan, 2, &first, &st), 0);
    assert_int_equal(umt_bucket_plan_announce(&plan, 3, &first, &st), 3);
    assert_int_equal(first, 0);
    umt_bucket_plan_free(&plan);
}

static void test_unannounced_buckets_start_at_the_end_and_a_new_step_starts_afresh(void **state) {
    (void)state;
    int64_t numel[] = {10, 20, 30, 40};
    umt_bucket_plan plan;
    umt_status st;
    int first = -1;
    assert_int_equal(umt_bucket_plan_make(numel, 4, 50, &plan), UMT_OK);
    assert_int_equal(umt_bucket_plan_announce(&plan, 3, &first, &st), 1);
    assert_int_equal(umt_bucket_plan_rest(&plan, &first), 2);
    assert_int_equal(first, 1);
    assert_int_equal(umt_bucket_plan_rest(&plan, &first), 0);
    umt_bucket_plan_reset(&plan);
    assert_int_equal(umt_bucket_plan_announce(&plan, 3, &first, &st), 1);
    assert_int_equal(first, 0);
    umt_bucket_plan_free(&plan);
}

static void test_a_gradient_announced_twice_is_an_error(void **state) {
    (void)state;
    int64_t numel[] = {10, 20};
    umt_bucket_plan plan;
    umt_status st;
    int first;
    assert_int_equal(umt_bucket_plan_make(numel, 2, 100, &plan), UMT_OK);
    umt_bucket_plan_announce(&plan, 1, &first, &st);
    assert_int_equal(umt_bucket_plan_announce(&plan, 1, &first, &st), 0);
    assert_int_equal(st, UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "twice"));
    assert_int_equal(umt_bucket_plan_announce(&plan, 7, &first, &st), 0);
    assert_int_equal(st, UMT_ERR_INVALID_ARGUMENT);
    umt_bucket_plan_free(&plan);
    assert_int_equal(umt_bucket_plan_make(numel, 2, 0, &plan), UMT_ERR_INVALID_ARGUMENT);
}

/* mnist_cnn's parameters in creation order (conv1, conv2, fc1, fc2; weight, then bias): 1.2M. */
static const int64_t mnist_cnn_numel[] = {288, 32, 18432, 64, 1179648, 128, 1280, 10};

/* Two buckets: fc2 and fc1, whose gradients backward finishes first, reduced while the
 * convolutions' backward runs; then the convolutions' own. In f32 and in bf16 alike. */
static void test_auto_buckets_split_a_model_of_1_2m_parameters_in_two_last_layers_first(void **state) {
    (void)state;
    for (size_t bytes = 2; bytes <= 4; bytes += 2) {
        umt_bucket_plan plan;
        assert_int_equal(umt_bucket_plan_make_auto(mnist_cnn_numel, 8, bytes, &plan), UMT_OK);
        assert_int_equal(plan.bucket_count, 2);
        assert_int_equal(plan.elements[0], 10 + 1280 + 128 + 1179648);
        assert_int_equal(plan.elements[1], 64 + 18432 + 32 + 288);
        assert_int_equal(plan.bucket_of[4], 0); /* fc1's weight */
        assert_int_equal(plan.bucket_of[2], 1); /* conv2's */
        umt_bucket_plan_free(&plan);
    }
}

/* Under 2 MiB of gradients (mnist_mlp: 784-256-10, 0.8 MB) a second all-reduce would cost more
 * latency than it hides: one bucket. */
static void test_auto_buckets_keep_a_small_model_in_one(void **state) {
    (void)state;
    const int64_t numel[] = {200704, 256, 2560, 10};
    umt_bucket_plan plan;
    assert_int_equal(umt_bucket_plan_make_auto(numel, 4, sizeof(float), &plan), UMT_OK);
    assert_int_equal(plan.bucket_count, 1);
    assert_int_equal(plan.elements[0], 200704 + 256 + 2560 + 10);
    umt_bucket_plan_free(&plan);
}

/* A large model (40 parameters of 4 MiB: 160 MiB) gets DDP's buckets: each closes once it holds
 * 25 MiB, so all but the last hold 25 to 28 MiB. */
static void test_auto_buckets_of_a_large_model_close_at_25_mib(void **state) {
    (void)state;
    int64_t numel[40];
    for (int i = 0; i < 40; ++i) numel[i] = 1 << 20;
    umt_bucket_plan plan;
    assert_int_equal(umt_bucket_plan_make_auto(numel, 40, sizeof(float), &plan), UMT_OK);
    assert_int_equal(plan.bucket_count, 6); /* 7 parameters (28 MiB) each, 5 in the last */
    for (int b = 0; b < plan.bucket_count - 1; ++b) assert_int_equal(plan.elements[b], 7 << 20);
    assert_int_equal(plan.elements[5], 5 << 20);
    umt_bucket_plan_free(&plan);
    assert_int_equal(umt_bucket_plan_make_auto(numel, 40, 0, &plan), UMT_ERR_INVALID_ARGUMENT);
}

static void test_buckets_are_sized_by_the_model_unless_asked(void **state) {
    (void)state;
    assert_int_equal(umt_dist_defaults().bucket_bytes, 0);
}

/* ----------------------------------------------------------------------------------------- */
/* Shards */

static void test_shards_cover_a_batch_disjointly_and_differ_by_at_most_one(void **state) {
    (void)state;
    for (int size = 1; size <= 8; ++size)
        for (int64_t count = size; count <= 70; ++count) {
            int64_t next = 0, smallest = count, largest = 0;
            for (int rank = 0; rank < size; ++rank) {
                int64_t offset, part;
                umt_dist_shard(count, rank, size, &offset, &part);
                assert_int_equal(offset, next); /* each part starts where the last one ended */
                next = offset + part;
                if (part < smallest) smallest = part;
                if (part > largest) largest = part;
            }
            assert_int_equal(next, count);
            assert_true(largest - smallest <= 1);
            assert_true(smallest >= 1);
        }
    assert_false(umt_dist_batch_usable(1, 2));
    assert_true(umt_dist_batch_usable(2, 2));
}

/* ----------------------------------------------------------------------------------------- */
/* The launcher */

static const char test_id[16] = "nccl-id-for-test";

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_launcher_ranks_get_rank_zeros_id_through_the_pipe(void **state) {
    (void)state;
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(3, &p), UMT_OK);
    if (!p.launcher) {
        char id[16] = {0};
        if (p.rank == 0) memcpy(id, test_id, sizeof id);
        umt_status st = umt_bootstrap_share_id(&p, id, sizeof id, 10);
        /* Each child says, through its exit code, whether it got the right id. */
        _exit(st == UMT_OK && p.size == 3 && p.local_rank == p.rank && !memcmp(id, test_id, sizeof id) ? 0 : 10 + p.rank);
    }
    assert_int_equal(p.exit_code, 0);
    assert_int_equal(p.size, 3);
    assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
}

static void test_a_failing_rank_stops_the_others_and_its_code_is_returned(void **state) {
    (void)state;
    umt_dist_process p;
    double start = seconds();
    assert_int_equal(umt_dist_launch(3, &p), UMT_OK);
    if (!p.launcher) {
        if (p.rank == 1) _exit(7);
        sleep(60); /* the others would hang: the launcher must stop them */
        _exit(0);
    }
    assert_int_equal(p.exit_code, 7);
    assert_true(seconds() - start < 20);
}

static void test_ranks_see_an_error_not_a_hang_when_rank_zero_dies_before_the_id(void **state) {
    (void)state;
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(2, &p), UMT_OK);
    if (!p.launcher) {
        if (p.rank == 0) _exit(0); /* ends without sending */
        char id[16];
        umt_status st = umt_bootstrap_share_id(&p, id, sizeof id, 10);
        _exit(st == UMT_ERR_IO && strstr(umt_last_error(), "rank 0") ? 0 : 5);
    }
    assert_int_equal(p.exit_code, 0);
}

static void test_gpus_under_mpirun_is_refused(void **state) {
    (void)state;
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(2, &p), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "mpirun"));
    unsetenv("OMPI_COMM_WORLD_SIZE");
}

/* Two processes that look like Open MPI's ranks: the id goes through a file. */
static void test_environment_bootstrap_passes_the_id_through_a_file(void **state) {
    (void)state;
    char dir[] = "/tmp/umt_dist_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    pid_t pids[2];
    for (int r = 0; r < 2; ++r) {
        pids[r] = fork();
        if (pids[r] != 0) continue;
        char rank[8];
        snprintf(rank, sizeof rank, "%d", r);
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        setenv("OMPI_COMM_WORLD_RANK", rank, 1);
        setenv("OMPI_COMM_WORLD_LOCAL_RANK", rank, 1);
        setenv("OMPI_MCA_ess_base_jobid", "4242", 1);
        setenv("UMT_DIST_ID_DIR", dir, 1);
        umt_dist_process p;
        char id[16] = {0};
        if (r == 0) memcpy(id, test_id, sizeof id);
        if (r == 1) nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL); /* either order must work; here rank 0 writes first */
        umt_status st = umt_dist_launch(1, &p);
        if (st == UMT_OK) st = umt_bootstrap_share_id(&p, id, sizeof id, 10);
        bool ok = st == UMT_OK && p.bootstrap == UMT_DIST_ENV && p.rank == r && p.size == 2 && !memcmp(id, test_id, 16);
        _exit(ok ? 0 : 1);
    }
    for (int r = 0; r < 2; ++r) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/umtrain-nccl-id-4242", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_fill_in_reverse_creation_order_up_to_the_cap),
        cmocka_unit_test(test_a_parameter_over_the_cap_gets_a_bucket_of_its_own),
        cmocka_unit_test(test_a_bucket_starts_when_its_last_gradient_is_announced),
        cmocka_unit_test(test_buckets_start_in_order_even_when_completed_out_of_order),
        cmocka_unit_test(test_unannounced_buckets_start_at_the_end_and_a_new_step_starts_afresh),
        cmocka_unit_test(test_a_gradient_announced_twice_is_an_error),
        cmocka_unit_test(test_auto_buckets_split_a_model_of_1_2m_parameters_in_two_last_layers_first),
        cmocka_unit_test(test_auto_buckets_keep_a_small_model_in_one),
        cmocka_unit_test(test_auto_buckets_of_a_large_model_close_at_25_mib),
        cmocka_unit_test(test_buckets_are_sized_by_the_model_unless_asked),
        cmocka_unit_test(test_shards_cover_a_batch_disjointly_and_differ_by_at_most_one),
        cmocka_unit_test(test_launcher_ranks_get_rank_zeros_id_through_the_pipe),
        cmocka_unit_test(test_a_failing_rank_stops_the_others_and_its_code_is_returned),
        cmocka_unit_test(test_ranks_see_an_error_not_a_hang_when_rank_zero_dies_before_the_id),
        cmocka_unit_test(test_gpus_under_mpirun_is_refused),
        cmocka_unit_test(test_environment_bootstrap_passes_the_id_through_a_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
