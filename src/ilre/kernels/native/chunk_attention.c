/* Attention of one prefill chunk over [visible prefix | chunk causally], float32 internally.
 *
 * out[h, r, :] = softmax(scale * q[h, r] . k[g, j]) @ v[g, j] over the keys j visible to row r,
 * g = h / (H / KV), scale = 1 / sqrt(d). Prefix key j < P is visible where visible[j] != 0
 * (visible == NULL: all); chunk key P + c is visible to row r when c <= pos[r].
 *
 * Layout: the visible prefix keys are gathered first, then the chunk keys, so row r sees exactly
 * the first lim[r] = Pv + pos[r] + 1 keys of the compacted sequence: no per-key prefix mask in
 * the inner loops. K of each kv head is converted once to float32 (dp, Npad), V to (Npad, dp)
 * (dp = d rounded up to 16, Npad = keys rounded up to the key tile, zero padded). Vectors of 16 float
 * lanes with AVX-512, 8 without (AVX2 registers), with micro-kernel shapes per width. Scores are
 * kept in the base-2 domain (q pre-scaled by scale * log2(e)) with an online softmax per key tile.
 * bfloat16 inputs on CPUs with avx512_bf16 use its dot products instead (exact products of the
 * bf16 inputs summed in float32; the softmax weights rounded to bf16 for P . V, as PyTorch does).
 * Build: gcc -O3 -march=native (or x86-64-v3) -fopenmp -fno-math-errno -shared -fPIC (no finite-math:
 * masked scores are -inf).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Vector width: 16 float lanes (one zmm register) with AVX-512, else 8 (one ymm register with AVX;
 * built for x86-64-v2 each is a pair of xmm registers). Micro-kernels: MR query rows by NXS vectors of
 * keys (scores) and by NXV vectors of head columns (P . V), sized so that the accumulators, the loaded
 * vectors and a broadcast fit the register file (32 zmm: 6 x 4; 16 ymm: 6 x 2). */
#ifdef __AVX512F__
#define VL 16
#ifndef NXS
#define NXS 4
#endif
#ifndef NXV
#define NXV 4
#endif
#else
#define VL 8
#ifndef NXS
#define NXS 2
#endif
#ifndef NXV
#define NXV 2
#endif
#endif
#define BC 64 /* keys per tile (a multiple of VL * NXS) */
#ifndef BR
#define BR 48 /* query rows per parallel task (a multiple of MR) */
#endif
#ifndef MR
#define MR 6 /* query rows per micro-kernel */
#endif
#define DMAX 256
#define NB (BC / VL) /* vectors per tile row */
_Static_assert(BR % MR == 0, "a row block holds whole micro-kernel row groups");
_Static_assert(BC % (VL * NXS) == 0, "a key tile holds whole score micro-kernels");
_Static_assert(NXV >= 1 && NXV <= 4, "P . V micro-kernels of 1 to 4 vectors");

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

#if VL == 16
static inline vf splat(float x) { return (vf){0} + x; }
#else
/* a plain broadcast (0 + x would cost a scalar add: -0 + 0 is +0) */
static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x}; }
#endif
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf vmax(vf a, vf b) { return sel(a > b, a, b); }

#if VL == 16
static inline float hmax(vf x) {
    vf y;
    y = __builtin_shuffle(x, (vi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    x = vmax(x, y);
    return x[0];
}

static inline float hsum(vf x) {
    vf y;
    y = __builtin_shuffle(x, (vi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x = x + y;
    y = __builtin_shuffle(x, (vi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x = x + y;
    y = __builtin_shuffle(x, (vi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x = x + y;
    y = __builtin_shuffle(x, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    x = x + y;
    return x[0];
}
#else
static inline float hmax(vf x) {
    vf y;
    y = __builtin_shuffle(x, (vi){4, 5, 6, 7, 0, 1, 2, 3});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi){2, 3, 0, 1, 6, 7, 4, 5});
    x = vmax(x, y);
    y = __builtin_shuffle(x, (vi){1, 0, 3, 2, 5, 4, 7, 6});
    x = vmax(x, y);
    return x[0];
}

static inline float hsum(vf x) {
    vf y;
    y = __builtin_shuffle(x, (vi){4, 5, 6, 7, 0, 1, 2, 3});
    x = x + y;
    y = __builtin_shuffle(x, (vi){2, 3, 0, 1, 6, 7, 4, 5});
    x = x + y;
    y = __builtin_shuffle(x, (vi){1, 0, 3, 2, 5, 4, 7, 6});
    x = x + y;
    return x[0];
}
#endif

/* 2^x for x <= 0 (x < -126, including -inf, gives 0); relative error ~1e-7. */
static inline vf vexp2(vf x) {
    const vf lo = splat(-126.0f), magic = splat(12582912.0f); /* 1.5 * 2^23: round to nearest */
    vi keep = x >= lo;
    x = vmax(x, lo);
    vf n = (x + magic) - magic;
    vf f = x - n; /* [-0.5, 0.5] */
    vf p = splat(1.5252733804059840e-5f);  /* ln2^k / k!, k = 7..0 */
    p = p * f + splat(1.5403530393381610e-4f);
    p = p * f + splat(1.3333558146428443e-3f);
    p = p * f + splat(9.6181291076284772e-3f);
    p = p * f + splat(5.5504108664821580e-2f);
    p = p * f + splat(2.4022650695910071e-1f);
    p = p * f + splat(6.9314718055994531e-1f);
    p = p * f + splat(1.0f);
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return (vf)((vi)(p * (vf)e) & keep);
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

#if NB != 4
/* The maximum of a tile row's NB vectors (a pairwise tree). */
static inline __attribute__((always_inline)) vf row_max(const vf s[NB]) {
    vf t[NB];
    for (int x = 0; x < NB; x++) t[x] = s[x];
    for (int w = NB / 2; w >= 1; w /= 2)
        for (int x = 0; x < w; x++) t[x] = vmax(t[2 * x], t[2 * x + 1]);
    return t[0];
}
#endif

/* Online-softmax update of one row from its scores s (BC keys, base-2 domain): masked past the
 * row's `rel` visible keys, m and l updated, alpha = the factor on the old accumulator, p = 2^(s - m). */
static inline __attribute__((always_inline)) void row_softmax(
    vf s[NB], int masked, int64_t rel, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict p) {
#if VL == 16
    const vf iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
    const vf iota = {0, 1, 2, 3, 4, 5, 6, 7};
#endif
    if (masked) {
        vf relv = splat((float)rel); /* keys j0 + t with t < rel are visible */
        for (int x = 0; x < NB; x++) s[x] = sel(iota + (float)(VL * x) < relv, s[x], splat(-INFINITY));
    }
#if NB == 4
    float mt = hmax(vmax(vmax(s[0], s[1]), vmax(s[2], s[3])));
#else
    float mt = hmax(row_max(s));
#endif
    float mnew = mt > *m ? mt : *m;
    *alpha = exp2f(*m - mnew); /* m = -inf on the first tile: 0 */
    *m = mnew;
    vf mv = splat(mnew), sum = splat(0.0f);
    for (int x = 0; x < NB; x++) {
        vf e = vexp2(s[x] - mv);
        sum += e;
        *(vf *)(p + VL * x) = e;
    }
    *l = *l * *alpha + hsum(sum);
}

/* S = Q (MR x dp, pre-scaled) . Kt (dp x BC), then the softmax update of each row: P (MR x BC). */
#if NXS == NB && NB == 4
/* one micro-kernel spans the tile: the scores stay in registers */
static inline __attribute__((always_inline)) void scores_softmax(
    const float *restrict qb, int64_t dp, const float *restrict kt, int64_t npad, int64_t j0,
    const int64_t *lim, int masked, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict pb) {
    vf acc[MR][NB];
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < NB; x++) acc[i][x] = splat(0.0f);
    for (int64_t c = 0; c < dp; c++) {
        const float *kr = kt + c * npad;
        vf k0 = *(const vf *)kr, k1 = *(const vf *)(kr + VL);
        vf k2 = *(const vf *)(kr + 2 * VL), k3 = *(const vf *)(kr + 3 * VL);
        for (int i = 0; i < MR; i++) {
            vf qv = splat(qb[i * dp + c]);
            acc[i][0] += qv * k0;
            acc[i][1] += qv * k1;
            acc[i][2] += qv * k2;
            acc[i][3] += qv * k3;
        }
    }
    for (int i = 0; i < MR; i++)
        row_softmax(acc[i], masked, lim[i] - j0, m + i, l + i, alpha + i, pb + i * BC);
}
#else
/* the tile's scores in NB / NXS micro-kernels through pb, then the softmax of each row */
static inline __attribute__((always_inline)) void scores_block(
    const float *restrict qb, int64_t dp, const float *restrict kt, int64_t npad, float *restrict pb) {
    vf acc[MR][NXS];
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < NXS; x++) acc[i][x] = splat(0.0f);
    for (int64_t c = 0; c < dp; c++) {
        const float *kr = kt + c * npad;
        vf kx[NXS];
        for (int x = 0; x < NXS; x++) kx[x] = *(const vf *)(kr + VL * x);
        for (int i = 0; i < MR; i++) {
            vf qv = splat(qb[i * dp + c]);
            for (int x = 0; x < NXS; x++) acc[i][x] += qv * kx[x];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < NXS; x++) *(vf *)(pb + i * BC + VL * x) = acc[i][x];
}

static inline __attribute__((always_inline)) void scores_softmax(
    const float *restrict qb, int64_t dp, const float *restrict kt, int64_t npad, int64_t j0,
    const int64_t *lim, int masked, float *restrict m, float *restrict l, float *restrict alpha,
    float *restrict pb) {
    for (int x0 = 0; x0 < BC; x0 += VL * NXS) scores_block(qb, dp, kt + x0, npad, pb + x0);
    for (int i = 0; i < MR; i++) {
        vf s[NB];
        for (int x = 0; x < NB; x++) s[x] = *(const vf *)(pb + i * BC + VL * x);
        row_softmax(s, masked, lim[i] - j0, m + i, l + i, alpha + i, pb + i * BC);
    }
}
#endif

/* O (MR x VL*nv columns at ob, row stride dp) = alpha * O + P (MR x nk) . V (nk x VL*nv). */
static inline __attribute__((always_inline)) void pv_block(
    float *restrict ob, int64_t dp, const float *restrict pb, const float *restrict vt, int64_t nk,
    const float *alpha, int nv) {
    vf acc[MR][4];
    for (int i = 0; i < MR; i++) {
        vf a = splat(alpha[i]);
        for (int x = 0; x < nv; x++) acc[i][x] = a * *(const vf *)(ob + i * dp + VL * x);
    }
    for (int64_t j = 0; j < nk; j++) {
        const float *vr = vt + j * dp;
        vf w[4];
        for (int x = 0; x < nv; x++) w[x] = *(const vf *)(vr + VL * x);
        for (int i = 0; i < MR; i++) {
            vf pv = splat(pb[i * BC + j]);
            for (int x = 0; x < nv; x++) acc[i][x] += pv * w[x];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int x = 0; x < nv; x++) *(vf *)(ob + i * dp + VL * x) = acc[i][x];
}

/* dp is a multiple of 16 floats: whole vectors at either width. */
static void pv_update(float *ob, int64_t dp, const float *pb, const float *vt, int64_t nk, const float *alpha) {
    int64_t c0 = 0;
    for (; c0 + VL * NXV <= dp; c0 += VL * NXV) pv_block(ob + c0, dp, pb, vt + c0, nk, alpha, NXV);
    switch ((dp - c0) / VL) {
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
        vf sc[4];
        for (int x = 0; x < 4; x++) sc[x] = (vf)acc[i][x] * qscale;
        row_softmax(sc, masked, lim[i] - j0, m + i, l + i, alpha + i, pb + i * BC);
    }
}

static inline __attribute__((always_inline)) void pv_block_bf16(
    float *restrict ob, int64_t dp, const uint32_t *restrict pp, const uint32_t *restrict v2, int64_t nk2,
    const float *alpha, int nv) {
    __m512 acc[MR][4];
    for (int i = 0; i < MR; i++) {
        vf a = splat(alpha[i]);
        for (int x = 0; x < nv; x++) acc[i][x] = (__m512)(a * *(const vf *)(ob + i * dp + 16 * x));
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
        for (int x = 0; x < nv; x++) *(vf *)(ob + i * dp + 16 * x) = (vf)acc[i][x];
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

/* Whether this build is the faster one than PyTorch's kernels (bench/native_attention_bench.py): its vectors
 * single registers with FMA, 16 lanes with AVX-512 or 8 with AVX2 (x86-64-v3). Built for x86-64-v2, each
 * 8-lane vector is a pair of SSE registers and there is no FMA. */
int ilre_chunk_attention_fast(void) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
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
    float *vbuf = kt + KV * npad * dp;
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
                uint32_t *k2 = (uint32_t *)(kt + g * dp * npad), *v2 = (uint32_t *)(vbuf + g * npad * dp);
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
            float *ktg = kt + g * dp * npad, *vfg = vbuf + g * npad * dp;
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
            const float *ktg = kt + g * dp * npad, *vfg = vbuf + g * npad * dp;
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
