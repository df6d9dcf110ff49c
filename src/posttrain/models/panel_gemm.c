/* y[M, N] = x[M, K] W^T + b for the few rows of a decode step, with AVX2 and FMA.
 *
 * The weight W [N, K] is stored once as panels of 16 outputs, each panel K rows of 16 floats
 * (panel p, input k holds W[16p .. 16p+15][k]), so that a panel is one sequential stream. A thread
 * takes a contiguous range of panels; for each panel it walks the rows of x in blocks of up to 6
 * and keeps the block's 6 x 16 sums in 12 of the 16 vector registers, adding one input k at a time
 * (two weight vectors, one broadcast of x per row, two FMAs per row). The panel is read from memory
 * once, by the first block, and from cache by the others; while that first block runs it asks for
 * the next panel, so that the stream from memory overlaps the arithmetic.
 *
 * Why our own: at 1 to 32 rows a decode step's matmuls are bound by reading the weights or by
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

#define MICRO(MR)                                                                                   \
    static void micro##MR(const float *x, int64_t K, const float *wp, const float *next,           \
                          float out[BLOCK][PANEL]) {                                                \
        __m256 lo[MR], hi[MR];                                                                      \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                      \
            lo[i] = _mm256_setzero_ps();                                                            \
            hi[i] = _mm256_setzero_ps();                                                            \
        }                                                                                           \
        for (int64_t k = 0; k < K; k++) {                                                           \
            __m256 w0 = _mm256_load_ps(wp + k * PANEL), w1 = _mm256_load_ps(wp + k * PANEL + 8);    \
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

MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)
MICRO(5)
MICRO(6)

typedef void (*micro_fn)(const float *, int64_t, const float *, const float *, float[BLOCK][PANEL]);
static const micro_fn MICROS[BLOCK + 1] = {0, micro1, micro2, micro3, micro4, micro5, micro6};

/* wp [ceil(N / 16), K, 16] from w [N, K]; outputs past N are zero. */
void panel_pack(const float *w, int64_t N, int64_t K, float *wp) {
    int64_t panels = (N + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < PANEL; j++) {
                int64_t n = p * PANEL + j;
                wp[(p * K + k) * PANEL + j] = n < N ? w[n * K + k] : 0.0f;
            }
}

/* y [M, N] = x [M, K] W^T (+ bias [N] when not NULL), W packed by panel_pack; wp 32-byte aligned. */
void panel_linear(const float *x, int64_t M, int64_t K, const float *wp, int64_t N, const float *bias, float *y,
                  int threads) {
    int64_t panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        const float *w = wp + p * K * PANEL;
        int64_t n0 = p * PANEL, width = N - n0 < PANEL ? N - n0 : PANEL;
        float out[BLOCK][PANEL];
        for (int64_t m = 0; m < M; m += BLOCK) {
            int rows = M - m < BLOCK ? (int)(M - m) : BLOCK;
            MICROS[rows](x + m * K, K, w, m == 0 && p + 1 < panels ? w + K * PANEL : 0, out);
            for (int i = 0; i < rows; i++) {
                float *dst = y + (m + i) * N + n0;
                if (bias)
                    for (int j = 0; j < width; j++) dst[j] = out[i][j] + bias[n0 + j];
                else
                    memcpy(dst, out[i], width * sizeof(float));
            }
        }
    }
}
