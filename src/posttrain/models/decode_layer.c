/* The work of a decoder layer's decode step besides its matmuls, with AVX2 and FMA: the residual
 * add and RMSNorm before each matmul block, the SwiGLU between the MLP's matmuls, and attention:
 * rotary embedding of the new query and key, the new key and value written into the static KV
 * cache, and grouped-query attention of each query head over its row's cache.
 *
 * Why our own: PyTorch runs this as about 25 operations a layer (an RMSNorm alone is seven, 20 us
 * at one row on a Zen 4 EPYC for 576 values), and its attention as two batched matmuls of a few
 * hundred 3 x 64 x L products per layer that read the cache at 8 GB/s where the memory streams at
 * about 30; at one row that overhead was a third of a bf16 step, at 32 rows a quarter. Here each
 * is one call: the attention reads each KV head's keys and values once, for all the query heads
 * that share them.
 *
 * Activations (the matmuls' inputs and outputs) are float32 or bf16 (`T`, the matmul kernel's);
 * the residual stream, sums and the softmax stay float32. bf16 results are rounded to nearest
 * even, as PyTorch rounds. Layouts are in posttrain.models.decode_layer's docstrings. Threads come
 * from PyTorch's own OpenMP runtime (libgomp.so.1), as in panel_gemm.c.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "simd.h"

typedef float f32;
typedef uint16_t bf16;

static inline __m256 load8_f32(const f32 *p) { return _mm256_loadu_ps(p); }

/* 8 bf16 values widened to float32: a bf16 is the top half of a float32's bits. */
static inline __m256 load8_bf16(const bf16 *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float load1_f32(const f32 *p) { return *p; }

static inline float load1_bf16(const bf16 *p) {
    uint32_t bits = (uint32_t)*p << 16;
    float x;
    __builtin_memcpy(&x, &bits, 4);
    return x;
}

static inline void store1_f32(f32 *p, float x) { *p = x; }

static inline void store1_bf16(bf16 *p, float x) { *p = round_bf16(x); }

static inline void store8_f32(f32 *p, __m256 v) { _mm256_storeu_ps(p, v); }

/* 8 floats rounded to nearest even bf16, as store1_bf16 rounds them. */
static inline void store8_bf16(bf16 *p, __m256 v) {
    __m256i top = round8_bf16(v);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1)));
}

/* Softmax of s[0..n) in place. */
static void softmax(float *s, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (j = 0; j < n; j++) s[j] *= inv;
}

/* The half-split rotary embedding of one head: dst[d] = x[d] cos[d] + x[(d + dim/2) % dim] sin[d],
 * each product rounded before the sum as PyTorch computes it (the file is built without FMA contraction). */
#define ROTATE(TI)                                                                                  \
    static inline void rotate_##TI(const TI *x, const float *cos, const float *sin, int64_t dim,    \
                                   float *dst) {                                                    \
        int64_t half = dim / 2;                                                                     \
        for (int64_t d = 0; d < half; d++)                                                          \
            dst[d] = load1_##TI(x + d) * cos[d] + load1_##TI(x + d + half) * sin[d];                \
        for (int64_t d = half; d < dim; d++)                                                        \
            dst[d] = load1_##TI(x + d) * cos[d] + load1_##TI(x + d - half) * sin[d];                \
    }

ROTATE(f32)
ROTATE(bf16)

/* The four sums of a, b, c and d's lanes, each added in hsum's order (so the same bits as hsum). */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    __m256 u = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 v = _mm256_hadd_ps(u, u); /* [a c a c | b d b d] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

#define INLINE static inline __attribute__((always_inline))
#define HEADS 3   /* query heads a pass of the attention takes at once */
#define COLUMNS 4 /* keys a pass of the scores takes at once */
#define VECTORS 4 /* 8-wide slices of the values a pass of the weighted sum takes at once */

/* The scores of hb <= HEADS query heads q (dim apart) against cb <= COLUMNS keys k (dim apart), scaled, plus
 * the mask b: scores[h * length + c]. 12 sums, hb query vectors and a key vector: the 16 registers. Each
 * dot product is added lane l over d = l, l + 8, ..., then across the lanes in hsum's order. */
#define SCORE(TC)                                                                                   \
    INLINE void score_##TC(int hb, int cb, const float *q, const TC *k, int64_t dim, float scale,     \
                           const float *b, float *scores, int64_t length) {                          \
        __m256 acc[HEADS][COLUMNS];                                                                 \
        for (int h = 0; h < hb; h++)                                                                \
            for (int c = 0; c < cb; c++) acc[h][c] = _mm256_setzero_ps();                           \
        for (int64_t d = 0; d < dim; d += 8) {                                                      \
            __m256 qv[HEADS];                                                                       \
            for (int h = 0; h < hb; h++) qv[h] = _mm256_loadu_ps(q + h * dim + d);                  \
            for (int c = 0; c < cb; c++) {                                                          \
                __m256 kv = load8_##TC(k + c * dim + d);                                            \
                for (int h = 0; h < hb; h++) acc[h][c] = _mm256_fmadd_ps(qv[h], kv, acc[h][c]);     \
            }                                                                                       \
        }                                                                                           \
        for (int h = 0; h < hb; h++) {                                                              \
            if (cb == COLUMNS) {                                                                    \
                __m128 sum = hsum4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);                     \
                _mm_storeu_ps(scores + h * length,                                                  \
                              _mm_add_ps(_mm_mul_ps(sum, _mm_set1_ps(scale)), _mm_loadu_ps(b)));    \
            } else                                                                                  \
                for (int c = 0; c < cb; c++) scores[h * length + c] = hsum(acc[h][c]) * scale + b[c]; \
        }                                                                                           \
    }

/* The weighted sums over columns 0..length-1 of nv <= VECTORS 8-wide slices of the values v (dim apart) for
 * hb <= HEADS heads' probabilities p (length apart), written to o (dim apart); each sum added in the order
 * of the columns. 12 sums, hb probabilities and a value vector: the 16 registers. When next is not NULL,
 * the same columns of the next item's values are asked for as they are reached. */
#define WEIGH(TI, TC)                                                                               \
    INLINE void weigh_##TI##_##TC(int hb, int nv, const float *p, int64_t length, const TC *v, int64_t dim, \
                                  TI *o, const char *next) {                                        \
        __m256 acc[HEADS][VECTORS];                                                                 \
        for (int h = 0; h < hb; h++)                                                                \
            for (int i = 0; i < nv; i++) acc[h][i] = _mm256_setzero_ps();                           \
        for (int64_t j = 0; j < length; j++) {                                                      \
            if (next)                                                                               \
                for (int64_t l = 0; l < dim * (int64_t)sizeof(TC); l += 64)                         \
                    _mm_prefetch(next + j * dim * (int64_t)sizeof(TC) + l, _MM_HINT_T0);            \
            __m256 pj[HEADS];                                                                       \
            for (int h = 0; h < hb; h++) pj[h] = _mm256_set1_ps(p[h * length + j]);                 \
            for (int i = 0; i < nv; i++) {                                                          \
                __m256 vv = load8_##TC(v + j * dim + 8 * i);                                        \
                for (int h = 0; h < hb; h++) acc[h][i] = _mm256_fmadd_ps(pj[h], vv, acc[h][i]);     \
            }                                                                                       \
        }                                                                                           \
        for (int h = 0; h < hb; h++)                                                                \
            for (int i = 0; i < nv; i++) store8_##TI(o + h * dim + 8 * i, acc[h][i]);               \
    }

SCORE(f32)
SCORE(bf16)
WEIGH(f32, f32)
WEIGH(f32, bf16)
WEIGH(bf16, f32)
WEIGH(bf16, bf16)

/* F(hb, ...) with hb a constant (1, 2 or 3: the heads of one pass), for the compiler to unroll. */
_Static_assert(HEADS == 3, "BY_HEADS covers passes of 1 to 3 heads");
#define BY_HEADS(hb, F, ...)                                                                        \
    do {                                                                                            \
        if ((hb) == 3)                                                                              \
            F(3, __VA_ARGS__);                                                                      \
        else if ((hb) == 2)                                                                         \
            F(2, __VA_ARGS__);                                                                      \
        else                                                                                        \
            F(1, __VA_ARGS__);                                                                      \
    } while (0)

/* Attention of one new token per row. qkv [rows, q_heads + 2 kv_heads, dim] (row stride qkv_stride),
 * the projections' output before the rotary embedding; cos and sin [rows, dim] float32 (sin with its
 * first half negated); keys and values [rows, kv_heads, capacity, dim]; bias [rows, capacity], 0 or
 * -inf (left padding); out [rows, q_heads dim]. Column col is written, columns 0..col attended; dim
 * is a multiple of 8. One work item per (row, KV head): its new key and value into the cache, its
 * query heads rotated, their scores over the cache, softmax, and the weighted sum of the values.
 *
 * The query heads that share a KV head go through its keys and values together, up to HEADS at a
 * time, so that each key and value is read (and, from a bf16 cache, widened) once, not once per query
 * head: the keys COLUMNS at a time (12 dot products in registers), the values in slices of VECTORS x 8
 * (12 sums). Each sum is added in the order the one-head-at-a-time loop before it added it: the same
 * bits. On a Zen 3 EPYC (the default model's 30 layers, 32 rows, one process in turns) that made
 * attention over a bf16 cache 1.2-1.35x faster at 40-100 columns and 1.3-1.6x at 400-1550; over a
 * float32 cache, read at the memory's bandwidth either way, 0.92-1.03x at 32 rows, 1.04-1.2x at one
 * or two.
 *
 * While an item's keys are scored, the next item's keys are asked for, and while its values are
 * weighed, the next item's values: they lie in blocks of their own that the hardware's prefetcher only
 * finds once read. On a Zen 4 EPYC (30 layers' attention, 8 to 32 rows over 40 to 100 columns, one
 * process in turns) asking for them made it 1.16-1.27x faster over a float32 cache, 1.37-1.48x over a
 * bf16 one. Asking for only the next item's first 128 columns made 400-1550 columns over a bf16 cache
 * 1.25x slower on the Zen 3.
 * scratch: threads x (group (col + 1) + (group + 1) dim) floats, each thread's scores, rotated
 * queries and key. */
#define ATTEND(TI, TC)                                                                              \
    void decode_attention_##TI##_##TC(const TI *qkv, int64_t qkv_stride, const float *cos,          \
                                      const float *sin, TC *keys, TC *values, int64_t capacity,     \
                                      int64_t col, const float *bias, TI *out, int64_t rows,        \
                                      int64_t q_heads, int64_t kv_heads, int64_t dim, float scale,  \
                                      float *scratch, int threads) {                                \
        int64_t group = q_heads / kv_heads, length = col + 1;                                       \
        _Pragma("omp parallel num_threads(threads)") {                                              \
            float *scores = scratch + omp_get_thread_num() * (group * length + (group + 1) * dim);  \
            float *q = scores + group * length, *k = q + group * dim;                               \
            _Pragma("omp for schedule(static)") for (int64_t item = 0; item < rows * kv_heads; item++) { \
                int64_t r = item / kv_heads, g = item % kv_heads;                                   \
                const TI *x = qkv + r * qkv_stride;                                                 \
                const float *c = cos + r * dim, *s = sin + r * dim, *b = bias + r * capacity;       \
                TC *kc = keys + (r * kv_heads + g) * capacity * dim;                                \
                TC *vc = values + (r * kv_heads + g) * capacity * dim;                              \
                rotate_##TI(x + (q_heads + g) * dim, c, s, dim, k);                                 \
                for (int64_t d = 0; d < dim; d++) {                                                 \
                    store1_##TC(kc + col * dim + d, k[d]);                                          \
                    store1_##TC(vc + col * dim + d, load1_##TI(x + (q_heads + kv_heads + g) * dim + d)); \
                }                                                                                   \
                for (int64_t h = 0; h < group; h++) rotate_##TI(x + (g * group + h) * dim, c, s, dim, q + h * dim); \
                const char *nk = item + 1 < rows * kv_heads ? (const char *)(kc + capacity * dim) : 0; \
                const char *nv = nk ? (const char *)(vc + capacity * dim) : 0;                    \
                int64_t line = dim * (int64_t)sizeof(TC); /* bytes of one cached key */              \
                for (int64_t j = 0; j < length; j += COLUMNS) {                                     \
                    int64_t cb = length - j < COLUMNS ? length - j : COLUMNS;                       \
                    if (nk)                                                                         \
                        for (int64_t l = j * line; l < (j + cb) * line; l += 64)                    \
                            _mm_prefetch(nk + l, _MM_HINT_T0);                                      \
                    for (int64_t h0 = 0; h0 < group; h0 += HEADS) {                                 \
                        int64_t hb = group - h0 < HEADS ? group - h0 : HEADS;                       \
                        const float *qh = q + h0 * dim;                                             \
                        float *sh = scores + h0 * length;                                           \
                        if (cb == COLUMNS)                                                          \
                            BY_HEADS(hb, score_##TC, COLUMNS, qh, kc + j * dim, dim, scale, b + j, sh + j,  \
                                     length);                                                       \
                        else                                                                        \
                            for (int64_t jj = j; jj < length; jj++)                                 \
                                BY_HEADS(hb, score_##TC, 1, qh, kc + jj * dim, dim, scale, b + jj, sh + jj, \
                                         length);                                                   \
                    }                                                                               \
                }                                                                                   \
                for (int64_t h = 0; h < group; h++) softmax(scores + h * length, length);            \
                for (int64_t h0 = 0; h0 < group; h0 += HEADS) {                                     \
                    int64_t hb = group - h0 < HEADS ? group - h0 : HEADS;                           \
                    TI *o = out + r * q_heads * dim + (g * group + h0) * dim;                       \
                    const float *sh = scores + h0 * length;                                         \
                    for (int64_t d0 = 0; d0 < dim;) {                                               \
                        const char *next = h0 || d0 ? 0 : nv; /* asked for during the first pass */ \
                        if (dim - d0 >= 8 * VECTORS) {                                              \
                            BY_HEADS(hb, weigh_##TI##_##TC, VECTORS, sh, length, vc + d0, dim, o + d0, next); \
                            d0 += 8 * VECTORS;                                                      \
                        } else {                                                                    \
                            BY_HEADS(hb, weigh_##TI##_##TC, 1, sh, length, vc + d0, dim, o + d0, next); \
                            d0 += 8;                                                                \
                        }                                                                           \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

ATTEND(f32, f32)
ATTEND(f32, bf16)
ATTEND(bf16, f32)
ATTEND(bf16, bf16)

/* x += delta (when delta is not NULL), then out = weight * (x * 1 / sqrt(mean(x^2) + eps)) per row
 * (Llama's RMSNorm, each product rounded as PyTorch rounds it); x [rows, hidden] float32, delta
 * and out [rows, hidden] in T, weight [hidden] float32. */
#define ADD_RMS_NORM(T)                                                                             \
    void add_rms_norm_##T(float *x, const T *delta, const float *weight, int64_t rows, int64_t hidden, \
                          float eps, T *out, int threads) {                                         \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (rows * hidden >= 16384)") \
        for (int64_t r = 0; r < rows; r++) {                                                        \
            float *xr = x + r * hidden;                                                             \
            T *o = out + r * hidden;                                                                \
            if (delta)                                                                              \
                for (int64_t i = 0; i < hidden; i++) xr[i] += load1_##T(delta + r * hidden + i);     \
            __m256 acc = _mm256_setzero_ps();                                                       \
            int64_t i = 0;                                                                          \
            for (; i + 8 <= hidden; i += 8) {                                                       \
                __m256 v = _mm256_loadu_ps(xr + i);                                                 \
                acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));                                      \
            }                                                                                       \
            float sum = hsum(acc);                                                                  \
            for (; i < hidden; i++) sum += xr[i] * xr[i];                                           \
            float inv = 1.0f / sqrtf(sum / (float)hidden + eps);                                    \
            for (i = 0; i < hidden; i++) store1_##T(o + i, weight[i] * (xr[i] * inv));               \
        }                                                                                           \
    }

ADD_RMS_NORM(f32)
ADD_RMS_NORM(bf16)

/* out = silu(gate) * up, gate_up [rows, 2 inter] (gate first), out [rows, inter], both in T;
 * silu(g) = g / (1 + e^-g), in float32. */
#define SWIGLU(T)                                                                                   \
    void swiglu_##T(const T *gate_up, int64_t rows, int64_t inter, T *out, int threads) {          \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (rows * inter >= 16384)") \
        for (int64_t r = 0; r < rows; r++) {                                                        \
            const T *g = gate_up + r * 2 * inter, *u = g + inter;                                   \
            T *o = out + r * inter;                                                                 \
            int64_t i = 0;                                                                          \
            for (; i + 8 <= inter; i += 8) {                                                        \
                __m256 gv = load8_##T(g + i);                                                       \
                __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));                            \
                __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));            \
                store8_##T(o + i, _mm256_mul_ps(silu, load8_##T(u + i)));                           \
            }                                                                                       \
            for (; i < inter; i++) {                                                                \
                float gi = load1_##T(g + i);                                                        \
                store1_##T(o + i, gi / (1.0f + expf(-gi)) * load1_##T(u + i));                      \
            }                                                                                       \
        }                                                                                           \
    }

SWIGLU(f32)
SWIGLU(bf16)
