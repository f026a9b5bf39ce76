/*
 * kernels/cpu/gemm.c — single-precision matrix product, row-major, on the CPU backend's threads.
 *
 *     C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
 *
 * lda, ldb and ldc are row strides in elements. op(X) is X or X transposed, so a [k,m] A with
 * trans_a reads as [m,k].
 *
 * Every element of C is computed the same way, however the work is blocked and whichever thread
 * does it: C is scaled by beta first, then (alpha * a_ip) * b_pj is added for p = 0, 1, ..., k-1,
 * each product and each sum rounded to f32. That is the plain triple loop's order, so the
 * blocking, a tile's place and the thread count never change a bit of the result.
 *
 * How it is fast without intrinsics (the Goto/BLIS scheme):
 *   - op(B) is copied KC x NC at a time into strips NR columns wide ([strip][p][NR]), and op(A)
 *     MC x KC at a time into strips MR rows high ([strip][p][MR], times alpha), whatever the
 *     transposes, zero-padded at the edges: every tile reads contiguous, aligned memory;
 *   - a tile of MR x NR elements of C stays in registers while p runs over the panel: each step
 *     loads an NR-row of B and MR values of A and does MR * NR multiplies and adds. The tile's
 *     loop is plain C, its rows unrolled, and GCC keeps the tile in vector registers;
 *   - on an x86-64 CPU that has AVX2 (asked at run time), whose vectors are twice as wide, a tile
 *     spans two B strips, 6 x 16, in a loop compiled for AVX2 alone; the baseline build (SSE2)
 *     keeps 6 x 8. No -march=native, and never FMA: a fused multiply-add rounds once where the
 *     order above rounds twice.
 *
 * Threads split C into column blocks (or row blocks when C is tall and thin), each a product of
 * its own (kernels/cpu/threads.h); the convolutions call the one-thread product on their parts.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"

/*
 * Tile and panel sizes. MR x NR = 6 x 8 floats is twelve SSE registers of accumulators (6 x 16,
 * two strips, is twelve AVX ones), with room for the B row and a broadcast A value. A packed B strip (KC x NR, 8
 * KiB) stays in L1 while the tiles of one A block use it; the A block (MC x KC, 96 KiB) and the B
 * panel (KC x NC, 128 KiB) stay in L2. Both panels live on the caller's stack (224 KiB). MC is a
 * multiple of MR and NC of NR, so only the matrix's own edges make partial tiles.
 */
enum { GEMM_MR = 6, GEMM_NR = 8, GEMM_KC = 256, GEMM_MC = 96, GEMM_NC = 128 };

/* A part of a threaded product holds at least this many multiply-adds (about 20 us of work on one
 * core), so that waking a thread costs little next to it. */
enum { GEMM_MIN_PART = 1 << 20 };

/* C = beta * C over [m, n]; beta = 0 writes zeros without reading C, which may hold garbage. */
static void scale_c(float *c, int64_t ldc, int64_t m, int64_t n, float beta) {
    if (beta == 1.0f) return;
    for (int64_t i = 0; i < m; i++) {
        float *row = c + i * ldc;
        if (beta == 0.0f) {
            memset(row, 0, (size_t)n * sizeof *row);
        } else {
            for (int64_t j = 0; j < n; j++) row[j] *= beta;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Packing                                                                                     */

/* packed[s][p][j] = op(B)[p0 + p, j0 + s*NR + j] for p < kb, over nb columns, 0 past them. A whole
 * strip takes a loop of constant length without tests for its layout (the compiler turns it into
 * vector moves), the matrix's last, partial strip the general loop. */
static void pack_b(const float *b, int64_t ldb, bool trans_b, int64_t p0, int64_t j0, int64_t kb, int64_t nb,
                   float *packed) {
    for (int64_t s = 0; s * GEMM_NR < nb; s++) {
        float *strip = packed + s * kb * GEMM_NR;
        int64_t first = j0 + s * GEMM_NR, cols = nb - s * GEMM_NR < GEMM_NR ? nb - s * GEMM_NR : GEMM_NR;
        /* op(B)[p, j] is B[p, j], or B[j, p] transposed: (p, j) of the strip is rows[p * step + j * stride] */
        const float *rows = trans_b ? b + first * ldb + p0 : b + p0 * ldb + first;
        int64_t step = trans_b ? 1 : ldb, stride = trans_b ? ldb : 1;
        if (cols == GEMM_NR && !trans_b) {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t j = 0; j < GEMM_NR; j++) strip[p * GEMM_NR + j] = rows[p * ldb + j];
        } else if (cols == GEMM_NR) {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t j = 0; j < GEMM_NR; j++) strip[p * GEMM_NR + j] = rows[p + j * ldb];
        } else {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t j = 0; j < GEMM_NR; j++)
                    strip[p * GEMM_NR + j] = j < cols ? rows[p * step + j * stride] : 0.0f;
        }
    }
}

/* packed[t][p][r] = alpha * op(A)[i0 + t*MR + r, p0 + p] for p < kb, over mb rows, 0 past them.
 * alpha * a is the product the plain loop rounds first. */
static void pack_a(const float *a, int64_t lda, bool trans_a, int64_t i0, int64_t p0, int64_t mb, int64_t kb,
                   float alpha, float *packed) {
    for (int64_t t = 0; t * GEMM_MR < mb; t++) {
        float *strip = packed + t * kb * GEMM_MR;
        int64_t first = i0 + t * GEMM_MR, rows = mb - t * GEMM_MR < GEMM_MR ? mb - t * GEMM_MR : GEMM_MR;
        /* (r, p) of the strip is cols[p * step + r * stride], as in pack_b */
        const float *cols = trans_a ? a + p0 * lda + first : a + first * lda + p0;
        int64_t step = trans_a ? lda : 1, stride = trans_a ? 1 : lda;
        if (rows == GEMM_MR && trans_a) {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t r = 0; r < GEMM_MR; r++) strip[p * GEMM_MR + r] = alpha * cols[p * lda + r];
        } else if (rows == GEMM_MR) {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t r = 0; r < GEMM_MR; r++) strip[p * GEMM_MR + r] = alpha * cols[p + r * lda];
        } else {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t r = 0; r < GEMM_MR; r++)
                    strip[p * GEMM_MR + r] = r < rows ? alpha * cols[p * step + r * stride] : 0.0f;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The tile                                                                                    */

/* C tile [MR, NR] (row stride ldc) += the packed A strip times the packed B strip, p ascending.
 * The tile is loaded into `acc`, which the unrolled rows let the compiler keep in registers. */
static inline void multiply_tile(int64_t kb, const float *restrict a, const float *restrict b, float *restrict c,
                                 int64_t ldc) {
    float acc[GEMM_MR * GEMM_NR];
    for (int r = 0; r < GEMM_MR; r++)
        for (int j = 0; j < GEMM_NR; j++) acc[r * GEMM_NR + j] = c[r * ldc + j];
    for (int64_t p = 0; p < kb; p++) {
        const float *a_p = a + p * GEMM_MR, *b_p = b + p * GEMM_NR;
        _Pragma("GCC unroll 6") for (int r = 0; r < GEMM_MR; r++) {
            for (int j = 0; j < GEMM_NR; j++) acc[r * GEMM_NR + j] += a_p[r] * b_p[j];
        }
    }
    for (int r = 0; r < GEMM_MR; r++)
        for (int j = 0; j < GEMM_NR; j++) c[r * ldc + j] = acc[r * GEMM_NR + j];
}

/* A tile at the matrix's edge, rows x cols of it inside C: computed whole in a local tile (the
 * padding's zeros meet only the padding), then its inside copied back. */
static inline void multiply_edge_tile(int64_t kb, const float *a, const float *b, float *c, int64_t ldc, int64_t rows,
                                      int64_t cols) {
    float tile[GEMM_MR * GEMM_NR] = {0};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) tile[r * GEMM_NR + j] = c[r * ldc + j];
    multiply_tile(kb, a, b, tile, GEMM_NR);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) c[r * ldc + j] = tile[r * GEMM_NR + j];
}

#if defined(__x86_64__) && defined(__GNUC__)
/* C tile [MR, 2 * NR] += the packed A strip times two adjacent packed B strips (b and b + kb * NR),
 * p ascending: the tile for AVX2's vectors of eight floats, twelve of its sixteen registers. */
__attribute__((target("avx2"))) static void multiply_wide_tile(int64_t kb, const float *restrict a,
                                                               const float *restrict b, float *restrict c,
                                                               int64_t ldc) {
    float acc[GEMM_MR * 2 * GEMM_NR];
    const float *b2 = b + kb * GEMM_NR;
    for (int r = 0; r < GEMM_MR; r++)
        for (int j = 0; j < 2 * GEMM_NR; j++) acc[r * 2 * GEMM_NR + j] = c[r * ldc + j];
    for (int64_t p = 0; p < kb; p++) {
        const float *a_p = a + p * GEMM_MR, *b_p = b + p * GEMM_NR, *b2_p = b2 + p * GEMM_NR;
        _Pragma("GCC unroll 6") for (int r = 0; r < GEMM_MR; r++) {
            for (int j = 0; j < GEMM_NR; j++) acc[r * 2 * GEMM_NR + j] += a_p[r] * b_p[j];
            for (int j = 0; j < GEMM_NR; j++) acc[r * 2 * GEMM_NR + GEMM_NR + j] += a_p[r] * b2_p[j];
        }
    }
    for (int r = 0; r < GEMM_MR; r++)
        for (int j = 0; j < 2 * GEMM_NR; j++) c[r * ldc + j] = acc[r * 2 * GEMM_NR + j];
}

/* The wide tile of the block's last, partial row of tiles (rows < MR of it inside C), as
 * multiply_edge_tile does it: m = 64, the batch or the channels, leaves 4 rows there. */
__attribute__((target("avx2"))) static void multiply_wide_edge_tile(int64_t kb, const float *a, const float *b,
                                                                    float *c, int64_t ldc, int64_t rows) {
    float tile[GEMM_MR * 2 * GEMM_NR] = {0};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < 2 * GEMM_NR; j++) tile[r * 2 * GEMM_NR + j] = c[r * ldc + j];
    multiply_wide_tile(kb, a, b, tile, 2 * GEMM_NR);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < 2 * GEMM_NR; j++) c[r * ldc + j] = tile[r * 2 * GEMM_NR + j];
}
#endif

/* The tiles of one B strip (columns j to j + NR) over the A block's rows. Not inlined: inlined into
 * the product's loops, the tile lost its registers to GCC's allocator (a third of the speed). */
__attribute__((noinline)) static void multiply_strip(int64_t mb, int64_t nb, int64_t kb, int64_t j,
                                                     const float *packed_a, const float *packed_b, float *c,
                                                     int64_t ldc) {
    for (int64_t i = 0; i < mb; i += GEMM_MR) {
        const float *a = packed_a + i * kb, *b = packed_b + j * kb;
        float *tile = c + i * ldc + j;
        if (i + GEMM_MR <= mb && j + GEMM_NR <= nb) {
            multiply_tile(kb, a, b, tile, ldc);
        } else {
            int64_t rows = mb - i < GEMM_MR ? mb - i : GEMM_MR, cols = nb - j < GEMM_NR ? nb - j : GEMM_NR;
            multiply_edge_tile(kb, a, b, tile, ldc, rows, cols);
        }
    }
}

/* Whether the tiles may be AVX2's wide ones: asked of the CPU once (any thread may ask first; all
 * get the same answer). */
static bool wide_tiles(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    static atomic_int has_avx2 = -1; /* -1: not asked yet */
    if (atomic_load_explicit(&has_avx2, memory_order_relaxed) < 0)
        atomic_store_explicit(&has_avx2, __builtin_cpu_supports("avx2") ? 1 : 0, memory_order_relaxed);
    return atomic_load_explicit(&has_avx2, memory_order_relaxed) == 1;
#else
    return false;
#endif
}

/* C[0:mb, 0:nb] += the packed A block times the packed B panel: every tile, B strips outer so that
 * they stay in L1 while the A block's strips pass over them. With AVX2, two strips at a time in
 * wide tiles while two whole ones are left. */
static void multiply_block(int64_t mb, int64_t nb, int64_t kb, const float *packed_a, const float *packed_b,
                           float *c, int64_t ldc) {
    bool wide = wide_tiles();
    int64_t whole_rows = mb - mb % GEMM_MR;
    for (int64_t j = 0; j < nb;) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (wide && j + 2 * GEMM_NR <= nb) {
            for (int64_t i = 0; i < whole_rows; i += GEMM_MR)
                multiply_wide_tile(kb, packed_a + i * kb, packed_b + j * kb, c + i * ldc + j, ldc);
            if (whole_rows < mb)
                multiply_wide_edge_tile(kb, packed_a + whole_rows * kb, packed_b + j * kb, c + whole_rows * ldc + j,
                                        ldc, mb - whole_rows);
            j += 2 * GEMM_NR;
            continue;
        }
#endif
        multiply_strip(mb, nb, kb, j, packed_a, packed_b, c, ldc);
        j += GEMM_NR;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The product                                                                                 */

umt_status umt_gemm_check_arguments(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                                    int64_t ldb, int64_t ldc) {
    if (m < 0 || n < 0 || k < 0) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "gemm: m=%lld n=%lld k=%lld, expected sizes >= 0", (long long)m,
                        (long long)n, (long long)k);
    }
    /* A row-major [rows, cols] matrix needs a row stride of at least cols. */
    int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (lda < a_cols || ldb < b_cols || ldc < n) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "gemm: lda=%lld ldb=%lld ldc=%lld, expected at least %lld, %lld and %lld (row lengths)",
                        (long long)lda, (long long)ldb, (long long)ldc, (long long)a_cols, (long long)b_cols,
                        (long long)n);
    }
    return UMT_OK;
}

void umt_cpu_gemm_one_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                             int64_t ldc) {
    scale_c(c, ldc, m, n, beta);
    /* As in BLAS, alpha = 0 means A and B are not read (NaNs in them do not reach C). */
    if (alpha == 0.0f || m == 0) return;

    float packed_b[GEMM_KC * GEMM_NC], packed_a[GEMM_MC * GEMM_KC];
    for (int64_t j0 = 0; j0 < n; j0 += GEMM_NC) {
        int64_t nb = n - j0 < GEMM_NC ? n - j0 : GEMM_NC;
        for (int64_t p0 = 0; p0 < k; p0 += GEMM_KC) {
            int64_t kb = k - p0 < GEMM_KC ? k - p0 : GEMM_KC;
            pack_b(b, ldb, trans_b, p0, j0, kb, nb, packed_b);
            for (int64_t i0 = 0; i0 < m; i0 += GEMM_MC) {
                int64_t mb = m - i0 < GEMM_MC ? m - i0 : GEMM_MC;
                pack_a(a, lda, trans_a, i0, p0, mb, kb, alpha, packed_a);
                multiply_block(mb, nb, kb, packed_a, packed_b, c + i0 * ldc + j0, ldc);
            }
        }
    }
}

/* The arguments of one threaded product, and how C is cut: into column blocks, or row blocks. */
typedef struct {
    bool trans_a, trans_b, by_rows;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} gemm_job;

/* Part `part` of C: rows [first, end) take those rows of op(A); columns take those of op(B). */
static void gemm_part(void *arg, int part, int parts) {
    const gemm_job *g = arg;
    int64_t first, end;
    if (g->by_rows) {
        umt_cpu_part_range(g->m, GEMM_MR, part, parts, &first, &end);
        const float *a = g->trans_a ? g->a + first : g->a + first * g->lda;
        umt_cpu_gemm_one_thread(g->trans_a, g->trans_b, end - first, g->n, g->k, g->alpha, a, g->lda, g->b, g->ldb,
                                g->beta, g->c + first * g->ldc, g->ldc);
    } else {
        /* 16 columns: whole tiles, and blocks of C that start on their own 64-byte line. */
        umt_cpu_part_range(g->n, 2 * GEMM_NR, part, parts, &first, &end);
        const float *b = g->trans_b ? g->b + first * g->ldb : g->b + first;
        umt_cpu_gemm_one_thread(g->trans_a, g->trans_b, g->m, end - first, g->k, g->alpha, g->a, g->lda, b, g->ldb,
                                g->beta, g->c + first, g->ldc);
    }
}

umt_status umt_cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    UMT_TRY(umt_gemm_check_arguments(trans_a, trans_b, m, n, k, lda, ldb, ldc));
    /* Each thread packs the whole of the operand it does not split: split the longer side of C. */
    gemm_job g = {.trans_a = trans_a, .trans_b = trans_b, .by_rows = m > n, .m = m, .n = n, .k = k, .lda = lda,
                  .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c};
    int64_t side = g.by_rows ? m / GEMM_MR : n / (2 * GEMM_NR), depth = k > 0 ? k : 1;
    int64_t work = n > 0 && m > INT64_MAX / n / depth ? INT64_MAX : m * n * depth; /* multiply-adds */
    int parts = umt_cpu_parts(side, 1), by_work = umt_cpu_parts(work, GEMM_MIN_PART);
    umt_cpu_parallel(parts < by_work ? parts : by_work, gemm_part, &g);
    return UMT_OK;
}
