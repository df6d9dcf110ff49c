/* y[M, N] = x[M, K] W^T + b for the rows of a decode step, on AVX512-BF16's dot-product instruction.
 *
 * The weight W [N, K] is bf16, stored once as panels of 16 outputs, each panel ceil(K / 2) pairs of
 * inputs x 16 outputs x 2 (panel p, pair j holds W[16p + o][2j], W[16p + o][2j + 1] for o = 0..15: one
 * 64-byte vector; posttrain.models.panel_dot packs it). The rows of x are rounded to bf16 once per call
 * (to nearest even, as PyTorch rounds; a denormal input counts as zero), so that a 32-bit broadcast
 * holds one row's pair of inputs, and vdpbf16ps adds both products of 16 outputs into float32 sums:
 * 32 multiply-adds an instruction, where panel_gemm.c's bf16 kernel widens the weights and does 8 per
 * FMA. A thread takes a contiguous range of panels, two at a time; for them it walks the rows in blocks
 * of up to 8, with two vectors of sums a row in registers (16 of the 32); the first block reads the two
 * panels from memory and asks for the next two while it runs, the others find them in cache.
 *
 * Why our own: at 16 rows (the demo's decode steps) oneDNN's bf16 linear ran the default model's
 * matmuls well below both the bf16 units' and the memory's bound on a Zen 4 EPYC (see
 * posttrain.models.panel_dot for the figures). Which kernel serves a step is measured per machine
 * (posttrain.models.cpu_probe); this one runs only on CPUs that report AVX512F and AVX512-BF16.
 */
#pragma GCC target("avx512f,avx512bw,avx512bf16")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define PANEL 16
#define BLOCK 8

typedef uint16_t bf16;

/* x [M, K] float32 -> xb [M, K2] pairs of bf16 (K2 = ceil(K / 2); an odd K's last pair ends in zero). */
static void round_rows(const float *x, int64_t M, int64_t K, int64_t K2, bf16 *xb) {
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K;
        bf16 *out = xb + m * 2 * K2;
        int64_t k = 0;
        for (; k + 32 <= K; k += 32) {
            __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(row + k));
            _mm512_storeu_si512((void *)(out + k), (__m512i)pair);
        }
        if (k < K) {
            __mmask16 lo = (__mmask16)((K - k) >= 16 ? 0xFFFF : ((1u << (K - k)) - 1));
            __mmask16 hi = (__mmask16)((K - k) <= 16 ? 0 : ((1u << (K - k - 16)) - 1));
            __m512 a = _mm512_maskz_loadu_ps(lo, row + k), b = _mm512_maskz_loadu_ps(hi, row + k + 16);
            __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            _mm512_mask_storeu_epi16(out + k, (__mmask32)((1ull << (2 * K2 - k)) - 1), pair);
        }
    }
}

/* Sums of an MR-row block for two panels (32 outputs), a row's broadcast pair of inputs serving both. */
#define MICRO(MR)                                                                                   \
    static void micro_##MR(const uint32_t *xp, int64_t K2, const bf16 *wa, const bf16 *wb,         \
                           const bf16 *next, float out[BLOCK][2 * PANEL]) {                         \
        __m512 sa[MR], sb[MR];                                                                      \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) sa[i] = sb[i] = _mm512_setzero_ps();   \
        for (int64_t j = 0; j < K2; j++) {                                                          \
            __m512bh a = (__m512bh)_mm512_loadu_si512((const void *)(wa + j * 2 * PANEL));          \
            __m512bh b = (__m512bh)_mm512_loadu_si512((const void *)(wb + j * 2 * PANEL));          \
            if (next) {                                                                             \
                _mm_prefetch((const char *)(next + j * 2 * PANEL), _MM_HINT_T1);                    \
                _mm_prefetch((const char *)(next + (K2 + j) * 2 * PANEL), _MM_HINT_T1);             \
            }                                                                                       \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                  \
                __m512bh pair = (__m512bh)_mm512_set1_epi32((int)xp[i * K2 + j]);                   \
                sa[i] = _mm512_dpbf16_ps(sa[i], pair, a);                                           \
                sb[i] = _mm512_dpbf16_ps(sb[i], pair, b);                                           \
            }                                                                                       \
        }                                                                                           \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                      \
            _mm512_storeu_ps(out[i], sa[i]);                                                        \
            _mm512_storeu_ps(out[i] + PANEL, sb[i]);                                                \
        }                                                                                           \
    }

MICRO(1) MICRO(2) MICRO(3) MICRO(4) MICRO(5) MICRO(6) MICRO(7) MICRO(8)

static void (*const micros[BLOCK + 1])(const uint32_t *, int64_t, const bf16 *, const bf16 *, const bf16 *,
                                       float[BLOCK][2 * PANEL]) = {
    0, micro_1, micro_2, micro_3, micro_4, micro_5, micro_6, micro_7, micro_8};

/* y [M, N] = x [M, K] W^T (+ bias [N] when not NULL), float32; wp [ceil(N / 16), ceil(K / 2), 16, 2] bf16,
 * outputs past N zero; xb: scratch for M * 2 * ceil(K / 2) bf16. Panels go two at a time (an odd last
 * one with itself, its copy's sums unused). */
void panel_dot_bf16(const float *x, int64_t M, int64_t K, const bf16 *wp, int64_t N, const float *bias,
                    float *y, bf16 *xb, int threads) {
    int64_t K2 = (K + 1) / 2, panels = (N + PANEL - 1) / PANEL, stride = K2 * 2 * PANEL;
    round_rows(x, M, K, K2, xb);
    const uint32_t *xp = (const uint32_t *)xb;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int64_t p = 0; p < panels; p += 2) {
        const bf16 *wa = wp + p * stride, *wb = p + 1 < panels ? wa + stride : wa;
        int64_t n0 = p * PANEL, width = N - n0 < 2 * PANEL ? N - n0 : 2 * PANEL;
        float out[BLOCK][2 * PANEL];
        for (int64_t m = 0; m < M; m += BLOCK) {
            int rows = M - m < BLOCK ? (int)(M - m) : BLOCK;
            micros[rows](xp + m * K2, K2, wa, wb, m == 0 && p + 2 < panels ? wa + 2 * stride : 0, out);
            for (int i = 0; i < rows; i++) {
                float *dst = y + (m + i) * N + n0;
                if (bias)
                    for (int o = 0; o < width; o++) dst[o] = out[i][o] + bias[n0 + o];
                else
                    memcpy(dst, out[i], width * sizeof(float));
            }
        }
    }
}

/* A weight's rows o0 .. o0 + rows - 1, src [rows, K] float32 row by row, rounded to bf16 (to nearest
 * even, as PyTorch rounds) into the panels dst [ceil(N / 16), ceil(K / 2), 16, 2] that panel_dot_bf16
 * reads; an odd K's last pair ends in zero. Part by part, as panel_gemm.c's panel_pack_T: a full
 * panel's rows go 16 inputs (8 pairs, one 32-bit value each) at a time through two 8 x 8 transposes. */
void panel_dot_pack(const float *src, int64_t rows, int64_t K, int64_t o0, bf16 *dst, int threads) {
    int64_t K2 = (K + 1) / 2, first = o0 / PANEL, last = (o0 + rows - 1) / PANEL;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int64_t p = first; p <= last; p++) {
        int64_t lo = p * PANEL > o0 ? p * PANEL : o0, hi = (p + 1) * PANEL < o0 + rows ? (p + 1) * PANEL : o0 + rows;
        bf16 *panel = dst + p * K2 * 2 * PANEL;
        int64_t k = 0;
        if (hi - lo == PANEL)
            for (; k + 16 <= K; k += 16) {
                __m256 a[8], b[8];
                for (int i = 0; i < 8; i++) {
                    const float *ra = src + (lo - o0 + i) * K + k, *rb = src + (lo - o0 + 8 + i) * K + k;
                    a[i] = _mm256_castsi256_ps(pack16_bf16(round8_bf16(_mm256_loadu_ps(ra)),
                                                           round8_bf16(_mm256_loadu_ps(ra + 8))));
                    b[i] = _mm256_castsi256_ps(pack16_bf16(round8_bf16(_mm256_loadu_ps(rb)),
                                                           round8_bf16(_mm256_loadu_ps(rb + 8))));
                }
                transpose8(a);
                transpose8(b);
                for (int i = 0; i < 8; i++) {
                    bf16 *pair = panel + (k / 2 + i) * 2 * PANEL;
                    _mm256_storeu_ps((float *)pair, a[i]);
                    _mm256_storeu_ps((float *)(pair + PANEL), b[i]);
                }
            }
        for (int64_t o = lo; o < hi; o++) {
            bf16 *column = panel + (o - p * PANEL) * 2;
            for (int64_t kk = k; kk < K; kk++)
                column[(kk / 2) * 2 * PANEL + (kk & 1)] = round_bf16(src[(o - o0) * K + kk]);
            if (K & 1) column[(K2 - 1) * 2 * PANEL + 1] = 0;
        }
    }
}
