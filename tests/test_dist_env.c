/*
 * tests/test_dist_env.c — how a rank learns who it is from the launcher that started it, without
 * MPI in the build: Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) and Slurm's
 * srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); which one wins where both are set; a bad value
 * refused with a message that names the variable and the value; the GPU a rank takes from its
 * local rank and the GPUs it sees; the NCCL id through a file under srun.
 *
 * Each case sets the variables it needs and clears all of them after, so that the cases (and a
 * test run that happens to sit inside a Slurm job) do not see each other's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dist/bootstrap.h"
#include "dist/umt_dist.h"

static const char *const launcher_variables[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_MCA_ess_base_jobid",
    "PMIX_RANK",            "PMI_RANK",             "SLURM_PROCID",               "SLURM_NTASKS",
    "SLURM_LOCALID",        "SLURM_STEP_ID",        "SLURM_JOB_ID",               "UMT_DIST_ID_DIR",
};

static int clear_launcher(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof launcher_variables / sizeof *launcher_variables; ++i) unsetenv(launcher_variables[i]);
    return 0;
}

static void open_mpi(const char *rank, const char *size, const char *local_rank) {
    setenv("OMPI_COMM_WORLD_RANK", rank, 1);
    setenv("OMPI_COMM_WORLD_SIZE", size, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", local_rank, 1);
}

/* What srun sets in each task of a job step (the batch script itself has no SLURM_STEP_ID). */
static void srun(const char *rank, const char *size, const char *local_rank) {
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_JOB_ID", "777", 1);
    setenv("SLURM_PROCID", rank, 1);
    setenv("SLURM_NTASKS", size, 1);
    setenv("SLURM_LOCALID", local_rank, 1);
}

/* ----------------------------------------------------------------------------------------- */
/* Ranks */

static void test_ranks_come_from_open_mpis_environment(void **state) {
    (void)state;
    open_mpi("3", "4", "1");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(1, &p), UMT_OK);
    assert_int_equal(p.bootstrap, UMT_DIST_ENV);
    assert_int_equal(p.rank, 3);
    assert_int_equal(p.size, 4);
    assert_int_equal(p.local_rank, 1);
    assert_false(p.launcher);
}

static void test_ranks_come_from_slurms_environment_under_srun(void **state) {
    (void)state;
    srun("5", "8", "1");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(1, &p), UMT_OK);
    assert_int_equal(p.bootstrap, UMT_DIST_SLURM);
    assert_int_equal(p.rank, 5);
    assert_int_equal(p.size, 8);
    assert_int_equal(p.local_rank, 1);
}

/* mpirun inside a Slurm allocation starts its daemons with srun, so its ranks inherit the
 * daemons' SLURM_PROCID (one per node): Open MPI's own variables are the ranks'. */
static void test_open_mpi_wins_over_slurm_under_mpirun_in_an_allocation(void **state) {
    (void)state;
    srun("0", "2", "0");
    open_mpi("3", "4", "1");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(1, &p), UMT_OK);
    assert_int_equal(p.bootstrap, UMT_DIST_ENV);
    assert_int_equal(p.rank, 3);
    assert_int_equal(p.size, 4);
}

/* sbatch's script sees SLURM_PROCID 0 and the job's SLURM_NTASKS, but it is one process: only a
 * task of srun's job step (SLURM_STEP_ID) is one rank of several. */
static void test_a_batch_script_without_srun_is_one_process(void **state) {
    (void)state;
    srun("0", "4", "0");
    unsetenv("SLURM_STEP_ID");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(1, &p), UMT_OK);
    assert_int_equal(p.bootstrap, UMT_DIST_SINGLE);
    assert_int_equal(p.size, 1);
}

static void test_gpus_under_srun_is_refused(void **state) {
    (void)state;
    srun("0", "2", "0");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(2, &p), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "srun"));
}

typedef struct {
    bool slurm;
    const char *rank, *size, *local_rank;
    const char *named; /* what the message must hold: the variable and its value */
} bad_case;

/* Each launcher's bad values, one at a time: not a number, trailing bytes, negative, too large,
 * empty, a rank or local rank not below the size, no ranks at all. */
static void test_bad_values_are_refused_naming_the_variable_and_the_value(void **state) {
    (void)state;
    const bad_case cases[] = {
        {false, "x", "2", "0", "OMPI_COMM_WORLD_RANK = 'x'"},
        {false, "1", "2x", "0", "OMPI_COMM_WORLD_SIZE = '2x'"},
        {false, "1", "2", "-1", "OMPI_COMM_WORLD_LOCAL_RANK = '-1'"},
        {false, "", "2", "0", "OMPI_COMM_WORLD_RANK = ''"},
        {false, "2", "2", "0", "OMPI_COMM_WORLD_RANK = 2"},
        {false, "0", "0", "0", "OMPI_COMM_WORLD_SIZE = '0'"},
        {true, "1", "99999999999", "0", "SLURM_NTASKS = '99999999999'"},
        {true, " 1", "2", "0", "SLURM_PROCID = ' 1'"},
        {true, "1", "2", "0x1", "SLURM_LOCALID = '0x1'"},
        {true, "4", "4", "0", "SLURM_PROCID = 4"},
        {true, "1", "4", "4", "SLURM_LOCALID = 4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        clear_launcher(NULL);
        const bad_case *c = &cases[i];
        (c->slurm ? srun : open_mpi)(c->rank, c->size, c->local_rank);
        umt_dist_process p;
        umt_status st = umt_dist_launch(1, &p);
        if (st != UMT_ERR_INVALID_ARGUMENT || !strstr(umt_last_error(), c->named))
            fail_msg("case %zu: status %s, message \"%s\": expected UMT_ERR_INVALID_ARGUMENT naming \"%s\"", i,
                     umt_status_name(st), umt_last_error(), c->named);
    }
}

/* A variable the launcher left out is named too. */
static void test_a_missing_variable_is_named(void **state) {
    (void)state;
    srun("1", "2", "0");
    unsetenv("SLURM_LOCALID");
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(1, &p), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "SLURM_LOCALID"));
    assert_non_null(strstr(umt_last_error(), "not set"));
}

/* ----------------------------------------------------------------------------------------- */
/* The GPU of a rank */

static void test_a_rank_takes_the_gpu_of_its_local_rank(void **state) {
    (void)state;
    int gpu = -1;
    assert_int_equal(umt_bootstrap_gpu(5, 1, 8, &gpu), UMT_OK);
    assert_int_equal(gpu, 1);
    assert_int_equal(umt_bootstrap_gpu(7, 3, 4, &gpu), UMT_OK);
    assert_int_equal(gpu, 3);
}

/* srun --gpus-per-task=1 (or CUDA_VISIBLE_DEVICES set per rank) leaves each rank one GPU. */
static void test_a_rank_that_sees_one_gpu_takes_it(void **state) {
    (void)state;
    int gpu = -1;
    assert_int_equal(umt_bootstrap_gpu(3, 3, 1, &gpu), UMT_OK);
    assert_int_equal(gpu, 0);
}

/* No GPU to count (a CPU build, or no driver): the local rank, for the context to check. */
static void test_without_gpus_to_count_the_local_rank_stands(void **state) {
    (void)state;
    int gpu = -1;
    assert_int_equal(umt_bootstrap_gpu(2, 2, 0, &gpu), UMT_OK);
    assert_int_equal(gpu, 2);
}

static void test_more_ranks_on_a_node_than_gpus_is_refused_naming_both(void **state) {
    (void)state;
    int gpu = -1;
    assert_int_equal(umt_bootstrap_gpu(6, 2, 2, &gpu), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "rank 6"));
    assert_non_null(strstr(umt_last_error(), "local rank 2"));
    assert_non_null(strstr(umt_last_error(), "2 GPUs"));
}

/* ----------------------------------------------------------------------------------------- */
/* The NCCL id under srun */

/* Two processes that look like srun's tasks: the id goes through a file named by the job step. */
static void test_srun_ranks_pass_the_id_through_a_file_of_their_job_step(void **state) {
    (void)state;
    static const char test_id[16] = "nccl-id-for-srun";
    char dir[] = "/tmp/umt_dist_env_XXXXXX";
    assert_non_null(mkdtemp(dir));
    pid_t pids[2];
    for (int r = 0; r < 2; ++r) {
        pids[r] = fork();
        if (pids[r] != 0) continue;
        char rank[8];
        snprintf(rank, sizeof rank, "%d", r);
        srun(rank, "2", rank);
        setenv("UMT_DIST_ID_DIR", dir, 1);
        umt_dist_process p;
        char id[16] = {0};
        if (r == 0) memcpy(id, test_id, sizeof id);
        umt_status st = umt_dist_launch(1, &p);
        if (st == UMT_OK) st = umt_bootstrap_share_id(&p, id, sizeof id, 10);
        bool ok = st == UMT_OK && p.bootstrap == UMT_DIST_SLURM && p.rank == r && !memcmp(id, test_id, sizeof id);
        _exit(ok ? 0 : 1);
    }
    for (int r = 0; r < 2; ++r) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/umtrain-nccl-id-slurm-777.0", dir);
    assert_int_equal(access(path, F_OK), 0); /* rank 0 removes it after ncclCommInitRank: not here */
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ranks_come_from_open_mpis_environment, clear_launcher, clear_launcher),
        cmocka_unit_test_setup_teardown(test_ranks_come_from_slurms_environment_under_srun, clear_launcher,
                                        clear_launcher),
        cmocka_unit_test_setup_teardown(test_open_mpi_wins_over_slurm_under_mpirun_in_an_allocation, clear_launcher,
                                        clear_launcher),
        cmocka_unit_test_setup_teardown(test_a_batch_script_without_srun_is_one_process, clear_launcher,
                                        clear_launcher),
        cmocka_unit_test_setup_teardown(test_gpus_under_srun_is_refused, clear_launcher, clear_launcher),
        cmocka_unit_test_setup_teardown(test_bad_values_are_refused_naming_the_variable_and_the_value, clear_launcher,
                                        clear_launcher),
        cmocka_unit_test_setup_teardown(test_a_missing_variable_is_named, clear_launcher, clear_launcher),
        cmocka_unit_test(test_a_rank_takes_the_gpu_of_its_local_rank),
        cmocka_unit_test(test_a_rank_that_sees_one_gpu_takes_it),
        cmocka_unit_test(test_without_gpus_to_count_the_local_rank_stands),
        cmocka_unit_test(test_more_ranks_on_a_node_than_gpus_is_refused_naming_both),
        cmocka_unit_test_setup_teardown(test_srun_ranks_pass_the_id_through_a_file_of_their_job_step, clear_launcher,
                                        clear_launcher),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
