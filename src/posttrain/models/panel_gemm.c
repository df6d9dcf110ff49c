/* y[M, N] = x[M, K] W^T + b for the few rows of a decode step, with AVX2 and FMA, or AVX-512.
 *
 * The weight W [N, K] is stored once as panels of 16 outputs, each panel K rows of 16 values
 * (panel p, input k holds W[16p .. 16p+15][k]; posttrain.models.panel_linear packs it), so that a
 * panel is one sequential stream. A thread takes a contiguous range of panels, GROUP at a time; for
 * them it walks the rows of x in blocks of up to BLOCK, as equal as can be (32 rows in AVX2's blocks of
 * 6: 6, 6, 5, 5, 5, 5, not five of 6 and one of 2, whose four sums cannot hide the FMA's latency), and
 * keeps the block's sums in registers, two vectors a row, adding one input k at a time (two weight
 * vectors, one broadcast of x per row, two FMAs per row). Built with AVX2 (the default) a vector holds
 * 8 outputs: one panel at a time, blocks of up to 6 rows, 12 of the 16 registers. Built with AVX-512
 * (-mavx512f; posttrain.models.panel_linear builds both where the CPU has it) a vector holds 16: two
 * panels at a time, blocks of up to 8 rows, 16 of the 32 registers; on a Zen 4 EPYC that build ran the
 * default model's float32 matmuls 0-16% faster at 16 and 32 rows and 3-20% at 8 (Intel's server cores,
 * with two 512-bit FMA units, have twice AVX2's peak for it to reach).
 *
 * The panels are read from memory once, by the first block, and from cache by the others. Every block
 * asks for its share of the next panels' cache lines (block b of n: inputs b, b + n, ...), so that the
 * stream from memory overlaps all of the arithmetic; asked for by the first block alone, they came in
 * a burst that stalled it. Over the default model's float32 matmuls (30 layers and the head, AVX2
 * build, Zen 4 EPYC, one process in turns, medians of 8), at 8 / 16 / 32 rows: 23.1 / 27.0 / 48.8 ms
 * before, 20.2 / 23.8 / 45.5 with the requests spread, 18.8 / 23.6 / 43.9 with equal blocks as well.
 * The weights are float32 (panel_linear_f32) or bf16 (panel_linear_bf16: half the bytes to read,
 * widened to float32 in registers; sums and x stay float32). Either build adds each output's products
 * in the order of k, so both give the same bits.
 *
 * Why our own: at 1 to 64 rows a decode step's matmuls are bound by reading the weights or by
 * the vector units, and oneDNN's and MKL's kernels reach neither at these widths on AVX2 CPUs
 * (see posttrain.models.panel_linear for the figures). Which kernel serves a step is measured per
 * machine (posttrain.models.cpu_probe); this one is only used where it was the fastest.
 *
 * Threads come from the same OpenMP runtime as PyTorch's (libgomp.so.1, already loaded by torch),
 * so the two never compete with two thread pools.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define PANEL 16

typedef float f32;

typedef uint16_t bf16;

#ifdef __AVX512F__
#define LANES 16
#define BLOCK 8
typedef __m512 vec;
static inline vec load_f32(const f32 *p) { return _mm512_loadu_ps(p); }
/* 16 bf16 values widened to float32: a bf16 is the top half of a float32's bits. */
static inline vec load_bf16(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#define ZERO _mm512_setzero_ps
#define BROADCAST _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define STORE _mm512_storeu_ps
#else
#define LANES 8
#define BLOCK 6
typedef __m256 vec;
static inline vec load_f32(const f32 *p) { return _mm256_loadu_ps(p); }
/* 8 bf16 values widened to float32. */
static inline vec load_bf16(const bf16 *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#define ZERO _mm256_setzero_ps
#define BROADCAST _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define STORE _mm256_storeu_ps
#endif
#define GROUP (2 * LANES / PANEL) /* panels a block of rows works on: two vectors a row */
#define MAX_BLOCK 8            /* the micro-kernels defined, the AVX2 build using six */

/* Sums of an MR-row block over two weight vectors a row: wa + k * PANEL and wb + k * PANEL (the two
 * halves of one panel, or two panels); next, when not NULL, is the first of the GROUP panels after them,
 * whose inputs k = first, first + every, ... this block asks the cache for. */
#define MICRO(T, MR)                                                                                \
    static void micro_##T##_##MR(const float *x, int64_t K, const T *wa, const T *wb, const T *next, \
                                 int64_t first, int64_t every, float out[MAX_BLOCK][2 * LANES]) {   \
        vec sa[MR], sb[MR];                                                                         \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) sa[i] = sb[i] = ZERO();                \
        int64_t due = first;                                                                        \
        for (int64_t k = 0; k < K; k++) {                                                           \
            vec a = load_##T(wa + k * PANEL), b = load_##T(wb + k * PANEL);                         \
            if (next && k == due) {                                                                 \
                for (int g = 0; g < GROUP; g++)                                                     \
                    _mm_prefetch((const char *)(next + (g * K + k) * PANEL), _MM_HINT_T1);          \
                due += every;                                                                       \
            }                                                                                       \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                  \
                vec v = BROADCAST(x[i * K + k]);                                                    \
                sa[i] = FMA(v, a, sa[i]);                                                           \
                sb[i] = FMA(v, b, sb[i]);                                                           \
            }                                                                                       \
        }                                                                                           \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                      \
            STORE(out[i], sa[i]);                                                                   \
            STORE(out[i] + LANES, sb[i]);                                                           \
        }                                                                                           \
    }

/* y [M, N] = x [M, K] W^T (+ bias [N] when not NULL); wp [ceil(N / 16), K, 16] (any alignment), outputs
 * past N zero. An odd last panel of the AVX-512 build goes with itself, its copy's sums unused. */
#define LINEAR(T)                                                                                   \
    MICRO(T, 1) MICRO(T, 2) MICRO(T, 3) MICRO(T, 4) MICRO(T, 5) MICRO(T, 6) MICRO(T, 7) MICRO(T, 8) \
    static void (*const micros_##T[MAX_BLOCK + 1])(const float *, int64_t, const T *, const T *, const T *, \
                                               int64_t, int64_t, float[MAX_BLOCK][2 * LANES]) = {   \
        0, micro_##T##_1, micro_##T##_2, micro_##T##_3, micro_##T##_4, micro_##T##_5, micro_##T##_6, \
        micro_##T##_7, micro_##T##_8};                                                              \
    void panel_linear_##T(const float *x, int64_t M, int64_t K, const T *wp, int64_t N,              \
                          const float *bias, float *y, int threads) {                               \
        int64_t panels = (N + PANEL - 1) / PANEL, stride = K * PANEL;                               \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                           \
        for (int64_t p = 0; p < panels; p += GROUP) {                                               \
            const T *wa = wp + p * stride;                                                          \
            const T *wb = GROUP == 1 ? wa + LANES : p + 1 < panels ? wa + stride : wa;              \
            int64_t n0 = p * PANEL, width = N - n0 < GROUP * PANEL ? N - n0 : GROUP * PANEL;        \
            float out[MAX_BLOCK][2 * LANES];                                                        \
            const T *next = p + GROUP < panels ? wa + GROUP * stride : 0;                           \
            int64_t blocks = (M + BLOCK - 1) / BLOCK;                                               \
            for (int64_t b = 0, m = 0, rows; b < blocks; b++, m += rows) {                          \
                rows = M / blocks + (b < M % blocks);                                               \
                micros_##T[rows](x + m * K, K, wa, wb, next, b, blocks, out);                       \
                for (int i = 0; i < rows; i++) {                                                    \
                    float *dst = y + (m + i) * N + n0;                                              \
                    if (bias)                                                                       \
                        for (int j = 0; j < width; j++) dst[j] = out[i][j] + bias[n0 + j];          \
                    else                                                                            \
                        memcpy(dst, out[i], width * sizeof(float));                                 \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

LINEAR(f32)
LINEAR(bf16)

/* A weight's rows o0 .. o0 + rows - 1, src [rows, K] float32 row by row, written into the panels dst
 * [ceil(N / 16), K, 16] that panel_linear_T reads: float32, or bf16 rounded to nearest even as PyTorch
 * rounds. A weight made of parts (q, k and v) is packed part by part, never concatenated first. A
 * thread takes whole panels; a panel's 16 rows go 8 inputs at a time through two 8 x 8 transposes in
 * registers, so that each input's 16 values are written at once (a panel a part fills only in part,
 * and the last inputs of a K that is not a multiple of 8, one value at a time). PyTorch's pad and
 * transposing copy took the default model's weights in about 90 ms, where a plain copy takes 30. */
static inline void store16_f32(f32 *dst, __m256 a, __m256 b) {
    _mm256_storeu_ps(dst, a);
    _mm256_storeu_ps(dst + 8, b);
}

static inline void store16_bf16(bf16 *dst, __m256 a, __m256 b) {
    _mm256_storeu_si256((__m256i *)dst, pack16_bf16(round8_bf16(a), round8_bf16(b)));
}

static inline f32 convert_f32(float x) { return x; }
static inline bf16 convert_bf16(float x) { return round_bf16(x); }

#define PACK(T)                                                                                     \
    void panel_pack_##T(const float *src, int64_t rows, int64_t K, int64_t o0, T *dst, int threads) { \
        int64_t first = o0 / PANEL, last = (o0 + rows - 1) / PANEL;                                 \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                           \
        for (int64_t p = first; p <= last; p++) {                                                   \
            int64_t lo = p * PANEL > o0 ? p * PANEL : o0;                                           \
            int64_t hi = (p + 1) * PANEL < o0 + rows ? (p + 1) * PANEL : o0 + rows;                 \
            T *panel = dst + p * K * PANEL;                                                         \
            int64_t k = 0;                                                                          \
            if (hi - lo == PANEL)                                                                   \
                for (; k + 8 <= K; k += 8) {                                                        \
                    __m256 a[8], b[8];                                                              \
                    for (int i = 0; i < 8; i++) {                                                   \
                        a[i] = _mm256_loadu_ps(src + (lo - o0 + i) * K + k);                        \
                        b[i] = _mm256_loadu_ps(src + (lo - o0 + 8 + i) * K + k);                    \
                    }                                                                               \
                    transpose8(a);                                                                  \
                    transpose8(b);                                                                  \
                    for (int i = 0; i < 8; i++) store16_##T(panel + (k + i) * PANEL, a[i], b[i]);   \
                }                                                                                   \
            for (int64_t o = lo; o < hi; o++)                                                       \
                for (int64_t kk = k; kk < K; kk++)                                                  \
                    panel[kk * PANEL + o - p * PANEL] = convert_##T(src[(o - o0) * K + kk]);        \
        }                                                                                           \
    }

PACK(f32)
PACK(bf16)
