/* The elementwise passes of a decoder layer, each one pass over memory: RMSNorm into the matmuls' dtype, the residual
 * sum with the next RMSNorm, SiLU(gate) * up, and RoPE of the stacked q/k/v product into head-major q, k (rotated), v.
 *
 * Each reproduces PyTorch's chain of operators for the same dtype: every bfloat16 operator computes in float32 and
 * rounds once to bfloat16 (round to nearest even), so each intermediate that PyTorch rounds is rounded here too.
 * RoPE and the SiLU product are then bit for bit PyTorch's (their products of bfloat16 values are exact in float32);
 * the norm's row sum and SiLU's exp differ from PyTorch's in float32's last bits (their rounding to bfloat16 can
 * differ by one unit in rare elements). Rows are independent: a row's result does not depend on the other rows or
 * on the thread count.
 * Build: gcc -O3 -march=native (or x86-64-v3) -fopenmp -fno-math-errno -ffp-contract=off -fno-trapping-math -shared -fPIC
 * (no contraction into FMA: float32's products and sums stay PyTorch's separate roundings).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#define LANES 16 /* a row's sum of squares in 16 partial sums (vectorised without reassociation flags) */
#define PARALLEL_MIN 32768 /* elements below which a pass runs on the calling thread only */

static inline float from_bf16(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    uint32_t quiet = (bits >> 16) | 0x40u; /* NaN stays a quiet NaN */
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* Element access per dtype, for the passes instantiated once per dtype below (F32_* and BF16_*). */
#define F32_LOAD(p, i) ((p)[i])
#define F32_STORE(p, i, f) ((p)[i] = (f))
#define F32_HELD(f) (f)
#define BF16_LOAD(p, i) from_bf16((p)[i])
#define BF16_STORE(p, i, f) ((p)[i] = to_bf16(f))
#define BF16_HELD(f) from_bf16(to_bf16(f)) /* f as bfloat16 holds it */

static inline int threads_for(int64_t elements, int nthreads) { return elements < PARALLEL_MIN ? 1 : nthreads; }

/* 1 / sqrt(mean(x^2) + eps) over a row of dim float32 values. */
static inline float row_scale(const float *restrict xr, int64_t dim, float eps) {
    float part[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= dim; j += LANES)
        for (int t = 0; t < LANES; t++) part[t] += xr[j + t] * xr[j + t];
    float sum = 0.0f;
    for (int t = 0; t < LANES; t++) sum += part[t];
    for (; j < dim; j++) sum += xr[j] * xr[j];
    return 1.0f / sqrtf(sum / (float)dim + eps);
}

/* o = w * held(x / sqrt(mean(x^2) + eps)) over one row of dim: x float32; w (dim,) in the output's dtype or NULL (no
 * product). PyTorch: rms_norm in float32, .to(dtype), weight * normed. */
#define DEFINE_NORM_ROW(NAME, T, P)                                                                                 \
    static inline void NAME(const float *restrict xr, const T *restrict w, T *restrict o, int64_t dim, float eps) { \
        const float scale = row_scale(xr, dim, eps);                                                                \
        if (w == NULL)                                                                                              \
            for (int64_t c = 0; c < dim; c++) P##_STORE(o, c, xr[c] * scale);                                       \
        else                                                                                                        \
            for (int64_t c = 0; c < dim; c++) P##_STORE(o, c, P##_LOAD(w, c) * P##_HELD(xr[c] * scale));            \
    }
DEFINE_NORM_ROW(norm_row_f32, float, F32)
DEFINE_NORM_ROW(norm_row_bf16, uint16_t, BF16)

/* Each row of x (rows, dim) float32 normed into out (rows, dim) in the dtype. */
#define DEFINE_NORM(NAME, T, ROW)                                                                                   \
    static void NAME(const float *restrict x, const T *restrict w, T *restrict out, int64_t rows, int64_t dim,     \
                     float eps, int nthreads) {                                                                     \
        _Pragma("omp parallel for num_threads(threads_for(rows * dim, nthreads)) schedule(static)")                  \
        for (int64_t r = 0; r < rows; r++) ROW(x + r * dim, w, out + r * dim, dim, eps);                            \
    }
DEFINE_NORM(norm_f32, float, norm_row_f32)
DEFINE_NORM(norm_bf16, uint16_t, norm_row_bf16)

/* Returns 0; dtype of w and out: 0 float32, 1 bfloat16. */
int ilre_rms_norm(const float *x, const void *w, void *out, int64_t rows, int64_t dim, float eps, int dtype,
                  int nthreads) {
    if (dtype)
        norm_bf16(x, w, out, rows, dim, eps, nthreads);
    else
        norm_f32(x, w, out, rows, dim, eps, nthreads);
    return 0;
}

/* sum = h + o (o in the dtype, added in float32 as PyTorch's type promotion does), and where normed != NULL that sum's
 * rows normed as ilre_rms_norm: the residual stream and the next norm in one pass over it. */
#define DEFINE_RESIDUAL(NAME, T, P, ROW)                                                                            \
    static void NAME(const float *restrict h, const T *restrict o, float *restrict sum, const T *restrict w,        \
                     T *restrict normed, int64_t rows, int64_t dim, float eps, int nthreads) {                     \
        _Pragma("omp parallel for num_threads(threads_for(rows * dim, nthreads)) schedule(static)")                  \
        for (int64_t r = 0; r < rows; r++) {                                                                        \
            float *restrict s = sum + r * dim;                                                                      \
            for (int64_t c = 0; c < dim; c++) s[c] = h[r * dim + c] + P##_LOAD(o, r * dim + c);                     \
            if (normed != NULL) ROW(s, w, normed + r * dim, dim, eps);                                              \
        }                                                                                                           \
    }
DEFINE_RESIDUAL(residual_f32, float, F32, norm_row_f32)
DEFINE_RESIDUAL(residual_bf16, uint16_t, BF16, norm_row_bf16)

/* h, sum (rows, dim) float32; o (rows, dim), w (dim,) or NULL and normed (rows, dim) or NULL in the dtype (0 float32,
 * 1 bfloat16). Returns 0. */
int ilre_residual(const float *h, const void *o, float *sum, const void *w, void *normed, int64_t rows, int64_t dim,
                  float eps, int dtype, int nthreads) {
    if (dtype)
        residual_bf16(h, o, sum, w, normed, rows, dim, eps, nthreads);
    else
        residual_f32(h, o, sum, w, normed, rows, dim, eps, nthreads);
    return 0;
}

/* e^x, |relative error| ~1 ulp over [-87, 88]; clamped to that range (silu needs no more). Cody-Waite reduction by
 * ln 2, then a degree-6 polynomial on [-ln2/2, ln2/2]. */
static inline float exp_f(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    const float n = rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f; /* ln 2, high part (exact in n * hi) */
    r = r - n * -2.12194440e-4f;    /* ln 2, low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

/* out (rows, f) = silu(gate) * up where gu (rows, 2f) holds [gate | up] per row (the stacked gate/up product). */
#define DEFINE_SILU_MUL(NAME, T, P)                                                                                 \
    static void NAME(const T *restrict gu, T *restrict out, int64_t rows, int64_t f, int nthreads) {                \
        _Pragma("omp parallel for num_threads(threads_for(rows * f, nthreads)) schedule(static)")                    \
        for (int64_t r = 0; r < rows; r++) {                                                                        \
            const T *restrict g = gu + r * 2 * f, *restrict u = g + f;                                              \
            T *restrict o = out + r * f;                                                                            \
            for (int64_t c = 0; c < f; c++) {                                                                       \
                const float x = P##_LOAD(g, c);                                                                     \
                const float silu = P##_HELD(x / (1.0f + exp_f(-x))); /* PyTorch: silu_, in the dtype */              \
                P##_STORE(o, c, silu * P##_LOAD(u, c));                                                             \
            }                                                                                                       \
        }                                                                                                           \
    }
DEFINE_SILU_MUL(silu_mul_f32, float, F32)
#ifndef __AVX512BF16__
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, BF16)
#else
/* The same with avx512_bf16's conversion to bfloat16 (vcvtneps2bf16: round to nearest even, as to_bf16), 16 lanes at
 * a time; exp_f's steps in the same order (rintf as the 1.5 * 2^23 round trip: the same for |x| < 2^22). */
static inline __m512 exp_v(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), magic), magic);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m256i round_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

static inline __m512 held_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round_bf16(x)), 16));
}

static void silu_mul_bf16(const uint16_t *restrict gu, uint16_t *restrict out, int64_t rows, int64_t f, int nthreads) {
#pragma omp parallel for num_threads(threads_for(rows * f, nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *restrict g = gu + r * 2 * f, *restrict u = g + f;
        uint16_t *restrict o = out + r * f;
        int64_t c = 0;
        for (; c + 16 <= f; c += 16) {
            const __m512 x = load_bf16(g + c);
            const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), exp_v(_mm512_sub_ps(_mm512_setzero_ps(), x)));
            const __m512 silu = held_bf16(_mm512_div_ps(x, den));
            _mm256_storeu_si256((__m256i *)(o + c), round_bf16(_mm512_mul_ps(silu, load_bf16(u + c))));
        }
        for (; c < f; c++) {
            const float x = BF16_LOAD(g, c);
            BF16_STORE(o, c, BF16_HELD(x / (1.0f + exp_f(-x))) * BF16_LOAD(u, c));
        }
    }
}
#endif

/* Whether bfloat16's SiLU product has avx512_bf16's conversions: built without them it is slower than PyTorch's. */
int ilre_silu_mul_bf16_fast(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

/* dtype: 0 float32, 1 bfloat16. Returns 0. */
int ilre_silu_mul(const void *gu, void *out, int64_t rows, int64_t f, int dtype, int nthreads) {
    if (dtype)
        silu_mul_bf16(gu, out, rows, f, nthreads);
    else
        silu_mul_f32(gu, out, rows, f, nthreads);
    return 0;
}

/* x (rows, heads * d): a projection's heads side by side per token; cos, sin (rows, d) -> out (heads, rows, d), head
 * major, the first `rotated` heads rotated (half-split RoPE) and the rest copied. PyTorch (kernels/rope.apply_rope):
 * out = x * cos; out[:half] -= x[half:] * sin[:half]; out[half:] += x[:half] * sin[half:], each operator rounded to
 * the dtype. */
#define DEFINE_ROPE(NAME, T, P)                                                                                     \
    static void NAME(const T *restrict x, const T *restrict cos, const T *restrict sin, T *restrict out,           \
                     int64_t rows, int64_t heads, int64_t rotated, int64_t d, int nthreads) {                      \
        const int64_t half = d / 2, width = heads * d;                                                              \
        _Pragma("omp parallel for num_threads(threads_for(rows * width, nthreads)) schedule(static)")                \
        for (int64_t t = 0; t < rows; t++) {                                                                        \
            const T *restrict ct = cos + t * d, *restrict st = sin + t * d;                                         \
            for (int64_t h = 0; h < heads; h++) {                                                                   \
                const T *restrict xh = x + t * width + h * d;                                                       \
                T *restrict o = out + (h * rows + t) * d;                                                           \
                if (h >= rotated) {                                                                                 \
                    memcpy(o, xh, d * sizeof(T));                                                                   \
                    continue;                                                                                       \
                }                                                                                                   \
                for (int64_t c = 0; c < half; c++)                                                                  \
                    P##_STORE(o, c, P##_HELD(P##_LOAD(xh, c) * P##_LOAD(ct, c))                                     \
                                        - P##_HELD(P##_LOAD(xh, half + c) * P##_LOAD(st, c)));                      \
                for (int64_t c = 0; c < half; c++)                                                                  \
                    P##_STORE(o, half + c, P##_HELD(P##_LOAD(xh, half + c) * P##_LOAD(ct, half + c))                \
                                               + P##_HELD(P##_LOAD(xh, c) * P##_LOAD(st, half + c)));               \
            }                                                                                                       \
        }                                                                                                           \
    }
DEFINE_ROPE(rope_f32, float, F32)
DEFINE_ROPE(rope_bf16, uint16_t, BF16)

/* dtype: 0 float32, 1 bfloat16 (x, cos, sin and out alike). Returns 0, or 1 for an odd d. */
int ilre_rope_heads(const void *x, const void *cos, const void *sin, void *out, int64_t rows, int64_t heads,
                    int64_t rotated, int64_t d, int dtype, int nthreads) {
    if (d % 2)
        return 1;
    if (dtype)
        rope_bf16(x, cos, sin, out, rows, heads, rotated, d, nthreads);
    else
        rope_f32(x, cos, sin, out, rows, heads, rotated, d, nthreads);
    return 0;
}
