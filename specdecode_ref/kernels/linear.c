/* y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]): a batched matrix-vector product for the decode step.
 *
 * Why a kernel of our own: at decode time M (the tokens scored in one forward) is 1 to ~16, so the
 * product is bound by streaming the weights from memory, not by arithmetic. A BLAS tuned for large
 * matrices reads the weights at a fraction of the memory bandwidth for one row, and takes another
 * code path (twice the cost here) for two. This kernel reads a tile of R weight rows once and dots
 * it with every token row while it sits in the L1 cache (the approach of llama.cpp's ggml mul_mat),
 * so scoring 2..8 tokens costs little more than scoring one.
 *
 * Batch invariance by construction: every output y[m, n] is one fixed chain of fused multiply-adds
 * over k = 0, 8, 16, ... into one 8-lane accumulator, then a fixed-order horizontal sum, then the
 * scalar tail, then the bias. Neither M, nor which other rows share the tile, nor how the N range is
 * split between threads changes that order, so a position's logits do not depend on how many tokens
 * share its forward.
 *
 * Weights are fp32 or bf16 (the upper 16 bits of an fp32; widened exactly by a 16-bit shift);
 * activations and accumulation are fp32 either way.
 *
 * Threads: OpenMP splits the N range, where the compiler has it; without it (clang without libomp,
 * as on macOS) the same code builds single-threaded, with the same results. A product smaller than
 * sd_serial_work multiply-adds runs on the calling thread alone: waking a team costs more than
 * it saves there (an 8 x 8 product took 13 us on two threads, 1 us alone). Neither changes any
 * output's summation order, so the result is bitwise the same on any number of threads.
 */
#include <stdint.h>
#include <string.h>
#include "threads.h"

const int64_t sd_serial_work = (int64_t)1 << 16;  /* multiply-adds below which a kernel runs alone */
_Thread_local int sd_team;  /* the threads the calling thread's last kernel call ran on (for tests) */
int sd_last_team(void) { return sd_team; }
#ifdef _OPENMP
int sd_has_openmp(void) { return 1; }
#else
int sd_has_openmp(void) { return 0; }
#endif

#define R 4   /* weight rows per tile */

typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

static inline v8f load_f32(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline v8f load_bf16(const uint16_t *p) {
    v8h h; memcpy(&h, p, sizeof h);
    v8u u = __builtin_convertvector(h, v8u) << 16;
    v8f v; memcpy(&v, &u, sizeof v); return v;
}
static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
static inline v8f fma8(v8f a, v8f b, v8f c) { return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
/* Compiled with -ffp-contract=off: a multiply then an add, the same in every code path. */
static inline v8f fma8(v8f a, v8f b, v8f c) { return a * b + c; }
#endif
static inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

static inline float hsum(v8f a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* A block of MT token rows against one tile of R weight rows: R * MT accumulators, each a single
 * chain over k. PF: fetch the next tile into L1 meanwhile (only on the first block of the tile). */
#define DEFINE_BLOCK(NAME, MT, W_T, W_LOAD, W_SCALAR)                                                     \
static inline void NAME(const float *x, const W_T *const *wr, const W_T *wnext, int pf,                   \
                        const float *bias, float *y, int64_t K, int64_t ldx, int64_t ldy, int64_t n0,      \
                        int rows) {                                                                        \
    const int64_t K8 = K & ~(int64_t)7;                                                                    \
    v8f acc[MT][R];                                                                                        \
    for (int j = 0; j < MT; j++) for (int r = 0; r < R; r++) acc[j][r] = (v8f){0};                          \
    for (int64_t k = 0; k < K8; k += 8) {                                                                  \
        if (pf) for (int r = 0; r < R; r++) __builtin_prefetch(wnext + r * K + k, 0, 3);                   \
        v8f wv[R];                                                                                         \
        for (int r = 0; r < R; r++) wv[r] = W_LOAD(wr[r] + k);                                             \
        for (int j = 0; j < MT; j++) {                                                                     \
            v8f xv = load_f32(x + j * ldx + k);                                                            \
            for (int r = 0; r < R; r++) acc[j][r] = fma8(wv[r], xv, acc[j][r]);                            \
        }                                                                                                  \
    }                                                                                                      \
    for (int j = 0; j < MT; j++) {                                                                         \
        const float *xj = x + j * ldx;                                                                     \
        for (int r = 0; r < rows; r++) {                                                                   \
            float s = hsum(acc[j][r]);                                                                     \
            for (int64_t k = K8; k < K; k++) s = fma1(W_SCALAR(wr[r][k]), xj[k], s);                       \
            if (bias) s += bias[n0 + r];                                                                   \
            y[j * ldy + n0 + r] = s;                                                                       \
        }                                                                                                  \
    }                                                                                                      \
}

/* One tile: rows [n0, n0 + rows) of w (up to 2 * R) against all M token rows, as two halves of R
 * rows; each half runs MT_MAX token rows at a time, then 2, then 1. The per-output chain is the same
 * in every block size, which is what makes the result M-invariant. While a half's first block runs,
 * the matching half of the next tile is fetched (eight rows in flight stream faster than four). */
#define DEFINE_TILE(NAME, W_T, B_MAX, B2, B1)                                                              \
static void NAME(const float *x, const W_T *w, const float *bias, float *y, int64_t M, int64_t N,          \
                 int64_t K, int64_t ldx, int64_t ldy, int64_t n0, int rows) {                              \
    for (int half = 0; half * R < rows; half++) {                                                          \
        const int64_t h0 = n0 + half * R;                                                                  \
        const int hrows = rows - half * R < R ? rows - half * R : R;                                       \
        const W_T *wr[R];                                                                                  \
        for (int r = 0; r < R; r++) wr[r] = w + (h0 + (r < hrows ? r : 0)) * K;                            \
        const W_T *wnext = w + (h0 + 2 * R + R <= N ? h0 + 2 * R : h0) * K;                                \
        int64_t m = 0;                                                                                     \
        for (; m + MT_MAX <= M; m += MT_MAX) B_MAX(x + m * ldx, wr, wnext, m == 0, bias, y + m * ldy, K, ldx, ldy, h0, hrows); \
        for (; m + 2 <= M; m += 2) B2(x + m * ldx, wr, wnext, m == 0, bias, y + m * ldy, K, ldx, ldy, h0, hrows); \
        for (; m < M; m++) B1(x + m * ldx, wr, wnext, m == 0, bias, y + m * ldy, K, ldx, ldy, h0, hrows);  \
    }                                                                                                      \
}

/* Token rows per block, sized so that R * MT accumulators, R weight vectors and a token vector stay
 * in registers (a v8f is one 256-bit register on x86). The choice changes speed only: every output's
 * chain is the same in every block size. */
#ifndef MT_MAX
#if defined(__AVX512F__)
#define MT_MAX 4   /* 32 registers: 16 accumulators + 4 weight vectors + 1 token vector */
#elif defined(__aarch64__)
#define MT_MAX 2   /* NEON: 32 registers of 4 floats, two per v8f, and no memory operand for the token
                    * vector: 8 accumulators + 4 weights + 1 token = 13 v8f in 26 registers (3 rows
                    * would need 34 and spill); the extra pass re-reads the tile from L1, not memory */
#else
#define MT_MAX 3   /* AVX2: 16 registers: 12 accumulators + 4 weight vectors (the token vector is an
                    * FMA's memory operand) */
#endif
#endif

#define IDENT(v) (v)
DEFINE_BLOCK(block_f32_max, MT_MAX, float, load_f32, IDENT)
DEFINE_BLOCK(block_f32_2, 2, float, load_f32, IDENT)
DEFINE_BLOCK(block_f32_1, 1, float, load_f32, IDENT)
DEFINE_BLOCK(block_bf16_max, MT_MAX, uint16_t, load_bf16, bf16_to_f32)
DEFINE_BLOCK(block_bf16_2, 2, uint16_t, load_bf16, bf16_to_f32)
DEFINE_BLOCK(block_bf16_1, 1, uint16_t, load_bf16, bf16_to_f32)
DEFINE_TILE(tile_f32, float, block_f32_max, block_f32_2, block_f32_1)
DEFINE_TILE(tile_bf16, uint16_t, block_bf16_max, block_bf16_2, block_bf16_1)

#define DEFINE_ENTRY(NAME, TILE, W_T)                                                                      \
void NAME(const float *x, const W_T *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,      \
          int64_t ldx, int64_t ldy, int nthreads) {                                                        \
    const int64_t tiles = (N + 2 * R - 1) / (2 * R);                                                       \
    const int parallel = nthreads > 1 && M * N * K >= sd_serial_work;                                     \
    sd_team = 1; (void)parallel;                                                                           \
    OMP(omp parallel if(parallel) num_threads(nthreads))                                                   \
    {                                                                                                      \
        NOTE_TEAM();                                                                                       \
        OMP(omp for schedule(static))                                                                      \
        for (int64_t t = 0; t < tiles; t++) {                                                              \
            int64_t n0 = t * 2 * R;                                                                        \
            int rows = (int)(N - n0 < 2 * R ? N - n0 : 2 * R);                                             \
            TILE(x, w, bias, y, M, N, K, ldx, ldy, n0, rows);                                              \
        }                                                                                                  \
    }                                                                                                      \
}

DEFINE_ENTRY(sd_linear_f32, tile_f32, float)
DEFINE_ENTRY(sd_linear_bf16w, tile_bf16, uint16_t)

int sd_kernel_version(void) { return 2; }
