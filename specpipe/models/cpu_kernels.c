/* specpipe's CPU decode kernels: the native forward of a Llama-family decoder in one call per
 * step, fp32 activations, fp16 or int8 weights (see cpu_kernels.py, which compiles and loads it).
 *
 * Why C: a torch step of a 30-layer model is ~600 small ops whose dispatch costs as much as the
 * weights take to stream, and torch's fp16 GEMM (fbgemm) reads them at ~60% of the machine's
 * bandwidth. Here a layer is one pass: norm, fused q/k/v, rotary, cache write, attention, output
 * projection, norm, gate/up, SiLU, down, in one OpenMP region per step.
 *
 * Exact by construction: every output of a linear layer is one dot product summed in a fixed
 * order (vector lanes over K in steps of VW, then the lanes folded in a fixed order, then the
 * K % VW tail), whatever the number of rows, the tile a row falls in or the thread that computes
 * it; every attention row sums over its visible slots in slot order, as a one-token step does.
 * So each row of a k-token verify block is bitwise equal to a one-token forward of that token.
 * Rows are independent: a batch row never reads another row's data.
 *
 * Built with -march=native: AVX-512 (16 lanes) where the CPU has it, else AVX2 + FMA + F16C
 * (8 lanes); without those it does not build and the engine keeps torch's kernels.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "specpipe's CPU kernels need AVX2, FMA and F16C"
#endif

#if defined(__AVX512F__)
#define VW 16
#define MR 4 /* rows per register tile: 16 accumulators + 4 weights + 1 input of 32 zmm */
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline float vsum(vf v) { /* fixed folding: 16 -> 8 -> 4 -> 2 -> 1 */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#else
#define VW 8
#define MR 2 /* 8 accumulators + 4 weights + 1 input of 16 ymm */
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline float vsum(vf v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#endif
#define NR 4 /* output columns per register tile */

/* int8 x int8 dot products, summed in int32: exact in any order. With AVX512-VNNI, vpdpbusd
 * (u8 x s8, 64 a step: the activations offset by +128, taken back with the weights' column
 * sums); else sign-extended to int16 and vpmaddwd. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QW 64
#define Q_OFFSET 128
typedef __m512i vi;
static inline vi qzero(void) { return _mm512_setzero_si512(); }
static inline vi qload_w(const int8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi qload_x(const int8_t *p) {
    return _mm512_xor_si512(_mm512_loadu_si512((const void *)p), _mm512_set1_epi8((char)0x80));
}
static inline vi qdot(vi acc, vi x, vi w) { return _mm512_dpbusd_epi32(acc, x, w); }
static inline int32_t qsum(vi v) { return _mm512_reduce_add_epi32(v); }
#elif defined(__AVX512BW__)
#define QW 32
#define Q_OFFSET 0
typedef __m512i vi;
static inline vi qzero(void) { return _mm512_setzero_si512(); }
static inline vi qload_w(const int8_t *p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
static inline vi qload_x(const int8_t *p) { return qload_w(p); }
static inline vi qdot(vi acc, vi x, vi w) { return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w)); }
static inline int32_t qsum(vi v) { return _mm512_reduce_add_epi32(v); }
#else
#define QW 16
#define Q_OFFSET 0
typedef __m256i vi;
static inline vi qzero(void) { return _mm256_setzero_si256(); }
static inline vi qload_w(const int8_t *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }
static inline vi qload_x(const int8_t *p) { return qload_w(p); }
static inline vi qdot(vi acc, vi x, vi w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w)); }
static inline int32_t qsum(vi v) {
    __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4e));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xb1));
    return _mm_cvtsi128_si32(a);
}
#endif

/* Weight types: fp16 or int8 weights with fp32 activations; int8 weights with int8 activations
 * (one scale per row, absmax / 127). */
enum { W_F16 = 0, W_I8 = 1, W_Q8 = 2 };

static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

/* ---- linear layers: y[m, n] (+)= scale[n] * dot(x[m], w[n]) + bias[n] ---------------------- */

typedef struct {
    int type;              /* W_F16, W_I8 or W_Q8 */
    const void *w;         /* [N, K] row-major */
    const float *scale;    /* [N] (int8 weights) or NULL */
    const float *bias;     /* [N] or NULL */
    const int32_t *colsum; /* [N] sum of each int8 weight row (W_Q8: takes Q_OFFSET back) */
    int n, k;              /* w: packed tiles (see below) of N rows of K */
} Linear;

/* Weights are packed in tiles of NR rows (the last one padded with zero rows), each tile one
 * contiguous run that the kernel reads front to back: per step of CH values along K, the NR
 * rows' CH values side by side, then the rows' K % CH tails one after another. One stream per
 * thread: four rows read side by side as four streams ran at half the memory's read rate.
 * CH = VW for float activations, QW for int8 ones (`sp_chunk`). */

/* One tile of R rows x NR columns of a float dot; every accumulator runs the same sequence. */
#define TILE(NAME, R, WT, LOAD, CONV)                                                                  \
    static inline void NAME(const float *x, int ldx, const WT *w, int K, float *out) {                \
        vf acc[R][NR];                                                                                  \
        for (int i = 0; i < R; i++)                                                                     \
            for (int j = 0; j < NR; j++) acc[i][j] = vzero();                                           \
        int k = 0;                                                                                      \
        for (; k + VW <= K; k += VW, w += NR * VW) {                                                    \
            vf wv[NR];                                                                                  \
            for (int j = 0; j < NR; j++) wv[j] = LOAD(w + j * VW);                                      \
            for (int i = 0; i < R; i++) {                                                               \
                vf xv = vload(x + (size_t)i * ldx + k);                                                 \
                for (int j = 0; j < NR; j++) acc[i][j] = vfma(xv, wv[j], acc[i][j]);                    \
            }                                                                                           \
        }                                                                                               \
        const int tail = K - k;                                                                         \
        for (int i = 0; i < R; i++)                                                                     \
            for (int j = 0; j < NR; j++) {                                                              \
                float s = vsum(acc[i][j]);                                                              \
                for (int t = 0; t < tail; t++) s = fmaf(x[(size_t)i * ldx + k + t], CONV(w[j * tail + t]), s); \
                out[i * NR + j] = s;                                                                    \
            }                                                                                           \
    }

/* The same over int8 activations and weights: an int32 sum, exact whatever the order. */
#define TILEQ(NAME, R)                                                                                 \
    static inline void NAME(const int8_t *x, int ldx, const int8_t *w, int K, float *out) {           \
        vi acc[R][NR];                                                                                  \
        for (int i = 0; i < R; i++)                                                                     \
            for (int j = 0; j < NR; j++) acc[i][j] = qzero();                                           \
        int k = 0;                                                                                      \
        for (; k + QW <= K; k += QW, w += NR * QW) {                                                    \
            vi wv[NR];                                                                                  \
            for (int j = 0; j < NR; j++) wv[j] = qload_w(w + j * QW);                                   \
            for (int i = 0; i < R; i++) {                                                               \
                vi xv = qload_x(x + (size_t)i * ldx + k);                                               \
                for (int j = 0; j < NR; j++) acc[i][j] = qdot(acc[i][j], xv, wv[j]);                    \
            }                                                                                           \
        }                                                                                               \
        const int tail = K - k;                                                                         \
        for (int i = 0; i < R; i++)                                                                     \
            for (int j = 0; j < NR; j++) {                                                              \
                int32_t s = qsum(acc[i][j]);                                                            \
                for (int t = 0; t < tail; t++) s += (x[(size_t)i * ldx + k + t] + Q_OFFSET) * w[j * tail + t]; \
                out[i * NR + j] = (float)s;                                                             \
            }                                                                                           \
    }

#define I8CONV(v) ((float)(v))
TILE(tile_f16_full, MR, uint16_t, load_f16, f16_to_f32)
TILE(tile_f16_row, 1, uint16_t, load_f16, f16_to_f32)
TILE(tile_i8_full, MR, int8_t, load_i8, I8CONV)
TILE(tile_i8_row, 1, int8_t, load_i8, I8CONV)
TILEQ(tile_q8_full, MR)
TILEQ(tile_q8_row, 1)

/* x: fp32 rows (W_F16, W_I8) or the int8 rows of `quantize_row` (W_Q8, then xs: their scales). */
typedef struct {
    const float *x;
    const int8_t *q;
    const float *xs;
    int ldx;
} Rows;

static inline void store(const Linear *L, const Rows *X, float *y, int m, int n, float s, int accumulate) {
    if (L->type == W_Q8) s = (s - (float)(Q_OFFSET * L->colsum[n])) * X->xs[m];
    if (L->scale) s *= L->scale[n];
    if (L->bias) s += L->bias[n];
    float *dst = y + (size_t)m * L->n + n;
    *dst = accumulate ? *dst + s : s;
}

/* Rows m..m+R-1 (R = MR, or 1) of weight tile b into out [R, NR]. */
static inline void tile(const Linear *L, const Rows *X, int m, int b, int R, float *out) {
    const int K = L->k;
    const size_t at = (size_t)b * NR * K;
    if (L->type == W_Q8) {
        const int8_t *x = X->q + (size_t)m * X->ldx, *w = (const int8_t *)L->w + at;
        if (R == MR) tile_q8_full(x, X->ldx, w, K, out);
        else tile_q8_row(x, X->ldx, w, K, out);
    } else if (L->type == W_F16) {
        const float *x = X->x + (size_t)m * X->ldx;
        const uint16_t *w = (const uint16_t *)L->w + at;
        if (R == MR) tile_f16_full(x, X->ldx, w, K, out);
        else tile_f16_row(x, X->ldx, w, K, out);
    } else {
        const float *x = X->x + (size_t)m * X->ldx;
        const int8_t *w = (const int8_t *)L->w + at;
        if (R == MR) tile_i8_full(x, X->ldx, w, K, out);
        else tile_i8_row(x, X->ldx, w, K, out);
    }
}

/* Weight tile b (columns b * NR ..) for every row: MR-row tiles, then single rows. */
static void columns(const Linear *L, const Rows *X, int M, float *y, int b, int accumulate) {
    float out[MR * NR];
    const int n0 = b * NR, C = L->n - n0 < NR ? L->n - n0 : NR;
    int m = 0;
    for (; m + MR <= M; m += MR) {
        tile(L, X, m, b, MR, out);
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < C; j++) store(L, X, y, m + i, n0 + j, out[i * NR + j], accumulate);
    }
    for (; m < M; m++) {
        tile(L, X, m, b, 1, out);
        for (int j = 0; j < C; j++) store(L, X, y, m, n0 + j, out[j], accumulate);
    }
}

/* Per row: q = round(x / s) in [-127, 127], s = absmax / 127 (0 rows stay 0). */
static void quantize_row(const float *x, int k, int8_t *q, float *scale) {
    float top = 0.0f;
    for (int i = 0; i < k; i++) top = fmaxf(top, fabsf(x[i]));
    const float inv = top > 0.0f ? 127.0f / top : 0.0f;
    for (int i = 0; i < k; i++) q[i] = (int8_t)fminf(fmaxf(nearbyintf(x[i] * inv), -127.0f), 127.0f);
    *scale = top / 127.0f;
}

/* y [M, N] (+)= x [M, K] (rows ldx apart) . w^T; called inside a parallel region: the columns
 * are shared out, so each output is computed by one thread, in the one order. W_Q8 first
 * quantizes the rows into `work` (M * K bytes, then M floats). */
static void linear_par(const Linear *L, const float *x, int ldx, int M, float *y, int accumulate, void *work) {
    Rows X = {x, NULL, NULL, ldx};
    if (L->type == W_Q8) {
        int8_t *q = (int8_t *)work;
        float *xs = (float *)(q + (((size_t)M * L->k + 63) & ~(size_t)63));
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) quantize_row(x + (size_t)m * ldx, L->k, q + (size_t)m * L->k, xs + m);
        X.q = q, X.xs = xs, X.ldx = L->k;
    }
    const int tiles = (L->n + NR - 1) / NR;
#pragma omp for schedule(static)
    for (int b = 0; b < tiles; b++) columns(L, &X, M, y, b, accumulate);
}

static size_t work_bytes(int m, int k) { return (((size_t)m * k + 63) & ~(size_t)63) + (size_t)m * sizeof(float); }

void sp_linear(int type, const void *w, const float *scale, const float *bias, const int32_t *colsum, int n, int k,
               const float *x, int m, float *y, int accumulate) {
    Linear L = {type, w, scale, bias, colsum, n, k};
    void *work = type == W_Q8 ? malloc(work_bytes(m, k)) : NULL;
#pragma omp parallel
    linear_par(&L, x, k, m, y, accumulate, work);
    free(work);
}

/* ---- elementwise pieces ---------------------------------------------------------------------- */

/* exp by range reduction and a degree-6 polynomial (Cephes' expf): one fixed formula, so the
 * same input gives the same bits in every row and every call; relative error ~1e-7. */
static inline float sp_exp(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two = {.i = ((int32_t)n + 127) << 23};
    return p * two.f;
}

static inline float dot(const float *a, const float *b, int n) {
    vf acc = vzero();
    int k = 0;
    for (; k + VW <= n; k += VW) acc = vfma(vload(a + k), vload(b + k), acc);
    float s = vsum(acc);
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] */
static void rms_norm(const float *x, const float *w, float *out, int n, float eps) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* rotate-half rotary of one head vector in place; sin is signed (its first half negated). */
static inline void rotate(float *v, const float *cos, const float *sin, int d) {
    const int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] + b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* ---- the decoder stack ----------------------------------------------------------------------- */

/* A layer's row of addresses: per linear (q/k/v, o, gate/up, down) weight, scale, bias, column
 * sums; then the two norms. */
enum { P_QKV = 0, P_O = 4, P_GU = 8, P_DOWN = 12, P_NORM1 = 16, P_NORM2 = 17, P_COUNT = 18 };
enum { D_TYPE, D_HIDDEN, D_HEADS, D_KV_HEADS, D_HEAD_DIM, D_INTER, D_WIDTH, D_COUNT };

typedef struct {
    int hidden, heads, kv, hd, inter, width, qkv_n, T;
    float eps, scale;
    const float *cos, *sin;
    const int *batch, *slot, *pos, *prefix, *path_off, *path;
    float *x, *h, *qkv, *att, *gu, *scores; /* scratch; scores: [threads, width] */
    void *work;                             /* int8 rows of W_Q8 linears */
} Step;

static Linear linear_of(const int64_t *p, int type, int n, int k) {
    Linear L = {type, (const void *)p[0], (const float *)p[1], (const float *)p[2], (const int32_t *)p[3], n, k};
    return L;
}

/* Attention of block row t, query head h over its visible slots: slots 0..prefix-1, then its
 * path (a chain row: none; a tree row: its ancestors and itself, in depth order), in order. */
static void attend(const Step *S, const float *cache, int t, int h, float *scores) {
    const int D = S->hd, kv = h / (S->heads / S->kv), b = S->batch[t];
    const float *q = S->qkv + (size_t)t * S->qkv_n + (size_t)h * D;
    const float *keys = cache + ((size_t)b * 2 * S->kv + kv) * S->width * D;
    const float *values = cache + ((size_t)b * 2 * S->kv + S->kv + kv) * S->width * D;
    const int prefix = S->prefix[t];
    const int *path = S->path ? S->path + S->path_off[t] : NULL;
    const int count = prefix + (S->path ? S->path_off[t + 1] - S->path_off[t] : 0);
    float top = -INFINITY;
    for (int j = 0; j < count; j++) {
        int slot = j < prefix ? j : path[j - prefix];
        float s = dot(q, keys + (size_t)slot * D, D) * S->scale;
        scores[j] = s;
        top = fmaxf(top, s);
    }
    for (int j = 0; j < count; j++) scores[j] = sp_exp(scores[j] - top);
    float total = 0.0f;
    for (int j = 0; j < count; j++) total += scores[j];
    float *out = S->att + (size_t)t * S->heads * D + (size_t)h * D;
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int j = 0; j < count; j++) {
        int slot = j < prefix ? j : path[j - prefix];
        const float *v = values + (size_t)slot * D;
        const float p = scores[j];
        for (int i = 0; i < D; i++) out[i] = fmaf(p, v[i], out[i]);
    }
    const float inv = 1.0f / total;
    for (int i = 0; i < D; i++) out[i] *= inv;
}

static void layer(const Step *S, const int64_t *p, float *cache, int type) {
    const int T = S->T, H = S->hidden, D = S->hd, I = S->inter;
    Linear qkv = linear_of(p + P_QKV, type, S->qkv_n, H);
    Linear wo = linear_of(p + P_O, type, H, S->heads * D);
    Linear gu = linear_of(p + P_GU, type, 2 * I, H);
    Linear down = linear_of(p + P_DOWN, type, H, I);
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) rms_norm(S->x + (size_t)t * H, (const float *)p[P_NORM1], S->h + (size_t)t * H, H, S->eps);
    linear_par(&qkv, S->h, H, T, S->qkv, 0, S->work);
    /* rotary on q and k, then k and v into the cache at the row's slot (all rows before any
     * row attends: a block's rows see each other's keys) */
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
        float *row = S->qkv + (size_t)t * S->qkv_n;
        const float *c = S->cos + (size_t)S->pos[t] * D, *s = S->sin + (size_t)S->pos[t] * D;
        for (int head = 0; head < S->heads + S->kv; head++) rotate(row + (size_t)head * D, c, s, D);
        const size_t base = (size_t)S->batch[t] * 2 * S->kv;
        for (int j = 0; j < 2 * S->kv; j++)
            memcpy(cache + ((base + j) * S->width + S->slot[t]) * D, row + (size_t)(S->heads + j) * D, D * sizeof(float));
    }
    float *scores = S->scores + (size_t)omp_get_thread_num() * S->width;
#pragma omp for schedule(static)
    for (int th = 0; th < T * S->heads; th++) attend(S, cache, th / S->heads, th % S->heads, scores);
    linear_par(&wo, S->att, S->heads * D, T, S->x, 1, S->work);
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) rms_norm(S->x + (size_t)t * H, (const float *)p[P_NORM2], S->h + (size_t)t * H, H, S->eps);
    linear_par(&gu, S->h, H, T, S->gu, 0, S->work);
    /* SiLU(gate) * up over the gate half of each [2I] row; down reads it at row stride 2I */
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
        float *g = S->gu + (size_t)t * 2 * I, *u = g + I;
        for (int i = 0; i < I; i++) g[i] = g[i] / (1.0f + sp_exp(-g[i])) * u[i];
    }
    linear_par(&down, S->gu, 2 * I, T, S->x, 1, S->work);
}

/* The decoder layers and the final norm over T rows, in one parallel region.
 * layers [L, P_COUNT]: addresses (0: none); caches [L]: each layer's [B, 2 kv heads, width, D]
 * float32 cache, keys then values; dims [D_COUNT]; rows [4, T]: per row its batch
 * row, cache slot, rotary position and visible prefix; path_off [T + 1] / path: per row the
 * slots it sees past its prefix, in order (NULL: none); taps: copy x after layer tap_layer[i]
 * into tap_out[i] ([T, H]). x [T, H] in place: on return the final norm's output. */
int sp_stack(const int64_t *layers, const int64_t *caches, int L, const int *dims, float eps, const float *cos, const float *sin,
             const float *final_norm, int T, float *x, const int *rows, const int *path_off, const int *path, int ntaps,
             const int *tap_layer, const int64_t *tap_out) {
    Step S;
    S.hidden = dims[D_HIDDEN], S.heads = dims[D_HEADS], S.kv = dims[D_KV_HEADS], S.hd = dims[D_HEAD_DIM];
    S.inter = dims[D_INTER], S.width = dims[D_WIDTH], S.qkv_n = (S.heads + 2 * S.kv) * S.hd, S.T = T;
    S.eps = eps, S.scale = 1.0f / sqrtf((float)S.hd), S.cos = cos, S.sin = sin;
    S.batch = rows, S.slot = rows + T, S.pos = rows + 2 * T, S.prefix = rows + 3 * T;
    S.path_off = path_off, S.path = path, S.x = x;
    const int threads = omp_get_max_threads();
    const size_t need = (size_t)T * (S.hidden + S.qkv_n + S.heads * S.hd + 2 * S.inter) + (size_t)threads * S.width;
    int widest = S.hidden > S.inter ? S.hidden : S.inter;
    widest = widest > S.heads * S.hd ? widest : S.heads * S.hd;
    float *scratch = (float *)malloc(need * sizeof(float) + work_bytes(T, widest) + 64);
    if (!scratch) return 1;
    S.work = (void *)(((uintptr_t)(scratch + need) + 63) & ~(uintptr_t)63);
    S.h = scratch, S.qkv = S.h + (size_t)T * S.hidden, S.att = S.qkv + (size_t)T * S.qkv_n;
    S.gu = S.att + (size_t)T * S.heads * S.hd, S.scores = S.gu + (size_t)T * 2 * S.inter;
    const int type = dims[D_TYPE];
#pragma omp parallel num_threads(threads)
    {
        for (int l = 0; l < L; l++) {
            layer(&S, layers + (size_t)l * P_COUNT, (float *)caches[l], type);
            for (int i = 0; i < ntaps; i++)
                if (tap_layer[i] == l) {
#pragma omp single
                    memcpy((float *)tap_out[i], x, (size_t)T * S.hidden * sizeof(float));
                }
        }
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) rms_norm(x + (size_t)t * S.hidden, final_norm, x + (size_t)t * S.hidden, S.hidden, eps);
    }
    free(scratch);
    return 0;
}

int sp_lanes(void) { return VW; }

/* Values per packing step along K for weights of `type` (see the packing above), and columns per tile. */
int sp_chunk(int type) { return type == W_Q8 ? QW : VW; }
int sp_tile_columns(void) { return NR; }
