/* y[M, N] = x[M, K] W^T + b for the few rows of a decode step, with AVX2 and FMA.
 *
 * The weight W [N, K] is stored once as panels of 16 outputs, each panel K rows of 16 values
 * (panel p, input k holds W[16p .. 16p+15][k]; posttrain.models.panel_linear packs it), so that a
 * panel is one sequential stream. A thread takes a contiguous range of panels; for each panel it
 * walks the rows of x in blocks of up to 6 and keeps the block's 6 x 16 sums in 12 of the 16
 * vector registers, adding one input k at a time (two weight vectors, one broadcast of x per row,
 * two FMAs per row). The panel is read from memory once, by the first block, and from cache by the
 * others; while that first block runs it asks for the next panel, so that the stream from memory
 * overlaps the arithmetic. The weights are float32 (panel_linear_f32) or bf16 (panel_linear_bf16:
 * half the bytes to read, widened to float32 in registers; sums and x stay float32).
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

#define PANEL 16
#define BLOCK 6

typedef float f32;

typedef uint16_t bf16;

static inline __m256 load_f32(const f32 *p) { return _mm256_loadu_ps(p); }

/* 8 bf16 values widened to float32: a bf16 is the top half of a float32's bits. */
static inline __m256 load_bf16(const bf16 *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define MICRO(T, MR)                                                                                \
    static void micro_##T##_##MR(const float *x, int64_t K, const T *wp, const T *next,            \
                                 float out[BLOCK][PANEL]) {                                         \
        __m256 lo[MR], hi[MR];                                                                      \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                      \
            lo[i] = _mm256_setzero_ps();                                                            \
            hi[i] = _mm256_setzero_ps();                                                            \
        }                                                                                           \
        for (int64_t k = 0; k < K; k++) {                                                           \
            __m256 w0 = load_##T(wp + k * PANEL), w1 = load_##T(wp + k * PANEL + 8);                \
            if (next) _mm_prefetch((const char *)(next + k * PANEL), _MM_HINT_T1);                  \
            _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                  \
                __m256 b = _mm256_broadcast_ss(x + i * K + k);                                      \
                lo[i] = _mm256_fmadd_ps(b, w0, lo[i]);                                              \
                hi[i] = _mm256_fmadd_ps(b, w1, hi[i]);                                              \
            }                                                                                       \
        }                                                                                           \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                      \
            _mm256_storeu_ps(out[i], lo[i]);                                                        \
            _mm256_storeu_ps(out[i] + 8, hi[i]);                                                    \
        }                                                                                           \
    }

/* y [M, N] = x [M, K] W^T (+ bias [N] when not NULL); wp [ceil(N / 16), K, 16] (any alignment), outputs
 * past N zero. */
#define LINEAR(T)                                                                                   \
    MICRO(T, 1) MICRO(T, 2) MICRO(T, 3) MICRO(T, 4) MICRO(T, 5) MICRO(T, 6)                         \
    static void (*const micros_##T[BLOCK + 1])(const float *, int64_t, const T *, const T *,        \
                                               float[BLOCK][PANEL]) = {                             \
        0, micro_##T##_1, micro_##T##_2, micro_##T##_3, micro_##T##_4, micro_##T##_5, micro_##T##_6}; \
    void panel_linear_##T(const float *x, int64_t M, int64_t K, const T *wp, int64_t N,              \
                          const float *bias, float *y, int threads) {                               \
        int64_t panels = (N + PANEL - 1) / PANEL;                                                   \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                           \
        for (int64_t p = 0; p < panels; p++) {                                                      \
            const T *w = wp + p * K * PANEL;                                                        \
            int64_t n0 = p * PANEL, width = N - n0 < PANEL ? N - n0 : PANEL;                        \
            float out[BLOCK][PANEL];                                                                \
            for (int64_t m = 0; m < M; m += BLOCK) {                                                \
                int rows = M - m < BLOCK ? (int)(M - m) : BLOCK;                                    \
                micros_##T[rows](x + m * K, K, w, m == 0 && p + 1 < panels ? w + K * PANEL : 0, out); \
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
