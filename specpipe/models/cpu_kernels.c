/* specpipe's CPU decode kernels: the native forward of a Llama-family decoder in one call per
 * step, fp32 activations between layers, fp16, int8 or 4-bit weights (see cpu_kernels.py, which
 * compiles and loads it, and engine/native_fused.py, which drives the stack).
 *
 * Why C: a torch step of a 30-layer model is ~600 small ops whose dispatch costs as much as the
 * weights take to stream, and torch's fp16 GEMM (fbgemm) reads them at ~60% of the machine's
 * bandwidth. Here a layer is one pass: norm, fused q/k/v, rotary, cache write, attention, output
 * projection, norm, gate/up, SiLU, down, in one OpenMP region per step.
 *
 * Exact by construction: a vector lane of a linear layer is one output column, summing its
 * products in K order (float) or in int32 (int8 activations) and then its groups in order,
 * whatever the number of rows, the tile a row falls in or the thread that computes it; every
 * attention row sums over its visible slots in slot order, as a one-token step does. So each row
 * of a k-token verify block is bitwise equal to a one-token forward of that token. Rows are
 * independent: a batch row never reads another row's data. Built with -ffp-contract=off: a
 * multiply-add is fused only where an FMA is written, the same at every call site.
 *
 * Built with -march=native: AVX-512 (16 lanes; VNNI where the CPU has it) where the CPU has it,
 * else AVX2 + FMA + F16C (8 lanes); without those it does not build and the engine keeps torch's
 * kernels.
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

/* Vectors of fp32 lanes: 16 with AVX-512, 8 with AVX2. A float tile is NV vectors of columns by
 * up to MR rows: MR * NV accumulators, NV weight vectors and one broadcast input in registers. */
#if defined(__AVX512F__)
#define VW 16
#define NV 4
#define MR 6 /* 24 accumulators + 4 weights + 1 input of 32 zmm */
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vbcast(const float *p) { return _mm512_set1_ps(*p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vf vfloor(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
static inline vf vpow2i(vf n) { /* 2^n for integral n in [-127, 127] */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vset(float a) { return _mm512_set1_ps(a); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline float vsum(vf v) { /* fixed folding: 16 -> 8 -> 4 -> 2 -> 1 */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#else
#define VW 8
#define NV 4
#define MR 2 /* 8 accumulators + 4 weights + 1 input of 16 ymm */
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vbcast(const float *p) { return _mm256_broadcast_ss(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf vfloor(vf v) { return _mm256_floor_ps(v); }
static inline vf vpow2i(vf n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vset(float a) { return _mm256_set1_ps(a); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline float vsum(vf v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#endif
#define TC (NV * VW) /* columns of a float tile */

/* int8 x int8 products summed in int32 lanes, each lane one column: exact in any order. With
 * AVX512-VNNI, vpdpbusd takes KP = 4 values of K a lane (u8 activations, offset by +128 and
 * the weights' group sums taken back); else vpmaddwd on int16 pairs (KP = 2). */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KP 4
#define QL 16 /* int32 lanes */
#define NQ 4
#define MQ 4
#define Q_OFFSET 128
typedef __m512i vi;
typedef uint8_t qx_t;
static inline vi qzero(void) { return _mm512_setzero_si512(); }
static inline vi qload_acc(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi qload_w(const int8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi qbcast(const qx_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
static inline vi qdot(vi acc, vi x, vi w) { return _mm512_dpbusd_epi32(acc, x, w); }
static inline vf qfloat(vi v) { return _mm512_cvtepi32_ps(v); }
static inline qx_t qstore_x(int q) { return (qx_t)(q + Q_OFFSET); }
#elif defined(__AVX512F__)
#define KP 2
#define QL 16
#define NQ 2
#define MQ 4
#define Q_OFFSET 0
typedef __m512i vi;
typedef int16_t qx_t;
static inline vi qzero(void) { return _mm512_setzero_si512(); }
static inline vi qload_acc(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi qload_w(const int8_t *p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
static inline vi qbcast(const qx_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
static inline vi qdot(vi acc, vi x, vi w) { return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w)); }
static inline vf qfloat(vi v) { return _mm512_cvtepi32_ps(v); }
static inline qx_t qstore_x(int q) { return (qx_t)q; }
#else
#define KP 2
#define QL 8
#define NQ 2
#define MQ 2
#define Q_OFFSET 0
typedef __m256i vi;
typedef int16_t qx_t;
static inline vi qzero(void) { return _mm256_setzero_si256(); }
static inline vi qload_acc(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi qload_w(const int8_t *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }
static inline vi qbcast(const qx_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
static inline vi qdot(vi acc, vi x, vi w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w)); }
static inline vf qfloat(vi v) { return _mm256_cvtepi32_ps(v); }
static inline qx_t qstore_x(int q) { return (qx_t)q; }
#endif
#define TQ (NQ * QL) /* columns of an int8 tile */
#define GROUP 64     /* values of K sharing one activation scale (as llama.cpp's q8 blocks share one) */

/* 4-bit weights (W_Q4): unsigned nibbles q in [0, 15], w = d * q + m per column and WGROUP values
 * of K (llama.cpp's Q4_1 blocks: the zoo's SmolLM2 weights come back on their own grid). A byte
 * holds two values of K four apart, so one load feeds two int8 dot steps of four values each;
 * the nibbles are the unsigned operand, the activations (int8, no offset) the signed one:
 * vpdpbusd with AVX512-VNNI, else vpmaddubsw (15 x 127 x 2 fits int16) and vpmaddwd. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define Q4L 16
typedef __m512i v4;
static inline v4 q4_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline v4 q4_low(v4 v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
static inline v4 q4_high(v4 v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
static inline v4 q4_bcast(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
static inline v4 q4_zero(void) { return _mm512_setzero_si512(); }
static inline vf q4_float(v4 v) { return _mm512_cvtepi32_ps(v); }
#if defined(__AVX512VNNI__)
static inline v4 q4_dot(v4 acc, v4 w, v4 x) { return _mm512_dpbusd_epi32(acc, w, x); }
#else
static inline v4 q4_dot(v4 acc, v4 w, v4 x) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}
#endif
#define N4 2
/* Up to 9 rows a pass (a γ = 8 verify): 18 int sums + 4 nibble vectors + 2 inputs of 32 zmm, the
 * float sums spilled beyond 5 rows. One pass over a tile computes its rows while the tile streams
 * in from memory; a 9-row block in two passes (5 + 4) spent ~15% of its time re-reading tiles
 * from L2 for the second (Qwen2.5-1.5B, perf). */
#define M4 9
#else
#define Q4L 8
typedef __m256i v4;
static inline v4 q4_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline v4 q4_low(v4 v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline v4 q4_high(v4 v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
static inline v4 q4_bcast(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
static inline v4 q4_zero(void) { return _mm256_setzero_si256(); }
static inline vf q4_float(v4 v) { return _mm256_cvtepi32_ps(v); }
static inline v4 q4_dot(v4 acc, v4 w, v4 x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
#define N4 2
#define M4 3 /* 6 int sums + 4 nibble vectors + 2 inputs of 16 ymm */
#endif
#define T4 (N4 * Q4L) /* columns of a 4-bit tile */
#define WGROUP 32      /* values of K sharing one 4-bit d and m (two to an activation group) */
#define Q4_BLOCK_BYTES (T4 * WGROUP / 2 + T4 * 4) /* a tile's block: nibbles, then d and m in fp16 */

/* Weight types: fp16 or int8 weights with fp32 activations; int8 or 4-bit weights with int8
 * activations (one scale per GROUP values of a row, absmax / 127). */
enum { W_F16 = 0, W_I8 = 1, W_Q8 = 2, W_Q4 = 3 };

/* max, min and rounding written out: libm's fmaxf / fminf are calls (NaN rules), these vectorize */
static inline float max_f(float a, float b) { return a > b ? a : b; }
static inline float min_f(float a, float b) { return a < b ? a : b; }

/* ---- linear layers: y[m, n] (+)= scale[n] * sum_k x[m, k] w[n, k] + bias[n] ----------------- *
 * Weights are packed in tiles of columns (TC, or TQ for W_Q8; zero columns pad the last), each
 * tile one contiguous run read front to back (one memory stream a thread: four rows read side by
 * side ran at half the read rate): float tiles [K][TC], int8 tiles [K / KP][TQ][KP] (K padded
 * to GROUP). A vector lane is one column and sums its products in K order (float), or in int32
 * (int8): so each output is computed alike whatever the row count, the tile its row falls in or
 * the thread; no horizontal sums. The rows' broadcast inputs are reused by all NV vectors. */

typedef struct {
    int type;              /* W_F16, W_I8, W_Q8 or W_Q4 */
    const void *w;         /* packed tiles */
    const float *scale;    /* [N] per-column weight scale (int8 weights) or NULL */
    const float *bias;     /* [N] or NULL */
    const int32_t *offset; /* W_Q8 where Q_OFFSET: per tile [groups][TQ], each group's int32 start,
                              -Q_OFFSET x the group's weight sum (takes the activations' offset back) */
    const float *mins;     /* unused (W_Q4's d and m lie in its tiles, fp16, beside the nibbles they scale) */
    int n, k;
} Linear;

/* float tiles: rows x[0..R) (ldx apart) by TC columns, into acc[R][NV] */
#define FTILE(NAME, R, WT, LOAD)                                                                       \
    static void NAME(const float *x, int ldx, const WT *w, int K, vf *out) {                          \
        vf acc[R][NV];                                                                                  \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < NV; v++) acc[i][v] = vzero();                                           \
        for (int k = 0; k < K; k++, w += TC) {                                                          \
            vf wv[NV];                                                                                  \
            for (int v = 0; v < NV; v++) wv[v] = LOAD(w + v * VW);                                      \
            for (int i = 0; i < R; i++) {                                                               \
                vf xb = vbcast(x + (size_t)i * ldx + k);                                                \
                for (int v = 0; v < NV; v++) acc[i][v] = vfma(xb, wv[v], acc[i][v]);                    \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < NV; v++) out[i * NV + v] = acc[i][v];                                   \
    }

/* int8 tiles: per GROUP an int32 sum, then scaled by the row's group scale into a float sum
 * (groups in order); out[R][NQ] */
#define QTILE(NAME, R)                                                                                 \
    static void NAME(const qx_t *x, int ldx, const float *xs, int groups, const int8_t *w,           \
                     const int32_t *offset, vf *out) {                                                 \
        vf sum[R][NQ];                                                                                  \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < NQ; v++) sum[i][v] = vzero();                                           \
        for (int g = 0; g < groups; g++) {                                                              \
            vi acc[R][NQ];                                                                              \
            for (int v = 0; v < NQ; v++) {                                                              \
                vi start = offset ? qload_acc(offset + (size_t)g * TQ + v * QL) : qzero();              \
                for (int i = 0; i < R; i++) acc[i][v] = start;                                          \
            }                                                                                           \
            for (int k = g * GROUP; k < (g + 1) * GROUP; k += KP, w += TQ * KP) {                       \
                vi wv[NQ];                                                                              \
                for (int v = 0; v < NQ; v++) wv[v] = qload_w(w + v * QL * KP);                          \
                for (int i = 0; i < R; i++) {                                                           \
                    vi xb = qbcast(x + (size_t)i * ldx + k);                                            \
                    for (int v = 0; v < NQ; v++) acc[i][v] = qdot(acc[i][v], xb, wv[v]);                \
                }                                                                                       \
            }                                                                                           \
            for (int i = 0; i < R; i++) {                                                               \
                vf s = vbcast(xs + (size_t)i * groups + g);                                             \
                for (int v = 0; v < NQ; v++) sum[i][v] = vfma(qfloat(acc[i][v]), s, sum[i][v]);         \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < NQ; v++) out[i * NQ + v] = sum[i][v];                                   \
    }

typedef void (*ftile_fn)(const float *, int, const void *, int, vf *);
typedef void (*qtile_fn)(const qx_t *, int, const float *, int, const int8_t *, const int32_t *, vf *);
FTILE(f16_1, 1, uint16_t, load_f16)
FTILE(f16_2, 2, uint16_t, load_f16)
FTILE(i8_1, 1, int8_t, load_i8)
FTILE(i8_2, 2, int8_t, load_i8)
QTILE(q8_1, 1)
QTILE(q8_2, 2)
#if MR > 2
FTILE(f16_3, 3, uint16_t, load_f16)
FTILE(f16_4, 4, uint16_t, load_f16)
FTILE(f16_5, 5, uint16_t, load_f16)
FTILE(f16_6, 6, uint16_t, load_f16)
FTILE(i8_3, 3, int8_t, load_i8)
FTILE(i8_4, 4, int8_t, load_i8)
FTILE(i8_5, 5, int8_t, load_i8)
FTILE(i8_6, 6, int8_t, load_i8)
static const ftile_fn F16_TILES[MR + 1] = {0, (ftile_fn)f16_1, (ftile_fn)f16_2, (ftile_fn)f16_3, (ftile_fn)f16_4,
                                           (ftile_fn)f16_5, (ftile_fn)f16_6};
static const ftile_fn I8_TILES[MR + 1] = {0, (ftile_fn)i8_1, (ftile_fn)i8_2, (ftile_fn)i8_3, (ftile_fn)i8_4,
                                          (ftile_fn)i8_5, (ftile_fn)i8_6};
#else
static const ftile_fn F16_TILES[MR + 1] = {0, (ftile_fn)f16_1, (ftile_fn)f16_2};
static const ftile_fn I8_TILES[MR + 1] = {0, (ftile_fn)i8_1, (ftile_fn)i8_2};
#endif
#if MQ > 2
QTILE(q8_3, 3)
QTILE(q8_4, 4)
static const qtile_fn Q8_TILES[MQ + 1] = {0, q8_1, q8_2, q8_3, q8_4};
#else
static const qtile_fn Q8_TILES[MQ + 1] = {0, q8_1, q8_2};
#endif

/* `bytes` at w + ahead into L2 (ahead 0: none): called at each step of a pass over a 4-bit tile
 * with the bytes the step reads, the last pass over a tile fetches the next tile at the pace it
 * reads its own. The hardware prefetcher follows one stream, but a block of more rows than a pass
 * takes makes several passes over a tile (small enough to stay in L1), each jumping back to its
 * start, and the next tile's stream started only when the last pass ended: a 9-row linear ran a
 * quarter slower. (int8 tiles, too wide for L1, gained nothing from it.) */
static inline void fetch_ahead(const void *w, long ahead, int bytes) {
    if (ahead)
        for (int line = 0; line < bytes; line += 64) _mm_prefetch((const char *)w + ahead + line, _MM_HINT_T1);
}

/* 4-bit tiles: per WGROUP, int32 sums of q x (eight values of K a load), then per lane
 * d q.x + m sum(x), scaled by the row's activation scale into a float sum (groups in order).
 * A tile is one stream: per block its nibbles ([4][T4][4] bytes), then its d and m (T4 fp16 each). */
#define Q4TILE(NAME, R)                                                                                \
    static void NAME(const int8_t *x, int ldx, const float *xs, const float *xsum, int groups,         \
                     const uint8_t *w, vf *out, long ahead) {                                          \
        vf sums[R][N4]; /* the float sums: registers beside the int ones, written out once */          \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < N4; v++) sums[i][v] = vzero();                                          \
        const int blocks = groups * (GROUP / WGROUP);                                                   \
        for (int g = 0; g < blocks; g++) {                                                              \
            v4 acc[R][N4];                                                                              \
            for (int i = 0; i < R; i++)                                                                 \
                for (int v = 0; v < N4; v++) acc[i][v] = q4_zero();                                     \
            for (int k = g * WGROUP; k < (g + 1) * WGROUP; k += 8, w += T4 * 4) {                       \
                v4 lo[N4], hi[N4];                                                                      \
                fetch_ahead(w, ahead, T4 * 4);                                                         \
                for (int v = 0; v < N4; v++) {                                                          \
                    v4 raw = q4_load(w + v * Q4L * 4);                                                  \
                    lo[v] = q4_low(raw), hi[v] = q4_high(raw);                                          \
                }                                                                                       \
                for (int i = 0; i < R; i++) {                                                           \
                    v4 xa = q4_bcast(x + (size_t)i * ldx + k), xb = q4_bcast(x + (size_t)i * ldx + k + 4); \
                    for (int v = 0; v < N4; v++) acc[i][v] = q4_dot(q4_dot(acc[i][v], lo[v], xa), hi[v], xb); \
                }                                                                                       \
            }                                                                                           \
            fetch_ahead(w, ahead, T4 * 4);                                                             \
            const uint16_t *d = (const uint16_t *)w, *mins = d + T4;                                    \
            w += T4 * 4;                                                                                \
            for (int v = 0; v < N4; v++) {                                                              \
                vf dv = load_f16(d + v * Q4L), mv = load_f16(mins + v * Q4L);                           \
                for (int i = 0; i < R; i++) {                                                           \
                    vf part = vfma(q4_float(acc[i][v]), dv, vmul(mv, vbcast(xsum + (size_t)i * blocks + g))); \
                    sums[i][v] = vfma(part, vset(xs[(size_t)i * groups + g / (GROUP / WGROUP)]), sums[i][v]); \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < R; i++)                                                                     \
            for (int v = 0; v < N4; v++) out[i * N4 + v] = sums[i][v];                                  \
    }

typedef void (*q4tile_fn)(const int8_t *, int, const float *, const float *, int, const uint8_t *, vf *, long);
Q4TILE(q4_1, 1)
Q4TILE(q4_2, 2)
Q4TILE(q4_3, 3)
#if M4 > 3
Q4TILE(q4_4, 4)
Q4TILE(q4_5, 5)
Q4TILE(q4_6, 6)
Q4TILE(q4_7, 7)
Q4TILE(q4_8, 8)
Q4TILE(q4_9, 9)
static const q4tile_fn Q4_TILES[M4 + 1] = {0, q4_1, q4_2, q4_3, q4_4, q4_5, q4_6, q4_7, q4_8, q4_9};
#else
static const q4tile_fn Q4_TILES[M4 + 1] = {0, q4_1, q4_2, q4_3};
#endif

/* x: fp32 rows (W_F16, W_I8) or the int8 rows of `quantize_row` (W_Q8: q, their group scales;
 * W_Q4: signed q4, group scales and group sums). */
typedef struct {
    const float *x;
    const qx_t *q;
    const int8_t *q4;
    const float *xs;
    const float *xsum; /* W_Q4: each block's sum of q, as a float (exact: |sum| <= 32 x 127) */
    int ldx, groups;
} Rows;

/* Columns n0.. of rows m..m+R-1 from vectors acc[R][nv]: y (+)= acc * scale + bias. */
static void store(const Linear *L, float *y, int m, int R, int n0, int nv, const vf *acc, int accumulate) {
    const int width = nv * VW, cols = L->n - n0 < width ? L->n - n0 : width;
    const int scaled = L->scale && L->type != W_Q4; /* 4-bit scales are applied per group in the tile */
    float scale[TC > TQ ? TC : TQ], bias[TC > TQ ? TC : TQ], row[TC > TQ ? TC : TQ];
    for (int j = 0; j < width; j++) {
        scale[j] = scaled && j < cols ? L->scale[n0 + j] : 1.0f;
        bias[j] = L->bias && j < cols ? L->bias[n0 + j] : 0.0f;
    }
    for (int i = 0; i < R; i++) {
        float *dst = y + (size_t)(m + i) * L->n + n0;
        for (int v = 0; v < nv; v++) {
            vf r = acc[i * nv + v];
            if (scaled) r = vmul(r, vload(scale + v * VW));
            if (L->bias) r = vadd(r, vload(bias + v * VW));
            vstore(row + v * VW, r);
        }
        for (int j = 0; j < cols; j++) dst[j] = accumulate ? dst[j] + row[j] : row[j];
    }
}

/* The rows of the next pass over a tile, at most `most`: as many passes as `most` needs, rows
 * shared evenly among them (13 4-bit rows: 7 + 6, not 9 + 4: each pass unpacks the tile once). */
static inline int even_share(int left, int most) {
    const int passes = (left + most - 1) / most;
    return (left + passes - 1) / passes;
}

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

/* Column tile b for every row, MR (MQ, M4) rows at a time. */
static void columns(const Linear *L, const Rows *X, int M, float *y, int b, int accumulate) {
    vf acc[MAX2(MAX2(MR * NV, MQ * NQ), M4 * N4)]; /* the widest tile's sums */
    if (L->type == W_Q4) {
        const size_t blocks = (size_t)X->groups * (GROUP / WGROUP);
        const uint8_t *w = (const uint8_t *)L->w + (size_t)b * blocks * Q4_BLOCK_BYTES;
        for (int m = 0, R; m < M; m += R) {
            R = even_share(M - m, M4);
            const long ahead = m + R >= M ? (long)(blocks * Q4_BLOCK_BYTES) : 0; /* the last pass: the next tile's bytes */
            Q4_TILES[R](X->q4 + (size_t)m * X->ldx, X->ldx, X->xs + (size_t)m * X->groups,
                        X->xsum + (size_t)m * X->groups * (GROUP / WGROUP), X->groups, w, acc, ahead);
            store(L, y, m, R, b * T4, N4, acc, accumulate);
        }
        return;
    }
    if (L->type == W_Q8) {
        const int8_t *w = (const int8_t *)L->w + (size_t)b * TQ * X->groups * GROUP;
        const int32_t *offset = L->offset ? L->offset + (size_t)b * X->groups * TQ : NULL;
        for (int m = 0; m < M; m += MQ) {
            const int R = M - m < MQ ? M - m : MQ;
            Q8_TILES[R](X->q + (size_t)m * X->ldx, X->ldx, X->xs + (size_t)m * X->groups, X->groups, w, offset, acc);
            store(L, y, m, R, b * TQ, NQ, acc, accumulate);
        }
        return;
    }
    const size_t at = (size_t)b * TC * L->k;
    const void *w = L->type == W_F16 ? (const void *)((const uint16_t *)L->w + at) : (const void *)((const int8_t *)L->w + at);
    const ftile_fn *tiles = L->type == W_F16 ? F16_TILES : I8_TILES;
    for (int m = 0; m < M; m += MR) {
        const int R = M - m < MR ? M - m : MR;
        tiles[R](X->x + (size_t)m * X->ldx, X->ldx, w, L->k, acc);
        store(L, y, m, R, b * TC, NV, acc, accumulate);
    }
}

/* The absmax of x[first..last): a max is exact in any order, so VW lanes at a time. */
static float absmax(const float *x, int first, int last) {
    vf wide = vzero();
    int i = first;
    for (; i + VW <= last; i += VW) wide = vmax(wide, vmax(vload(x + i), vsub(vzero(), vload(x + i))));
    float lanes[VW], top = 0.0f;
    vstore(lanes, wide);
    for (int l = 0; l < VW; l++) top = max_f(top, lanes[l]);
    for (; i < last; i++) top = max_f(top, fabsf(x[i]));
    return top;
}

/* round(x * inv), half away from zero, for |x * inv| <= 127 */
static inline int round_q(float x, float inv) {
    const float v = x * inv;
    return (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
}

/* Per GROUP values of a row: q = round(x / s), s = absmax / 127 (an all-zero group: s = 0);
 * the row padded with zeros to whole groups. q8: as W_Q8's tiles read it (offset, width);
 * else q4 (plain int8) and the sum of q over each WGROUP (W_Q4). */
static void quantize_row(const float *x, int k, int groups, qx_t *q8, int8_t *q4, float *sums, float *scales) {
    for (int g = 0; g < groups; g++) {
        const int first = g * GROUP, last = first + GROUP < k ? first + GROUP : k;
        const float top = absmax(x, first, last), inv = top > 0.0f ? 127.0f / top : 0.0f;
        for (int i = first; i < first + GROUP; i++) {
            const int q = i < last ? round_q(x[i], inv) : 0;
            if (q8) q8[i] = qstore_x(q);
            else q4[i] = (int8_t)q;
        }
        scales[g] = top / 127.0f;
    }
    if (sums)
        for (int b = 0; b < groups * (GROUP / WGROUP); b++) {
            int32_t total = 0;
            for (int i = b * WGROUP; i < (b + 1) * WGROUP; i++) total += q4[i];
            sums[b] = (float)total;
        }
}

static inline int groups_of(int k) { return (k + GROUP - 1) / GROUP; }

/* Rows rounded to int8 (as wide as qx_t), then their group scales and sums. */
static size_t rows_bytes(int m, int groups) { return (((size_t)m * groups * GROUP * sizeof(qx_t)) + 63) & ~(size_t)63; }

static size_t work_bytes(int m, int k) {
    const int groups = groups_of(k);
    return rows_bytes(m, groups) + (size_t)m * groups * (sizeof(float) + (GROUP / WGROUP) * sizeof(float));
}

/* y [M, N] (+)= x [M, K] (rows ldx apart) . w^T; called inside a parallel region: the column
 * tiles are shared out, so each output is computed by one thread, in the one order. W_Q8 first
 * quantizes the rows into `work` (`work_bytes`). */
static void linear_par(const Linear *L, const float *x, int ldx, int M, float *y, int accumulate, void *work) {
    Rows X = {x, NULL, NULL, NULL, NULL, ldx, 0};
    int tiles = (L->n + TC - 1) / TC;
    if (L->type == W_Q8 || L->type == W_Q4) {
        const int groups = groups_of(L->k), q4 = L->type == W_Q4;
        float *xs = (float *)((char *)work + rows_bytes(M, groups));
        float *sums = xs + (size_t)M * groups; /* W_Q4: [M][groups * GROUP / WGROUP] */
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            const size_t row = (size_t)m * groups * GROUP;
            quantize_row(x + (size_t)m * ldx, L->k, groups, q4 ? NULL : (qx_t *)work + row, q4 ? (int8_t *)work + row : NULL,
                         q4 ? sums + (size_t)m * groups * (GROUP / WGROUP) : NULL, xs + (size_t)m * groups);
        }
        X.q = (const qx_t *)work, X.q4 = (const int8_t *)work, X.xs = xs, X.xsum = sums;
        X.ldx = groups * GROUP, X.groups = groups;
        tiles = (L->n + (q4 ? T4 : TQ) - 1) / (q4 ? T4 : TQ);
    }
#pragma omp for schedule(static)
    for (int b = 0; b < tiles; b++) columns(L, &X, M, y, b, accumulate);
}

void sp_linear(int type, const void *w, const float *scale, const float *bias, const int32_t *offset, const float *mins,
               int n, int k, const float *x, int m, float *y, int accumulate) {
    Linear L = {type, w, scale, bias, offset, mins, n, k};
    void *work = type == W_Q8 || type == W_Q4 ? malloc(work_bytes(m, k)) : NULL;
#pragma omp parallel
    linear_par(&L, x, k, m, y, accumulate, work);
    free(work);
}

/* ---- elementwise pieces ---------------------------------------------------------------------- */

/* exp by range reduction and a degree-6 polynomial (Cephes' expf), VW lanes at a time: one
 * fixed formula, the same ops in scalar form below (IEEE operations, no contraction), so an input
 * gives the same bits in every lane, row and call; relative error ~1e-7. */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, vset(-87.0f)), vset(88.0f));
    vf n = vfloor(vadd(vmul(x, vset(1.44269504088896341f)), vset(0.5f)));
    vf r = vadd(vsub(x, vmul(n, vset(0.693359375f))), vmul(n, vset(2.12194440e-4f)));
    vf p = vset(1.9875691500e-4f);
    p = vadd(vmul(p, r), vset(1.3981999507e-3f));
    p = vadd(vmul(p, r), vset(8.3334519073e-3f));
    p = vadd(vmul(p, r), vset(4.1665795894e-2f));
    p = vadd(vmul(p, r), vset(1.6666665459e-1f));
    p = vadd(vmul(p, r), vset(5.0000001201e-1f));
    p = vadd(vadd(vmul(vmul(p, r), r), r), vset(1.0f));
    return vmul(p, vpow2i(n));
}

static inline float sp_exp(float x) {
    x = min_f(max_f(x, -87.0f), 88.0f);
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

/* x[i] = exp(x[i] - shift) over n values */
static void exp_shifted(float *x, int n, float shift) {
    int i = 0;
    for (; i + VW <= n; i += VW) vstore(x + i, vexp(vsub(vload(x + i), vset(shift))));
    for (; i < n; i++) x[i] = sp_exp(x[i] - shift);
}

/* g[i] = SiLU(g[i]) * u[i] = g / (1 + exp(-g)) * u */
static void silu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) {
        vf x = vload(g + i);
        vstore(g + i, vmul(vdiv(x, vadd(vset(1.0f), vexp(vsub(vzero(), x)))), vload(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + sp_exp(-g[i])) * u[i];
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

/* A layer's row of addresses: per linear (q/k/v, o, gate/up, down) weight, scale, bias, offset,
 * mins; then the two norms. */
enum { P_QKV = 0, P_O = 5, P_GU = 10, P_DOWN = 15, P_NORM1 = 20, P_NORM2 = 21, P_COUNT = 22 };
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
    Linear L = {type, (const void *)p[0], (const float *)p[1], (const float *)p[2], (const int32_t *)p[3],
                (const float *)p[4], n, k};
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
        top = max_f(top, s);
    }
    exp_shifted(scores, count, top);
    float total = 0.0f;
    for (int j = 0; j < count; j++) total += scores[j];
    const float inv = 1.0f / total;
    float *out = S->att + (size_t)t * S->heads * D + (size_t)h * D;
    /* each output lane sums p_j v_j over the slots in order, in a register (VW lanes at a time) */
    int i = 0;
    for (; i + VW <= D; i += VW) {
        vf acc = vzero();
        for (int j = 0; j < count; j++) {
            const int slot = j < prefix ? j : path[j - prefix];
            acc = vfma(vset(scores[j]), vload(values + (size_t)slot * D + i), acc);
        }
        vstore(out + i, vmul(acc, vset(inv)));
    }
    for (; i < D; i++) {
        float acc = 0.0f;
        for (int j = 0; j < count; j++) acc = fmaf(scores[j], values[(size_t)(j < prefix ? j : path[j - prefix]) * D + i], acc);
        out[i] = acc * inv;
    }
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
    for (int t = 0; t < T; t++) silu_mul(S->gu + (size_t)t * 2 * I, S->gu + (size_t)t * 2 * I + I, I);
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

/* The packing of `type`'s weights (see the linear layers): columns a tile, values of K a lane
 * (1 for float tiles), K padded to a multiple of this, and the offset added to activations. */
int sp_tile_columns(int type) { return type == W_Q4 ? T4 : type == W_Q8 ? TQ : TC; }
int sp_lane_values(int type) { return type == W_Q4 ? 8 : type == W_Q8 ? KP : 1; }
int sp_k_multiple(int type) { return type == W_Q8 || type == W_Q4 ? GROUP : 1; }
int sp_weight_group(void) { return WGROUP; }
int sp_q_offset(void) { return Q_OFFSET; }
