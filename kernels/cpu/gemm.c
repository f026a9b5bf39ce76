/*
 * kernels/cpu/gemm.c — single-precision matrix product on one core, row-major.
 *
 *     C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
 *
 * lda, ldb and ldc are row strides in elements. op(X) is X or X transposed, so a [k,m] A with
 * trans_a reads as [m,k].
 *
 * How it is made fast without intrinsics: C is first scaled by beta once, then the product is
 * added panel by panel. A KC x NC panel of op(B) is copied (packed) into a contiguous row-major
 * buffer, whatever the transposes, so that the innermost loop always walks contiguous j in
 * both the packed panel and a row of C: a plain `c[j] += a * b[j]` that the compiler turns
 * into vector code. Rows of A are taken four at a time, so each packed B row loaded from
 * cache feeds four rows of C.
 */
#include <stddef.h>
#include <string.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

/*
 * Panel sizes. The packed panel holds KC * NC floats = 128 KiB, which sits in L2 on any
 * current x86 or ARM core and is small enough for the stack. NC = 256 keeps four rows of C
 * being updated (4 KiB) in L1 next to the streamed B row; KC = 128 amortises the packing of
 * each panel over all m rows of A, and is the depth of one pass over the C rows. GEMM_CHUNK
 * (see axpy_4_rows) is 16 columns: four SSE vectors, two AVX ones.
 */
enum { GEMM_KC = 128, GEMM_NC = 256, GEMM_ROWS = 4, GEMM_CHUNK = 16 };

/* Element (row, col) of op(X), where X is stored row-major with row stride ld. */
static inline float op_at(const float *x, int64_t ld, bool trans, int64_t row, int64_t col) {
    return trans ? x[col * ld + row] : x[row * ld + col];
}

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

/* packed[p, j] = op(B)[p0 + p, j0 + j] for p < kb, j < nb: a contiguous row-major [kb, nb] copy. */
static void pack_b(const float *b, int64_t ldb, bool trans_b, int64_t p0, int64_t j0, int64_t kb, int64_t nb,
                   float *packed) {
    if (!trans_b) {
        for (int64_t p = 0; p < kb; p++) memcpy(packed + p * nb, b + (p0 + p) * ldb + j0, (size_t)nb * sizeof *b);
        return;
    }
    /* op(B)[p, j] = B[j, p]: read B along its rows (contiguous p), write the panel strided. */
    for (int64_t j = 0; j < nb; j++) {
        const float *src = b + (j0 + j) * ldb + p0;
        for (int64_t p = 0; p < kb; p++) packed[p * nb + j] = src[p];
    }
}

/* Four rows of C += a_r * one packed B row, over n columns. restrict tells the compiler the rows
 * never overlap, so it needs no run-time overlap checks. */
static inline void axpy_4_rows_n(int64_t n, const float *restrict b, float a0, float a1, float a2, float a3,
                                 float *restrict c0, float *restrict c1, float *restrict c2, float *restrict c3) {
    for (int64_t j = 0; j < n; j++) {
        float bj = b[j];
        c0[j] += a0 * bj;
        c1[j] += a1 * bj;
        c2[j] += a2 * bj;
        c3[j] += a3 * bj;
    }
}

/* GCC's -O2 vectoriser only takes loops whose trip count it knows to be a multiple of the vector
 * width (no scalar epilogue), so the row is walked in chunks of a constant GEMM_CHUNK columns
 * (vector code, several times the plain loop's speed: docs/PERF.md, "CPU GEMM") and the last
 * n % GEMM_CHUNK columns one by one. */
static void axpy_4_rows(int64_t n, const float *b, float a0, float a1, float a2, float a3, float *c0, float *c1,
                        float *c2, float *c3) {
    int64_t j = 0;
    for (; j + GEMM_CHUNK <= n; j += GEMM_CHUNK) {
        axpy_4_rows_n(GEMM_CHUNK, b + j, a0, a1, a2, a3, c0 + j, c1 + j, c2 + j, c3 + j);
    }
    axpy_4_rows_n(n - j, b + j, a0, a1, a2, a3, c0 + j, c1 + j, c2 + j, c3 + j);
}

static inline void axpy_1_row_n(int64_t n, const float *restrict b, float a, float *restrict c) {
    for (int64_t j = 0; j < n; j++) c[j] += a * b[j];
}

static void axpy_1_row(int64_t n, const float *b, float a, float *c) {
    int64_t j = 0;
    for (; j + GEMM_CHUNK <= n; j += GEMM_CHUNK) axpy_1_row_n(GEMM_CHUNK, b + j, a, c + j);
    axpy_1_row_n(n - j, b + j, a, c + j);
}

/* C[0:m, 0:nb] += alpha * op(A)[0:m, p0:p0+kb] * packed, where c points at the panel's first column. */
static void multiply_panel(const float *a, int64_t lda, bool trans_a, int64_t m, int64_t p0, int64_t kb, float alpha,
                           const float *packed, int64_t nb, float *c, int64_t ldc) {
    int64_t i = 0;
    for (; i + GEMM_ROWS <= m; i += GEMM_ROWS) {
        float *c0 = c + i * ldc;
        for (int64_t p = 0; p < kb; p++) {
            axpy_4_rows(nb, packed + p * nb, alpha * op_at(a, lda, trans_a, i, p0 + p),
                        alpha * op_at(a, lda, trans_a, i + 1, p0 + p), alpha * op_at(a, lda, trans_a, i + 2, p0 + p),
                        alpha * op_at(a, lda, trans_a, i + 3, p0 + p), c0, c0 + ldc, c0 + 2 * ldc, c0 + 3 * ldc);
        }
    }
    for (; i < m; i++) {
        for (int64_t p = 0; p < kb; p++) {
            axpy_1_row(nb, packed + p * nb, alpha * op_at(a, lda, trans_a, i, p0 + p), c + i * ldc);
        }
    }
}

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

umt_status umt_cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    UMT_TRY(umt_gemm_check_arguments(trans_a, trans_b, m, n, k, lda, ldb, ldc));
    scale_c(c, ldc, m, n, beta);
    /* As in BLAS, alpha = 0 means A and B are not read (NaNs in them do not reach C). */
    if (alpha == 0.0f || m == 0) return UMT_OK;

    float packed[GEMM_KC * GEMM_NC];
    for (int64_t j0 = 0; j0 < n; j0 += GEMM_NC) {
        int64_t nb = n - j0 < GEMM_NC ? n - j0 : GEMM_NC;
        for (int64_t p0 = 0; p0 < k; p0 += GEMM_KC) {
            int64_t kb = k - p0 < GEMM_KC ? k - p0 : GEMM_KC;
            pack_b(b, ldb, trans_b, p0, j0, kb, nb, packed);
            multiply_panel(a, lda, trans_a, m, p0, kb, alpha, packed, nb, c + j0, ldc);
        }
    }
    return UMT_OK;
}
