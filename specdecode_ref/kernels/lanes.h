/* The arithmetic both kernels share: vectors of LANES floats, the one multiply-add, bf16 widening and
 * the fold of a vector's lanes into one number. Every summation order in the kernels is built from
 * these, so the plain definition (scalar loops) and the fast version (registers) agree bit for bit.
 */
#ifndef SD_LANES_H
#define SD_LANES_H
#include <stdint.h>
#include <string.h>

/* LANES partial sums run side by side: one 512-bit register with AVX-512, one 256-bit register (or
 * two 128-bit NEON registers) elsewhere. LANES is part of the definition of the order, so it is
 * fixed per build, never per call. */
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef float lanes_f32 __attribute__((vector_size(4 * LANES)));
typedef uint32_t lanes_u32 __attribute__((vector_size(4 * LANES)));
typedef uint16_t lanes_u16 __attribute__((vector_size(2 * LANES)));
typedef int32_t lanes_i32 __attribute__((vector_size(4 * LANES)));

/* acc + w * x, rounded once (a fused multiply-add) where the CPU has one; a multiply then an add
 * (the build uses -ffp-contract=off, so the compiler never fuses them on its own) where it has not.
 * The scalar and the vector form are the same operation lane by lane. */
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
static inline float madd(float w, float x, float acc) { return __builtin_fmaf(w, x, acc); }
#if LANES == 16
static inline lanes_f32 madd_lanes(lanes_f32 w, lanes_f32 x, lanes_f32 acc) {
    return (lanes_f32)_mm512_fmadd_ps((__m512)w, (__m512)x, (__m512)acc);
}
#else
static inline lanes_f32 madd_lanes(lanes_f32 w, lanes_f32 x, lanes_f32 acc) {
    return (lanes_f32)_mm256_fmadd_ps((__m256)w, (__m256)x, (__m256)acc);
}
#endif
#else
static inline float madd(float w, float x, float acc) { return w * x + acc; }
static inline lanes_f32 madd_lanes(lanes_f32 w, lanes_f32 x, lanes_f32 acc) { return w * x + acc; }
#endif

static inline lanes_f32 load_lanes(const float *p) { lanes_f32 v; memcpy(&v, p, sizeof v); return v; }
static inline void store_lanes(float *p, lanes_f32 v) { memcpy(p, &v, sizeof v); }

/* bf16 -> fp32: the 16 bits become the upper half of the fp32 word. Exact. */
static inline float widen(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline lanes_f32 widen_lanes(const uint16_t *p) {
    lanes_u16 h; memcpy(&h, p, sizeof h);
    lanes_u32 u = __builtin_convertvector(h, lanes_u32) << 16;
    lanes_f32 f; memcpy(&f, &u, sizeof f); return f;
}

/* The LANES partial sums into one number, always by the same pairwise tree: lane i + lane i + half,
 * halving until one is left. fold_lanes is the definition; fold_register does the same additions on
 * a register (the upper half added to the lower, four times or three), for the fast version. */
static inline float fold_lanes(const float lane[LANES]) {
    float t[LANES];
    memcpy(t, lane, sizeof t);
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int i = 0; i < half; i++) t[i] = t[i] + t[i + half];
    return t[0];
}

typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x2 __attribute__((vector_size(8)));
static inline float fold_register(lanes_f32 v) {
    f32x8 s8;
#if LANES == 16
    f32x8 lo8, hi8;
    memcpy(&lo8, &v, 32); memcpy(&hi8, (const char *)&v + 32, 32);
    s8 = lo8 + hi8;
#else
    s8 = v;
#endif
    f32x4 lo4, hi4;
    memcpy(&lo4, &s8, 16); memcpy(&hi4, (const char *)&s8 + 16, 16);
    f32x4 s4 = lo4 + hi4;
    f32x2 lo2, hi2;
    memcpy(&lo2, &s4, 8); memcpy(&hi2, (const char *)&s4 + 8, 8);
    f32x2 s2 = lo2 + hi2;
    return s2[0] + s2[1];
}

#endif
