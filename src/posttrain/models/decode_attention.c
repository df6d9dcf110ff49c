/* One decoder layer's attention for a decode step (one new token per row), with AVX2 and FMA:
 * rotary embedding of the new query and key, the new key and value written into the static KV
 * cache, and grouped-query attention of each query head over its row's cache.
 *
 * Why our own: at 8 to 64 rows PyTorch runs this as about ten operations a layer (two multiplies,
 * a roll and an add for the rotary embedding, two cache writes, two batched matmuls of 3 x 64 x L
 * per KV head, scale, mask and softmax). The batched matmuls ran at 8 GB/s of cache read on a Zen 4
 * EPYC whose memory streams at about 30 (each is a few hundred tiny GEMMs), and the rotary
 * multiplies of bf16 by float32 at well under a GFLOP/s; together they took a quarter of a 32-row
 * bf16 decode step of the default model. Here one pass per (row, KV head) reads that head's keys
 * and values once, for all the query heads that share them.
 *
 * Layout (posttrain.models.decode_attention passes the pointers and strides): qkv [rows, q_heads +
 * 2 kv_heads, dim] (row stride qkv_stride), the projections' output before the rotary embedding,
 * in float32 or bf16; cos and signed_sin [rows, dim] float32 (signed_sin: sin with its first half
 * negated, so the half-split rotation is x cos + roll(x, dim / 2) signed_sin); keys and values
 * [rows, kv_heads, capacity, dim] float32 or bf16; bias [rows, capacity] float32, 0 or -inf (left
 * padding); out [rows, q_heads * dim] float32. Column `col` is written, columns 0..col attended.
 * dim is a multiple of 8. scratch: threads x (group (col + 1) + (group + 1) dim) floats, each
 * thread's scores and rotated query and key.
 *
 * Threads come from PyTorch's own OpenMP runtime (libgomp.so.1), as in panel_gemm.c.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

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

/* Round to nearest even, as PyTorch's float32 -> bf16 conversion does (NaN kept a NaN). */
static inline void store1_bf16(bf16 *p, float x) {
    uint32_t bits;
    __builtin_memcpy(&bits, &x, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        *p = (bf16)((bits >> 16) | 0x40);
        return;
    }
    *p = (bf16)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for 8 floats: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6 polynomial (the classic
 * Cephes coefficients, about 1 ulp), 2^n built in the exponent bits; 0 below -87.3 (so -inf masks give 0). */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(scale)), under);
}

/* Softmax of s[0..n) in place; returns nothing, s sums to 1. */
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

#define ATTEND(TI, TC)                                                                              \
    void decode_attention_##TI##_##TC(const TI *qkv, int64_t qkv_stride, const float *cos,          \
                                      const float *sin, TC *keys, TC *values, int64_t capacity,     \
                                      int64_t col, const float *bias, float *out, int64_t rows,     \
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
                for (int64_t j = 0; j < length; j++) {                                              \
                    const TC *kj = kc + j * dim;                                                    \
                    for (int64_t h = 0; h < group; h++) {                                           \
                        __m256 acc = _mm256_setzero_ps();                                           \
                        for (int64_t d = 0; d < dim; d += 8)                                        \
                            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * dim + d), load8_##TC(kj + d), acc); \
                        scores[h * length + j] = hsum(acc) * scale + b[j];                          \
                    }                                                                               \
                }                                                                                   \
                for (int64_t h = 0; h < group; h++) {                                               \
                    const float *p = scores + h * length;                                           \
                    float *o = out + r * q_heads * dim + (g * group + h) * dim;                     \
                    softmax(scores + h * length, length);                                           \
                    for (int64_t d0 = 0; d0 < dim; d0 += 64) {                                      \
                        int64_t width = dim - d0 < 64 ? dim - d0 : 64;                              \
                        __m256 acc[8];                                                              \
                        for (int64_t v = 0; v < width / 8; v++) acc[v] = _mm256_setzero_ps();      \
                        for (int64_t j = 0; j < length; j++) {                                      \
                            __m256 pj = _mm256_set1_ps(p[j]);                                       \
                            const TC *vj = vc + j * dim + d0;                                       \
                            for (int64_t v = 0; v < width / 8; v++)                                 \
                                acc[v] = _mm256_fmadd_ps(pj, load8_##TC(vj + 8 * v), acc[v]);        \
                        }                                                                           \
                        for (int64_t v = 0; v < width / 8; v++) _mm256_storeu_ps(o + d0 + 8 * v, acc[v]); \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

ATTEND(f32, f32)
ATTEND(f32, bf16)
ATTEND(bf16, f32)
ATTEND(bf16, bf16)
