/* y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]): the matrix products of a decode step.
 *
 * Why a kernel of our own. At decode time M, the number of tokens scored in one forward, is 1 to
 * about 16, so the product is bound by streaming the weights from memory, not by arithmetic. A BLAS
 * tuned for large matrices reads the weights at a fraction of the memory bandwidth for one row and
 * takes another code path for two, and its summation order changes with M. This file gives each
 * output one summation order that nothing can change, and then computes the same sums fast.
 *
 * Read it in three parts:
 *   1. the arithmetic: vectors of LANES floats, the one multiply-add, the fold of the lanes;
 *   2. the definition: dot_row(), the plain loop whose order defines every output, and
 *      sd_linear_reference_*, the product written with it (slow; the tests compare against it);
 *   3. the fast version: a tile of weight rows is read from memory once and used for every token
 *      row while it sits in the L1 cache (the idea of llama.cpp's ggml mul_mat), token rows go in
 *      blocks whose partial sums stay in registers, and the next tile is prefetched. None of that
 *      changes any output's order, so sd_linear_* equal sd_linear_reference_* bit for bit, and a
 *      position's logits do not depend on how many tokens share its forward (batch invariance).
 *
 * Weights are fp32 or bf16. A bf16 number is the upper 16 bits of an fp32 one, so widening it is an
 * exact 16-bit shift: the bf16 product is exactly the fp32 product of the widened weights. bf16 halves
 * the bytes streamed from memory; the kernel's activations and sums are fp32 (a bf16 model's
 * activations are widened exactly on the way in, and backend.py rounds each output back to bf16).
 *
 * Threads: OpenMP splits the weight rows between threads, where the compiler has it; without it
 * (clang without libomp, as on macOS) the same code runs on one thread with the same results. A
 * product smaller than sd_serial_work multiply-adds runs on the calling thread alone: waking a team
 * costs more than it saves there (an 8 x 8 product took 13 us on two threads, 1 us alone).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "lanes.h"
#include "threads.h"

const int64_t sd_serial_work = (int64_t)1 << 16;  /* multiply-adds below which a kernel runs alone */
_Thread_local int sd_team;  /* the threads the calling thread's last kernel call ran on (for tests) */
int sd_last_team(void) { return sd_team; }
#ifdef _OPENMP
int sd_has_openmp(void) { return 1; }
#else
int sd_has_openmp(void) { return 0; }
#endif

/* ------------------------------------------------------------------------------------------------
 * 1. The arithmetic
 * ------------------------------------------------------------------------------------------------ */

/* In lanes.h: LANES (16 with AVX-512, else 8), the vector type lanes_f32, madd / madd_lanes (a fused
 * multiply-add where the CPU has one, else a multiply then an add: the same in both forms), widen /
 * widen_lanes (bf16 -> fp32, exact), and fold_lanes / fold_register (the lanes summed by one fixed
 * pairwise tree: a[i] + a[i + half], halving). */

/* ------------------------------------------------------------------------------------------------
 * 2. The definition
 * ------------------------------------------------------------------------------------------------ */

/* One output: sum over k of w[k] * x[k], in exactly this order. Lane l sums k = l, l + LANES,
 * l + 2 LANES, ... (one multiply-add after another); the lanes are folded; the last K mod LANES
 * products are added one at a time. The caller adds the bias after that. */
static float dot_row(const float *x, const float *w, int64_t K) {
    float lane[LANES] = {0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = madd(w[k + l], x[k + l], lane[l]);
    float sum = fold_lanes(lane);
    for (; k < K; k++) sum = madd(w[k], x[k], sum);
    return sum;
}

/* The whole product written with dot_row, one output after another: the meaning of the fast version.
 * Returns 0, or -1 if the scratch row for bf16 weights cannot be allocated. */
int sd_linear_reference_f32(const float *x, const float *w, const float *bias, float *y, int64_t M,
                            int64_t N, int64_t K, int64_t ldx, int64_t ldy) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float sum = dot_row(x + m * ldx, w + n * K, K);
            y[m * ldy + n] = bias ? sum + bias[n] : sum;
        }
    return 0;
}

int sd_linear_reference_bf16w(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M,
                              int64_t N, int64_t K, int64_t ldx, int64_t ldy) {
    float *row = malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
    if (!row) return -1;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) row[k] = widen(w[n * K + k]);
        for (int64_t m = 0; m < M; m++) {
            float sum = dot_row(x + m * ldx, row, K);
            y[m * ldy + n] = bias ? sum + bias[n] : sum;
        }
    }
    free(row);
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * 3. The fast version: the same sums, with each weight read from memory once
 * ------------------------------------------------------------------------------------------------ */

enum {
    TILE_ROWS = 4,      /* weight rows whose products run together: each loaded vector of a row is
                         * used by every token row of the block before the next is loaded */
    PREFETCH_TILES = 2  /* fetch the weights this many tiles ahead while a tile is used: eight rows
                         * in flight stream faster than four */
};

/* Token rows per block: the block's TILE_ROWS x BLOCK_MAX partial sums, the tile's TILE_ROWS weight
 * vectors and one token vector must all stay in registers. Speed only: every output's order is the
 * same in every block size. */
#ifndef BLOCK_MAX
#if defined(__AVX512F__)
#define BLOCK_MAX 6   /* 32 registers: 24 partial sums + 4 weight vectors + 1 token vector */
#elif defined(__aarch64__)
#define BLOCK_MAX 2   /* NEON: 32 registers of 4 floats, two per 8-lane vector, and no memory operand
                       * for the token vector: 8 sums + 4 weights + 1 token = 13 vectors in 26
                       * registers (3 rows would need 34 and spill); the extra pass over the token
                       * rows re-reads the tile from L1, not from memory */
#else
#define BLOCK_MAX 3   /* AVX2: 16 registers: 12 partial sums + 4 weight vectors (the token vector is
                       * an FMA's memory operand) */
#endif
#endif

#define INLINE static inline __attribute__((always_inline))  /* with `block` and `bf16` constants */

/* A tile's weight rows (a short last tile repeats its row 0: computed, never stored), and the rows
 * PREFETCH_TILES tiles ahead, fetched from memory while this tile is used. */
typedef struct {
    const void *rows[TILE_ROWS];
    const void *ahead[TILE_ROWS];
} tile_t;

/* LANES weights of a row from k on (or one weight), as fp32: loaded, or loaded and widened. */
INLINE lanes_f32 weight_lanes(const void *row, int64_t k, int bf16) {
    return bf16 ? widen_lanes((const uint16_t *)row + k) : load_lanes((const float *)row + k);
}
INLINE float weight_one(const void *row, int64_t k, int bf16) {
    return bf16 ? widen(((const uint16_t *)row)[k]) : ((const float *)row)[k];
}

/* One block: `block` token rows against the TILE_ROWS rows of one tile. Writes the outputs of the
 * first `used` weight rows. With `first`, it also prefetches the tile ahead. */
INLINE void dot_block(const float *x, int64_t ldx, const int block, const tile_t *tile, int bf16, int first,
                      int used, int64_t K, const float *bias, int64_t n0, float *y, int64_t ldy) {
    const size_t weight_bytes = bf16 ? 2 : 4;
    lanes_f32 partial[BLOCK_MAX][TILE_ROWS];
    for (int t = 0; t < block; t++)
        for (int r = 0; r < TILE_ROWS; r++) partial[t][r] = (lanes_f32){0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        if (first)
            for (int r = 0; r < TILE_ROWS; r++)
                __builtin_prefetch((const char *)tile->ahead[r] + (size_t)k * weight_bytes, 0, 3);
        lanes_f32 weights[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) weights[r] = weight_lanes(tile->rows[r], k, bf16);
        for (int t = 0; t < block; t++) {
            lanes_f32 token = load_lanes(x + t * ldx + k);
            for (int r = 0; r < TILE_ROWS; r++) partial[t][r] = madd_lanes(weights[r], token, partial[t][r]);
        }
    }
    const int64_t tail = k;
    for (int t = 0; t < block; t++) {
        const float *token = x + t * ldx;
        for (int r = 0; r < used; r++) {
            float sum = fold_register(partial[t][r]);
            for (k = tail; k < K; k++) sum = madd(weight_one(tile->rows[r], k, bf16), token[k], sum);
            y[t * ldy + n0 + r] = bias ? sum + bias[n0 + r] : sum;
        }
    }
}

/* One tile against all M token rows, in blocks of BLOCK_MAX token rows and a last block of the rest
 * (each block size its own compiled code, so that its partial sums are registers). The first block
 * reads the tile from memory and prefetches the one ahead; the later blocks find the tile in L1.
 * bf16 rows are widened again by every block: two instructions per LANES weights, cheaper here than
 * storing a widened copy and loading it back (measured: 16 token rows of the 49152 x 576 output
 * layer took 3.5 ms widening in every block, 4.9 ms with a widened copy). */
INLINE void tile_times_tokens(const float *x, int64_t ldx, int64_t M, const tile_t *tile, int bf16, int used,
                              int64_t K, const float *bias, int64_t n0, float *y, int64_t ldy) {
    for (int64_t m = 0; m < M; m += BLOCK_MAX) {
        const int first = m == 0, size = (int)(M - m < BLOCK_MAX ? M - m : BLOCK_MAX);
        const float *xm = x + m * ldx;
        float *ym = y + m * ldy;
#define BLOCK(SIZE)                                                                                      \
        case SIZE:                                                                                       \
            if (first) dot_block(xm, ldx, SIZE, tile, bf16, 1, used, K, bias, n0, ym, ldy);              \
            else dot_block(xm, ldx, SIZE, tile, bf16, 0, used, K, bias, n0, ym, ldy);                    \
            break;
        switch (size) {
            BLOCK(1) BLOCK(2) BLOCK(3)
#if BLOCK_MAX >= 4
            BLOCK(4)
#endif
#if BLOCK_MAX >= 5
            BLOCK(5)
#endif
#if BLOCK_MAX >= 6
            BLOCK(6)
#endif
        }
#undef BLOCK
    }
}

/* The first row of tile number `t` (clamped to the last tile, so a prefetch never leaves w). */
static inline int64_t tile_start(int64_t t, int64_t tiles) { return (t < tiles ? t : tiles - 1) * TILE_ROWS; }

/* The product, tile after tile, the tiles split between threads. */
INLINE void linear_tiled(const float *x, const void *w, int bf16, const float *bias, float *y, int64_t M,
                         int64_t N, int64_t K, int64_t ldx, int64_t ldy, int nthreads) {
    const int64_t tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
    const size_t row_bytes = (size_t)K * (bf16 ? 2 : 4);
    const int parallel = nthreads > 1 && M * N * K >= sd_serial_work;
    sd_team = 1; (void)parallel;
    OMP(omp parallel if(parallel) num_threads(nthreads))
    {
        NOTE_TEAM();
        OMP(omp for schedule(static))
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t n0 = t * TILE_ROWS, next = tile_start(t + PREFETCH_TILES, tiles);
            const int used = (int)(N - n0 < TILE_ROWS ? N - n0 : TILE_ROWS);
            tile_t tile;
            for (int r = 0; r < TILE_ROWS; r++) {
                tile.rows[r] = (const char *)w + (size_t)(n0 + (r < used ? r : 0)) * row_bytes;
                tile.ahead[r] = (const char *)w + (size_t)(next + (next + r < N ? r : 0)) * row_bytes;
            }
            tile_times_tokens(x, ldx, M, &tile, bf16, used, K, bias, n0, y, ldy);
        }
    }
}

/* Return 0 (the signature every kernel shares: a non-zero result is an error the caller raises). */
int sd_linear_f32(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N,
                  int64_t K, int64_t ldx, int64_t ldy, int nthreads) {
    linear_tiled(x, w, 0, bias, y, M, N, K, ldx, ldy, nthreads);
    return 0;
}

int sd_linear_bf16w(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                    int64_t K, int64_t ldx, int64_t ldy, int nthreads) {
    linear_tiled(x, w, 1, bias, y, M, N, K, ldx, ldy, nthreads);
    return 0;
}

int sd_kernel_version(void) { return 3; }
