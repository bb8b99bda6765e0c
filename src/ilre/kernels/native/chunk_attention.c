/* Attention of one prefill chunk over [visible prefix | chunk causally], float32 internally.
 *
 * out[h, r, :] = softmax(scale * q[h, r] . k[g, j]) @ v[g, j] over the keys j visible to row r,
 * g = h / (H / KV), scale = 1 / sqrt(d). Prefix key j < P is visible where visible[j] != 0
 * (visible == NULL: all); chunk key P + c is visible to row r when c <= pos[r].
 *
 * Layout: the visible prefix keys are gathered first, then the chunk keys, so row r sees exactly
 * the first lim[r] = Pv + pos[r] + 1 keys of the compacted sequence: no per-key prefix mask in
 * the inner loops. K of each kv head is converted once to float32 (dp, Npad), V to (Npad, dp)
 * (dp = d rounded up to 16, Npad = keys rounded up to the key tile, zero padded). Scores are
 * kept in the base-2 domain (q pre-scaled by scale * log2(e)) with an online softmax per key tile.
 * bfloat16 inputs on CPUs with avx512_bf16 use its dot products instead (exact products of the
 * bf16 inputs summed in float32; the softmax weights rounded to bf16 for P . V, as PyTorch does).
 * Build: gcc -O3 -march=native -fopenmp -fno-math-errno -shared -fPIC (no finite-math: masked
 * scores are -inf).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BC 64 /* keys per tile (4 vectors of 16) */
#ifndef BR
#define BR 48 /* query rows per parallel task (a multiple of MR) */
#endif
#ifndef MR
#define MR 6 /* query rows per micro-kernel */
#endif
#define DMAX 256
_Static_assert(BR % MR == 0, "a row block holds whole micro-kernel row groups");

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

static inline v16 splat(float x) { return (v16){0} + x; }
static inline v16 sel(vi16 m, v16 a, v16 b) { return (v16)(((vi16)a & m) | ((vi16)b & ~m)); }
static inline v16 vmax(v16 a, v16 b) { return sel(a > b, a, b); }

static inline float hmax(v16 x) {
    v16 y;
    y = __builtin_shuffle(x, (vi16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi16){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi16){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi16){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    x = vmax(x, y);
    return x[0];
}

static inline float hsum(v16 x) {
    v16 y;
    y = __builtin_shuffle(x, (vi16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x = x + y;
    y = __builtin_shuffle(x, (vi16){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x = x + y;
    y = __builtin_shuffle(x, (vi16){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x = x + y;
    y = __builtin_shuffle(x, (vi16){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    x = x + y;
    return x[0];
}

/* 2^x for x <= 0 (x < -126, including -inf, gives 0); relative error ~1e-7. */
static inline v16 vexp2(v16 x) {
    const v16 lo = splat(-126.0f), magic = splat(12582912.0f); /* 1.5 * 2^23: round to nearest */
    vi16 keep = x >= lo;
    x = vmax(x, lo);
    v16 n = (x + magic) - magic;
    v16 f = x - n; /* [-0.5, 0.5] */
    v16 p = splat(1.5252733804059840e-5f);  /* ln2^k / k!, k = 7..0 */
    p = p * f + splat(1.5403530393381610e-4f);
    p = p * f + splat(1.3333558146428443e-3f);
    p = p * f + splat(9.6181291076284772e-3f);
    p = p * f + splat(5.5504108664821580e-2f);
    p = p * f + splat(2.4022650695910071e-1f);
    p = p * f + splat(6.9314718055994531e-1f);
    p = p * f + splat(1.0f);
    vi16 e = (__builtin_convertvector(n, vi16) + 127) << 23;
    return (v16)((vi16)(p * (v16)e) & keep);
}

static inline float load_elem(const void *src, int64_t i, int bf16) {
    if (bf16) {
        uint32_t bits = (uint32_t)((const uint16_t *)src)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return ((const float *)src)[i];
}

static inline void store_elem(void *dst, int64_t i, float f, int bf16) {
    if (bf16) {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if ((bits & 0x7fffffffu) > 0x7f800000u)
            bits = (bits >> 16) | 0x40u; /* NaN stays a quiet NaN */
        else
            bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
        ((uint16_t *)dst)[i] = (uint16_t)bits;
    } else {
        ((float *)dst)[i] = f;
    }
}

/* Online-softmax update of one row from its scores s (BC keys, base-2 domain): masked past the
 * row's `rel` visible keys, m and l updated, alpha = the factor on the old accumulator, p = 2^(s - m). */
static inline __attribute__((always_inline)) void row_softmax(
    v16 s[4], int masked, int64_t rel, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict p) {
    const v16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    if (masked) {
        v16 relv = splat((float)rel); /* keys j0 + t with t < rel are visible */
        for (int x = 0; x < 4; x++) s[x] = sel(iota + (float)(16 * x) < relv, s[x], splat(-INFINITY));
    }
    float mt = hmax(vmax(vmax(s[0], s[1]), vmax(s[2], s[3])));
    float mnew = mt > *m ? mt : *m;
    *alpha = exp2f(*m - mnew); /* m = -inf on the first tile: 0 */
    *m = mnew;
    v16 mv = splat(mnew), sum = splat(0.0f);
    for (int x = 0; x < 4; x++) {
        v16 e = vexp2(s[x] - mv);
        sum += e;
        *(v16 *)(p + 16 * x) = e;
    }
    *l = *l * *alpha + hsum(sum);
}

/* S = Q (MR x dp, pre-scaled) . Kt (dp x BC), then the softmax update of each row: P (MR x BC). */
static inline __attribute__((always_inline)) void scores_softmax(
    const float *restrict qb, int64_t dp, const float *restrict kt, int64_t npad, int64_t j0,
    const int64_t *lim, int masked, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict pb) {
    v16 acc[MR][4];
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < 4; x++) acc[i][x] = splat(0.0f);
    for (int64_t c = 0; c < dp; c++) {
        const float *kr = kt + c * npad;
        v16 k0 = *(const v16 *)kr, k1 = *(const v16 *)(kr + 16);
        v16 k2 = *(const v16 *)(kr + 32), k3 = *(const v16 *)(kr + 48);
        for (int i = 0; i < MR; i++) {
            v16 qv = splat(qb[i * dp + c]);
            acc[i][0] += qv * k0;
            acc[i][1] += qv * k1;
            acc[i][2] += qv * k2;
            acc[i][3] += qv * k3;
        }
    }
    for (int i = 0; i < MR; i++)
        row_softmax(acc[i], masked, lim[i] - j0, m + i, l + i, alpha + i, pb + i * BC);
}

/* O (MR x 16*NV columns at ob, row stride dp) = alpha * O + P (MR x nk) . V (nk x 16*NV). */
static inline __attribute__((always_inline)) void pv_block(
    float *restrict ob, int64_t dp, const float *restrict pb, const float *restrict vt, int64_t nk,
    const float *alpha, int nv) {
    v16 acc[MR][4];
    for (int i = 0; i < MR; i++) {
        v16 a = splat(alpha[i]);
        for (int x = 0; x < nv; x++) acc[i][x] = a * *(const v16 *)(ob + i * dp + 16 * x);
    }
    for (int64_t j = 0; j < nk; j++) {
        const float *vr = vt + j * dp;
        v16 w[4];
        for (int x = 0; x < nv; x++) w[x] = *(const v16 *)(vr + 16 * x);
        for (int i = 0; i < MR; i++) {
            v16 pv = splat(pb[i * BC + j]);
            for (int x = 0; x < nv; x++) acc[i][x] += pv * w[x];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < nv; x++) *(v16 *)(ob + i * dp + 16 * x) = acc[i][x];
}

static void pv_update(float *ob, int64_t dp, const float *pb, const float *vt, int64_t nk, const float *alpha) {
    int64_t c0 = 0;
    for (; c0 + 64 <= dp; c0 += 64) pv_block(ob + c0, dp, pb, vt + c0, nk, alpha, 4);
    switch ((dp - c0) / 16) {
        case 3: pv_block(ob + c0, dp, pb, vt + c0, nk, alpha, 3); break;
        case 2: pv_block(ob + c0, dp, pb, vt + c0, nk, alpha, 2); break;
        case 1: pv_block(ob + c0, dp, pb, vt + c0, nk, alpha, 1); break;
        default: break;
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* bfloat16 inputs with the avx512_bf16 dot products (vdpbf16ps: pairs of bf16, float32 sums).
 * K of a kv head as (dp/2, npad) pairs along d, V as (npad/2, dp) pairs along the keys; each uint32
 * holds element 2i in its low half, 2i + 1 in its high half. P is rounded to bf16 for P . V. */
#include <immintrin.h>
#define HAVE_BF16DOT 1

static inline __attribute__((always_inline)) void scores_softmax_bf16(
    const uint32_t *restrict qp, int64_t dh, const uint32_t *restrict k2, int64_t npad, int64_t j0,
    const int64_t *lim, int masked, float qscale, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict pb) {
    __m512 acc[MR][4];
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < 4; x++) acc[i][x] = _mm512_setzero_ps();
    for (int64_t c = 0; c < dh; c++) {
        const uint32_t *kr = k2 + c * npad;
        __m512bh kx[4];
        for (int x = 0; x < 4; x++) kx[x] = (__m512bh)_mm512_load_si512((const void *)(kr + 16 * x));
        for (int i = 0; i < MR; i++) {
            __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qp[i * dh + c]);
            for (int x = 0; x < 4; x++) acc[i][x] = _mm512_dpbf16_ps(acc[i][x], qv, kx[x]);
        }
    }
    for (int i = 0; i < MR; i++) {
        v16 sc[4];
        for (int x = 0; x < 4; x++) sc[x] = (v16)acc[i][x] * qscale;
        row_softmax(sc, masked, lim[i] - j0, m + i, l + i, alpha + i, pb + i * BC);
    }
}

static inline __attribute__((always_inline)) void pv_block_bf16(
    float *restrict ob, int64_t dp, const uint32_t *restrict pp, const uint32_t *restrict v2, int64_t nk2,
    const float *alpha, int nv) {
    __m512 acc[MR][4];
    for (int i = 0; i < MR; i++) {
        v16 a = splat(alpha[i]);
        for (int x = 0; x < nv; x++) acc[i][x] = (__m512)(a * *(const v16 *)(ob + i * dp + 16 * x));
    }
    for (int64_t j = 0; j < nk2; j++) {
        __m512bh w[4];
        for (int x = 0; x < nv; x++) w[x] = (__m512bh)_mm512_load_si512((const void *)(v2 + j * dp + 16 * x));
        for (int i = 0; i < MR; i++) {
            __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pp[i * (BC / 2) + j]);
            for (int x = 0; x < nv; x++) acc[i][x] = _mm512_dpbf16_ps(acc[i][x], pv, w[x]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < nv; x++) *(v16 *)(ob + i * dp + 16 * x) = (v16)acc[i][x];
}

/* pb (MR x BC float) -> pp (MR x BC/2 bf16 pairs), then O = alpha * O + P . V over nk keys. */
static void pv_update_bf16(float *ob, int64_t dp, const float *pb, uint32_t *pp, const uint32_t *v2, int64_t nk,
                           const float *alpha) {
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < BC / 32; x++) {
            const float *src = pb + i * BC + 32 * x;
            __m512bh h = _mm512_cvtne2ps_pbh(_mm512_load_ps(src + 16), _mm512_load_ps(src));
            _mm512_store_si512((void *)(pp + i * (BC / 2) + 16 * x), (__m512i)h);
        }
    const int64_t nk2 = (nk + 1) / 2;
    int64_t c0 = 0;
    for (; c0 + 64 <= dp; c0 += 64) pv_block_bf16(ob + c0, dp, pp, v2 + c0, nk2, alpha, 4);
    switch ((dp - c0) / 16) {
        case 3: pv_block_bf16(ob + c0, dp, pp, v2 + c0, nk2, alpha, 3); break;
        case 2: pv_block_bf16(ob + c0, dp, pp, v2 + c0, nk2, alpha, 2); break;
        case 1: pv_block_bf16(ob + c0, dp, pp, v2 + c0, nk2, alpha, 1); break;
        default: break;
    }
}
#else
#define HAVE_BF16DOT 0
#endif

static inline uint32_t bits16(const uint16_t *row, int64_t c, int64_t d) { return c < d ? row[c] : 0u; }

/* Whether the 16-lane vectors are single AVX-512 registers (built without AVX-512, each is split into
 * narrower ones and the kernel runs several times slower than PyTorch's). */
int ilre_chunk_attention_wide(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* Whether bfloat16 inputs use the avx512_bf16 dot products (mode 1 of ilre_chunk_attention). */
int ilre_chunk_attention_bf16dot(void) { return HAVE_BF16DOT; }

/* Per-calling-thread workspace: the float32 K and V of every kv head. Kept between calls up to
 * WS_KEEP floats (a prefill chunk's 1,540 keys take 0.6M), freed after a larger call. */
#define WS_KEEP ((size_t)4 << 20)
static __thread float *ws_buf = NULL;
static __thread size_t ws_cap = 0;

static void workspace_trim(void) {
    if (ws_cap > WS_KEEP) {
        free(ws_buf);
        ws_buf = NULL;
        ws_cap = 0;
    }
}

static float *workspace(size_t n) {
    if (n > ws_cap) {
        free(ws_buf);
        ws_buf = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
        ws_cap = ws_buf ? n : 0;
    }
    return ws_buf;
}

/* q (H, R, d), k and v (KV, P + C, d), out (H, R, d), contiguous; visible (P,) bytes or NULL;
 * pos (R,) ascending chunk positions of the rows. dtype: 0 float32; 1 bfloat16 (avx512_bf16 dot
 * products where compiled in); 2 bfloat16 with float32 products. Returns 0 on success, 1 on
 * unsupported arguments, 2 when out of memory. */
int ilre_chunk_attention(const void *q, const void *k, const void *v, void *out, int64_t H, int64_t KV,
                         int64_t R, int64_t P, int64_t C, int64_t d, const uint8_t *visible,
                         const int64_t *pos, int dtype, int nthreads) {
    if (H <= 0 || KV <= 0 || H % KV != 0 || d <= 0 || d > DMAX || R < 0 || P < 0 || C <= 0) return 1;
    if (dtype < 0 || dtype > 2) return 1;
    if (R == 0) return 0;
    const int bf16 = dtype != 0, dot16 = HAVE_BF16DOT && dtype == 1;
    const int64_t group = H / KV, dp = (d + 15) / 16 * 16, dh = dp / 2, Nk = P + C;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(Nk + R));
    if (!idx) return 2;
    int64_t pv = 0;
    for (int64_t j = 0; j < P; j++)
        if (!visible || visible[j]) idx[pv++] = j;
    for (int64_t c = 0; c < C; c++) idx[pv + c] = P + c;
    const int64_t N = pv + C, npad = (N + BC - 1) / BC * BC, ntiles = npad / BC;
    int64_t *lim = idx + Nk;
    for (int64_t r = 0; r < R; r++) {
        int64_t L = pv + pos[r] + 1;
        lim[r] = L < 1 ? 1 : (L > N ? N : L);
    }
    float *kt = workspace((size_t)(2 * KV * npad * dp));
    if (!kt) {
        free(idx);
        return 2;
    }
    float *vf = kt + KV * npad * dp;
    const float qscale = (float)(1.4426950408889634 / sqrt((double)d)); /* log2(e) / sqrt(d) */
    const int64_t nblk = (R + BR - 1) / BR, ntask = H * nblk;
    if (nthreads < 1) nthreads = 1;

#pragma omp parallel num_threads(nthreads)
    {
        /* K and V of every kv head, gathered through idx, converted and zero padded */
#pragma omp for schedule(static)
        for (int64_t gt = 0; gt < KV * ntiles; gt++) {
            const int64_t g = gt / ntiles, j0 = (gt % ntiles) * BC;
            if (dot16) { /* K -> (dh, npad) pairs along d, V -> (npad/2, dp) pairs along the keys */
                uint32_t *k2 = (uint32_t *)(kt + g * dp * npad), *v2 = (uint32_t *)(vf + g * npad * dp);
                for (int64_t j = j0; j < j0 + BC; j++) {
                    const uint16_t *kr = j < N ? (const uint16_t *)k + (g * Nk + idx[j]) * d : NULL;
                    for (int64_t c = 0; c < dh; c++)
                        k2[c * npad + j] = kr ? bits16(kr, 2 * c, d) | bits16(kr, 2 * c + 1, d) << 16 : 0u;
                }
                for (int64_t j = j0; j < j0 + BC; j += 2) {
                    const uint16_t *v0 = j < N ? (const uint16_t *)v + (g * Nk + idx[j]) * d : NULL;
                    const uint16_t *v1 = j + 1 < N ? (const uint16_t *)v + (g * Nk + idx[j + 1]) * d : NULL;
                    uint32_t *row = v2 + (j / 2) * dp;
                    for (int64_t c = 0; c < dp; c++)
                        row[c] = (v0 ? bits16(v0, c, d) : 0u) | (v1 ? bits16(v1, c, d) : 0u) << 16;
                }
                continue;
            }
            /* K -> (dp, npad) and V -> (npad, dp) float32 */
            float *ktg = kt + g * dp * npad, *vfg = vf + g * npad * dp;
            for (int64_t j = j0; j < j0 + BC; j++) {
                float *vrow = vfg + j * dp;
                if (j < N) {
                    const int64_t src = (g * Nk + idx[j]) * d;
                    for (int64_t c = 0; c < d; c++) {
                        ktg[c * npad + j] = load_elem(k, src + c, bf16);
                        vrow[c] = load_elem(v, src + c, bf16);
                    }
                    for (int64_t c = d; c < dp; c++) ktg[c * npad + j] = vrow[c] = 0.0f;
                } else {
                    for (int64_t c = 0; c < dp; c++) ktg[c * npad + j] = vrow[c] = 0.0f;
                }
            }
        }
        /* implicit barrier */
        float qb[BR * dp] __attribute__((aligned(64)));
        float ob[BR * dp] __attribute__((aligned(64)));
        float pb[MR * BC] __attribute__((aligned(64)));
        uint32_t pp[MR * BC / 2] __attribute__((aligned(64)));
        float m[BR], l[BR], alpha[MR];
        int64_t blim[BR];
        (void)pp;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntask; task++) {
            const int64_t b = nblk - 1 - task / H, h = task % H, g = h / group; /* heavy blocks first */
            const int64_t r0 = b * BR, nr = (R - r0) < BR ? (R - r0) : BR, nrp = (nr + MR - 1) / MR * MR;
            for (int64_t i = 0; i < nrp; i++) {
                const int64_t src = (h * R + r0 + i) * d;
                if (dot16) { /* raw bf16 pairs; the scale is applied to the scores */
                    uint32_t *qrow = (uint32_t *)qb + i * dh;
                    const uint16_t *qr = (const uint16_t *)q + src;
                    for (int64_t c = 0; c < dh; c++)
                        qrow[c] = i < nr ? bits16(qr, 2 * c, d) | bits16(qr, 2 * c + 1, d) << 16 : 0u;
                } else {
                    float *qrow = qb + i * dp;
                    for (int64_t c = 0; c < dp; c++)
                        qrow[c] = i < nr && c < d ? load_elem(q, src + c, bf16) * qscale : 0.0f;
                }
                blim[i] = i < nr ? lim[r0 + i] : lim[r0 + nr - 1];
                memset(ob + i * dp, 0, sizeof(float) * (size_t)dp);
                m[i] = -INFINITY;
                l[i] = 0.0f;
            }
            int64_t maxlim = 0;
            for (int64_t i = 0; i < nrp; i++) maxlim = blim[i] > maxlim ? blim[i] : maxlim;
            const float *ktg = kt + g * dp * npad, *vfg = vf + g * npad * dp;
            for (int64_t j0 = 0; j0 < maxlim; j0 += BC) {
                for (int64_t i0 = 0; i0 < nrp; i0 += MR) {
                    int64_t gmin = blim[i0], gmax = blim[i0];
                    for (int i = 1; i < MR; i++) {
                        gmin = blim[i0 + i] < gmin ? blim[i0 + i] : gmin;
                        gmax = blim[i0 + i] > gmax ? blim[i0 + i] : gmax;
                    }
                    if (j0 >= gmax) continue; /* the whole tile is past these rows */
                    const int masked = j0 + BC > gmin;
                    const int64_t nk = gmax - j0 < BC ? gmax - j0 : BC;
#if HAVE_BF16DOT
                    if (dot16) {
                        scores_softmax_bf16((const uint32_t *)qb + i0 * dh, dh, (const uint32_t *)ktg + j0, npad, j0,
                                            blim + i0, masked, qscale, m + i0, l + i0, alpha, pb);
                        pv_update_bf16(ob + i0 * dp, dp, pb, pp, (const uint32_t *)vfg + (j0 / 2) * dp, nk, alpha);
                        continue;
                    }
#endif
                    scores_softmax(qb + i0 * dp, dp, ktg + j0, npad, j0, blim + i0, masked, m + i0, l + i0,
                                   alpha, pb);
                    pv_update(ob + i0 * dp, dp, pb, vfg + j0 * dp, nk, alpha);
                }
            }
            for (int64_t i = 0; i < nr; i++) {
                const float inv = 1.0f / l[i];
                const int64_t dst = (h * R + r0 + i) * d;
                for (int64_t c = 0; c < d; c++) store_elem(out, dst + c, ob[i * dp + c] * inv, bf16);
            }
        }
    }
    free(idx);
    workspace_trim();
    return 0;
}
