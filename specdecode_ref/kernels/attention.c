/* Attention of Q new queries over S keys (the cache plus the new entries), batch-invariant.
 *
 * out[b, i, h, :] = sum_j softmax_j(q[b,h,i] . k[b,g,j] * scale + mask[b,h,i,j]) v[b,g,j], with
 * g = h / (H / KVH) (grouped-query attention: several query heads share one key/value head).
 *
 * Why a kernel of our own: a library's attention computes the scores of all Q queries as one matrix
 * product, whose summation order (and so the last bits of every score) changes with Q. Here each
 * query is one independent task: its scores, its softmax and its weighted sum of values run in an
 * order fixed by j alone, and keys it may not see (mask -inf or the most negative float) are
 * skipped outright. A query's output is then bitwise the same whether it is scored alone, after a
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
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "threads.h"

extern const int64_t sd_serial_work;  /* linear.c: below this much work a kernel runs alone */
extern _Thread_local int sd_team;     /* linear.c: the threads of the caller's last kernel call */

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline float hsum(v8f a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* exp on 8 lanes (Cephes' polynomial, about 1 ulp); every lane is computed the same way, so a
 * value's exponential does not depend on its neighbours. Inputs are <= 0 here. */
static inline v8f exp8(v8f x) {
    const v8f lo = (v8f){0} - 87.3f, hi = (v8f){0} + 88.0f;
    v8i below = x < lo, above = x > hi;                  /* clamp, lane by lane */
    x = (v8f)(((v8i)lo & below) | ((v8i)x & ~below));
    x = (v8f)(((v8i)hi & above) | ((v8i)x & ~above));
    v8f fx = x * 1.44269504088896341f + 0.5f;
    v8i ti = __builtin_convertvector(fx, v8i);          /* truncation towards zero */
    v8f tf = __builtin_convertvector(ti, v8f);
    v8i gt = tf > fx;                                    /* floor for negative values */
    tf = tf - (v8f)(__builtin_convertvector(gt & 1, v8f));
    ti = __builtin_convertvector(tf, v8i);
    x = x - tf * 0.693359375f;
    x = x + tf * 2.12194440e-4f;
    v8f z = x * x;
    v8f y = 1.9875691500e-4f * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    v8i e = (ti + 127) << 23;
    v8f scale; memcpy(&scale, &e, sizeof scale);
    return y * scale;
}

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

static inline v8f widen8(const uint16_t *p) {
    v8h h; memcpy(&h, p, sizeof h);
    v8u u = __builtin_convertvector(h, v8u) << 16;
    v8f f; memcpy(&f, &u, sizeof f); return f;
}
static inline float widen1(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* Element i of a key or value tensor as fp32: the same number either way, so both variants agree. */
#define KV8(p, i, bf16) ((bf16) ? widen8((const uint16_t *)(p) + (i)) : load8((const float *)(p) + (i)))
#define KV1(p, i, bf16) ((bf16) ? widen1(((const uint16_t *)(p))[i]) : ((const float *)(p))[i])

typedef struct { int64_t B, H, KVH, Q, S, D, mb, mh, mi, diag; float scale; } dims_t;

/* Task t (batch b, head h, query i): e and seen are the thread's scratch, S rounded up to 8 long.
 * Inlined into each variant with bf16 a constant, so neither pays for the other's loads. */
static inline __attribute__((always_inline)) void attend(const float *q, const void *k, const void *v,
                                                          const float *mask, float *out, const dims_t *dm,
                                                          int64_t t, float *e, unsigned char *seen, int bf16) {
    const int64_t H = dm->H, Q = dm->Q, S = dm->S, D = dm->D;
    const int64_t D8 = D & ~(int64_t)7, S8 = (S + 7) & ~(int64_t)7;
    const int64_t b = t / (H * Q), h = (t / Q) % H, i = t % Q, g = h / (H / dm->KVH);
    const float *qi = q + ((b * H + h) * Q + i) * D;
    const int64_t kv0 = (b * dm->KVH + g) * S * D;  /* this head's keys and values start here */
    const float *mrow = mask ? mask + b * dm->mb + h * dm->mh + i * dm->mi : NULL;
    const int64_t last = i + dm->diag;  /* causal: the last visible key */
    float mx = -INFINITY;
    int any = 0;
    for (int64_t j = 0; j < S8; j++) {
        int vis = j < S && (mrow ? mrow[j] > -1e30f : j <= last);
        seen[j] = (unsigned char)vis;
        any |= vis;
    }
    float *o = out + ((b * Q + i) * H + h) * D;
    if (!any) { memset(o, 0, sizeof(float) * (size_t)D); return; }
    /* scores, four keys at a time (four independent chains; each key's own chain over d is the same
     * whatever its neighbours) */
    for (int64_t j0 = 0; j0 < S8; j0 += 4) {
        v8f a[4] = {{0}, {0}, {0}, {0}};
        int64_t kj[4];
        for (int u = 0; u < 4; u++) kj[u] = kv0 + (j0 + u < S ? j0 + u : 0) * D;
        for (int64_t d = 0; d < D8; d += 8) {
            v8f qv = load8(qi + d);
            for (int u = 0; u < 4; u++) a[u] += qv * KV8(k, kj[u] + d, bf16);
        }
        for (int u = 0; u < 4; u++) {
            int64_t j = j0 + u;
            if (!seen[j]) { e[j] = 0.0f; continue; }
            float sc = hsum(a[u]);
            for (int64_t d = D8; d < D; d++) sc += qi[d] * KV1(k, kj[u] + d, bf16);
            sc = sc * dm->scale + (mrow ? mrow[j] : 0.0f);
            e[j] = sc;
            if (sc > mx) mx = sc;
        }
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < S8; j += 8) {
        v8f x = load8(e + j) - mx, ex = exp8(x);
        for (int l = 0; l < 8; l++) { float val = seen[j + l] ? ex[l] : 0.0f; e[j + l] = val; sum += val; }
    }
    const float inv = 1.0f / sum;
    /* the weighted sum of values, 64 dimensions at a time held in registers, keys in order */
    for (int64_t d0 = 0; d0 < D8; d0 += 64) {
        const int nv = (int)((D8 - d0) / 8 < 8 ? (D8 - d0) / 8 : 8);
        v8f r[8] = {{0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
        for (int64_t j = 0; j < S; j++) {
            if (!seen[j]) continue;
            const int64_t vj = kv0 + j * D + d0;
            const v8f p = (v8f){0} + e[j];
            for (int u = 0; u < nv; u++) r[u] += p * KV8(v, vj + 8 * u, bf16);
        }
        for (int u = 0; u < nv; u++) store8(o + d0 + 8 * u, r[u] * inv);
    }
    for (int64_t d = D8; d < D; d++) {
        float r = 0.0f;
        for (int64_t j = 0; j < S; j++) if (seen[j]) r += e[j] * KV1(v, kv0 + j * D + d, bf16);
        o[d] = r * inv;
    }
}

/* One exported variant per key/value type; the parallel region lives here (not in a shared helper)
 * so that each thread's loop calls attend() with bf16 a constant. */
#define DEFINE_ATTENTION(NAME, KV_T, BF16)                                                                 \
void NAME(const float *q, const KV_T *k, const KV_T *v, const float *mask, float *out,                   \
          int64_t B, int64_t H, int64_t KVH, int64_t Q, int64_t S, int64_t D,                             \
          int64_t mb, int64_t mh, int64_t mi, int64_t diag, float scale, int nthreads) {                  \
    const dims_t dm = {B, H, KVH, Q, S, D, mb, mh, mi, diag, scale};                                       \
    const int64_t tasks = B * H * Q, S8 = (S + 7) & ~(int64_t)7;                                          \
    const int parallel = nthreads > 1 && tasks * S * D >= sd_serial_work;                                \
    sd_team = 1; (void)parallel;                                                                           \
    OMP(omp parallel if(parallel) num_threads(nthreads))                                                   \
    {                                                                                                      \
        NOTE_TEAM();                                                                                       \
        float *e = malloc(sizeof(float) * (size_t)S8);                                                     \
        unsigned char *seen = malloc((size_t)S8);                                                          \
        OMP(omp for schedule(static))                                                                      \
        for (int64_t t = 0; t < tasks; t++) attend(q, k, v, mask, out, &dm, t, e, seen, BF16);            \
        free(e); free(seen);                                                                               \
    }                                                                                                      \
}

DEFINE_ATTENTION(sd_attention_f32, float, 0)
DEFINE_ATTENTION(sd_attention_bf16kv, uint16_t, 1)
