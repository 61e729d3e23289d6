/* Attention of Q new queries over S keys (the cache plus the new entries), batch-invariant.
 *
 * out[b, i, h, :] = sum_j softmax_j(q[b,h,i] . k[b,g,j] * scale + mask[b,h,i,j]) v[b,g,j], with
 * g = h / (H / KVH) (grouped-query attention: several query heads share one key/value head).
 *
 * Why a kernel of our own: a library's attention computes the scores of all Q queries as one matrix
 * product, whose summation order (and so the last bits of every score) changes with Q. Here each
 * query is one independent task: its scores, its softmax and its weighted sum of values run in an
 * order fixed by j alone, and keys it may not see (mask -inf or the most negative float) get a
 * weight of exactly 0 (adding +0.0 leaves a float sum unchanged) and are skipped by the weighted
 * sum. A query's output is then bitwise the same whether it is scored alone, after a
 * chain of drafts, inside a tree, or beside other rows of a batch.
 *
 * mask: NULL means causal, query i seeing keys 0..i + diag: diag = S - Q puts the queries at the last
 * Q keys (a cache, then the new tokens: decoding, verifying), diag = 0 at the first Q (SDPA's
 * is_causal, which a StaticCache's prefill relies on: the keys after the prompt are empty slots),
 * diag >= S shows every key. Else an additive fp32 mask read through strides (a stride of 0
 * broadcasts), values <= -1e30 meaning "not visible"; diag is then unused.
 *
 * Keys and values are fp32 or bf16 (sd_attention_bf16kv: a bf16 model's cache, widened exactly as
 * it is read, so a bf16 cache is not copied to fp32 for every layer of every forward); the query,
 * the mask, the sums and the output are fp32. Threads as in linear.c (one task per query).
 *
 * Each task runs four steps, one function each, in the order of the formula: visible_keys (which
 * keys the query may see), scores (q . k for each of them), softmax_in_place (exponentials and
 * their sum) and weighted_sum (the values, weighted). The keys and values of a head are read once
 * per query, not once per forward: each query's task is independent, which is what keeps it
 * invariant, and at the contexts of a decode step they come from the caches, not from memory.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "lanes.h"
#include "threads.h"

extern const int64_t sd_serial_work;  /* linear.c: below this much work a kernel runs alone */
extern _Thread_local int sd_team;     /* linear.c: the threads of the caller's last kernel call */

/* exp on LANES lanes (Cephes' polynomial, about 1 ulp); every lane is computed the same way, so a
 * value's exponential does not depend on its neighbours. Inputs are <= 0 here. */
static inline lanes_f32 exp_lanes(lanes_f32 x) {
    const lanes_f32 lo = (lanes_f32){0} - 87.3f, hi = (lanes_f32){0} + 88.0f;
    lanes_i32 below = x < lo, above = x > hi;            /* clamp, lane by lane */
    x = (lanes_f32)(((lanes_i32)lo & below) | ((lanes_i32)x & ~below));
    x = (lanes_f32)(((lanes_i32)hi & above) | ((lanes_i32)x & ~above));
    lanes_f32 fx = x * 1.44269504088896341f + 0.5f;
    lanes_i32 ti = __builtin_convertvector(fx, lanes_i32);  /* truncation towards zero */
    lanes_f32 tf = __builtin_convertvector(ti, lanes_f32);
    lanes_i32 gt = tf > fx;                               /* floor for negative values */
    tf = tf - __builtin_convertvector(gt & 1, lanes_f32);
    ti = __builtin_convertvector(tf, lanes_i32);
    x = x - tf * 0.693359375f;
    x = x + tf * 2.12194440e-4f;
    lanes_f32 z = x * x;
    lanes_f32 y = 1.9875691500e-4f * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    lanes_i32 e = (ti + 127) << 23;
    lanes_f32 scale; memcpy(&scale, &e, sizeof scale);
    return y * scale;
}

/* LANES elements (or one) of a key or value tensor from index i on, as fp32: the same numbers
 * either way, so both variants agree. */
#define KV_LANES(p, i, bf16) ((bf16) ? widen_lanes((const uint16_t *)(p) + (i)) : load_lanes((const float *)(p) + (i)))
#define KV1(p, i, bf16) ((bf16) ? widen(((const uint16_t *)(p))[i]) : ((const float *)(p))[i])

typedef struct { int64_t B, H, KVH, Q, S, D, mb, mh, mi, diag; float scale; } dims_t;
#define INLINE static inline __attribute__((always_inline))  /* inlined with bf16 a constant */

/* 1. Visibility: seen[j] = 1 if the query may attend to key j (S rounded up to a multiple of LANES,
 * the padding not visible). Causal without a mask: keys 0 .. last; with a mask: entries above -1e30. Returns
 * whether any key is visible. */
INLINE int visible_keys(const float *mask_row, int64_t last, int64_t S, int64_t S_pad, unsigned char *seen) {
    int any = 0;
    for (int64_t j = 0; j < S_pad; j++) {
        int visible = j < S && (mask_row ? mask_row[j] > -1e30f : j <= last);
        seen[j] = (unsigned char)visible;
        any |= visible;
    }
    return any;
}

/* 2. Scores: score[j] = q . k_j * scale + mask[j] for every visible key (0 for the others), four
 * keys at a time as four independent chains; each key's own chain over d is the same whatever its
 * neighbours. A group of four keys none of which is visible is skipped (a static cache's empty
 * slots, a tree's other branches); a hidden key inside a group is computed and discarded. Returns
 * the largest score. */
INLINE float scores(const float *q, const void *k, int64_t head0, const float *mask_row, const unsigned char *seen,
                    int64_t S, int64_t S_pad, int64_t D, float scale, float *score, int bf16) {
    const int64_t DL = D - D % LANES;
    float largest = -INFINITY;
    for (int64_t j0 = 0; j0 < S_pad; j0 += 4) {
        if (!(seen[j0] | seen[j0 + 1] | seen[j0 + 2] | seen[j0 + 3])) {
            score[j0] = score[j0 + 1] = score[j0 + 2] = score[j0 + 3] = 0.0f;
            continue;
        }
        lanes_f32 partial[4] = {{0}, {0}, {0}, {0}};
        int64_t key_at[4];
        for (int u = 0; u < 4; u++) key_at[u] = head0 + (j0 + u < S ? j0 + u : 0) * D;
        for (int64_t d = 0; d < DL; d += LANES) {
            lanes_f32 qv = load_lanes(q + d);
            for (int u = 0; u < 4; u++) partial[u] = madd_lanes(qv, KV_LANES(k, key_at[u] + d, bf16), partial[u]);
        }
        for (int u = 0; u < 4; u++) {
            const int64_t j = j0 + u;
            if (!seen[j]) { score[j] = 0.0f; continue; }
            float dot = fold_register(partial[u]);
            for (int64_t d = DL; d < D; d++) dot = madd(q[d], KV1(k, key_at[u] + d, bf16), dot);
            score[j] = dot * scale + (mask_row ? mask_row[j] : 0.0f);
            if (score[j] > largest) largest = score[j];
        }
    }
    return largest;
}

/* 3. Softmax, in place: weight[j] = exp(score[j] - largest) for visible keys, 0 for the others, summed
 * in key order. Returns 1 / the sum (the normalisation is applied once, to the output). */
INLINE float softmax_in_place(float *weight, const unsigned char *seen, int64_t S_pad, float largest) {
    float sum = 0.0f;
    for (int64_t j = 0; j < S_pad; j += LANES) {
        lanes_f32 ex = exp_lanes(load_lanes(weight + j) - largest);
        for (int l = 0; l < LANES; l++) {
            float val = seen[j + l] ? ex[l] : 0.0f;
            weight[j + l] = val;
            sum += val;
        }
    }
    return 1.0f / sum;
}

/* 4. The weighted sum of values, keys in order: 8 vectors of output dimensions at a time held in
 * registers, then the last D mod LANES one by one. */
INLINE void weighted_sum(const void *v, int64_t head0, const float *weight, const unsigned char *seen,
                         int64_t S, int64_t D, float inv_sum, float *out, int bf16) {
    const int64_t DL = D - D % LANES;
    for (int64_t d0 = 0; d0 < DL; d0 += 8 * LANES) {
        const int nvec = (int)((DL - d0) / LANES < 8 ? (DL - d0) / LANES : 8);
        lanes_f32 acc[8] = {{0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
        for (int64_t j = 0; j < S; j++) {
            if (!seen[j]) continue;
            const int64_t value_at = head0 + j * D + d0;
            const lanes_f32 p = (lanes_f32){0} + weight[j];
            for (int u = 0; u < nvec; u++) acc[u] = madd_lanes(p, KV_LANES(v, value_at + LANES * u, bf16), acc[u]);
        }
        for (int u = 0; u < nvec; u++) store_lanes(out + d0 + LANES * u, acc[u] * inv_sum);
    }
    for (int64_t d = DL; d < D; d++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < S; j++) if (seen[j]) acc = madd(weight[j], KV1(v, head0 + j * D + d, bf16), acc);
        out[d] = acc * inv_sum;
    }
}

/* Task t (batch b, head h, query i), one after another in the four steps above. `weight` and `seen`
 * are the thread's scratch, S rounded up to a multiple of LANES long. A query that sees no key gets zeros. */
INLINE void attend(const float *q, const void *k, const void *v, const float *mask, float *out,
                   const dims_t *dm, int64_t t, float *weight, unsigned char *seen, int bf16) {
    const int64_t H = dm->H, Q = dm->Q, S = dm->S, D = dm->D, S_pad = (S + LANES - 1) / LANES * LANES;
    const int64_t b = t / (H * Q), h = (t / Q) % H, i = t % Q, g = h / (H / dm->KVH);
    const float *query = q + ((b * H + h) * Q + i) * D;
    const int64_t head0 = (b * dm->KVH + g) * S * D;  /* this head's keys and values start here */
    const float *mask_row = mask ? mask + b * dm->mb + h * dm->mh + i * dm->mi : NULL;
    float *o = out + ((b * Q + i) * H + h) * D;
    if (!visible_keys(mask_row, i + dm->diag, S, S_pad, seen)) { memset(o, 0, sizeof(float) * (size_t)D); return; }
    float largest = scores(query, k, head0, mask_row, seen, S, S_pad, D, dm->scale, weight, bf16);
    float inv_sum = softmax_in_place(weight, seen, S_pad, largest);
    weighted_sum(v, head0, weight, seen, S, D, inv_sum, o, bf16);
}

/* One exported variant per key/value type; the parallel region lives here (not in a shared helper)
 * so that each thread's loop calls attend() with bf16 a constant. Returns 0, or -1 if a thread's
 * scratch cannot be allocated. */
#define DEFINE_ATTENTION(NAME, KV_T, BF16)                                                                  \
int NAME(const float *q, const KV_T *k, const KV_T *v, const float *mask, float *out,                       \
         int64_t B, int64_t H, int64_t KVH, int64_t Q, int64_t S, int64_t D,                                \
         int64_t mb, int64_t mh, int64_t mi, int64_t diag, float scale, int nthreads) {                     \
    const dims_t dm = {B, H, KVH, Q, S, D, mb, mh, mi, diag, scale};                                        \
    const int64_t tasks = B * H * Q, S_pad = (S + LANES - 1) / LANES * LANES;                               \
    const int parallel = nthreads > 1 && tasks * S * D >= sd_serial_work;                                   \
    int failed = 0;                                                                                         \
    sd_team = 1; (void)parallel;                                                                            \
    OMP(omp parallel if(parallel) num_threads(nthreads))                                                    \
    {                                                                                                       \
        NOTE_TEAM();                                                                                        \
        float *weight = malloc(sizeof(float) * (size_t)(S_pad > 0 ? S_pad : 8));                            \
        unsigned char *seen = malloc((size_t)(S_pad > 0 ? S_pad : 8));                                      \
        if (!weight || !seen) {                                                                             \
            OMP(omp atomic write)                                                                           \
            failed = 1;                                                                                     \
        }                                                                                                   \
        OMP(omp for schedule(static))                                                                       \
        for (int64_t t = 0; t < tasks; t++)                                                                 \
            if (weight && seen) attend(q, k, v, mask, out, &dm, t, weight, seen, BF16);                     \
        free(weight); free(seen);                                                                           \
    }                                                                                                       \
    return failed ? -1 : 0;                                                                                 \
}

DEFINE_ATTENTION(sd_attention_f32, float, 0)
DEFINE_ATTENTION(sd_attention_bf16kv, uint16_t, 1)
