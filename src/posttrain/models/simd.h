/* Helpers shared by our C kernels (decode_layer.c, panel_gemm.c, panel_dot.c, sample_tokens.c, train_attention.c,
 * train_elementwise.c, transpose.c): bf16 rounding, and vector helpers in AVX2 and FMA. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

/* float32 -> bf16 rounded to nearest even, as PyTorch rounds (a NaN stays a NaN). */
static inline uint16_t round_bf16(float x) {
    uint32_t bits;
    __builtin_memcpy(&bits, &x, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* 8 floats rounded to bf16 as round_bf16 rounds them, each in the low half of its 32-bit lane. */
static inline __m256i round8_bf16(__m256 x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}

/* Two vectors of round8_bf16's results as 16 bf16 values in order: a's 8, then b's. */
static inline __m256i pack16_bf16(__m256i a, __m256i b) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

/* An 8 x 8 block of 32-bit values transposed in place: r[i] held row i, it holds column i. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* rows 2i, 2i+1: columns 0, 1 | 4, 5 */
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* columns 2, 3 | 6, 7 */
    }
    for (int h = 0; h < 2; h++) /* rows 4h .. 4h + 3: s[4h + c] holds column c | c + 4 */
        for (int c = 0; c < 2; c++) {
            s[4 * h + 2 * c] = _mm256_shuffle_ps(t[4 * h + c], t[4 * h + 2 + c], 0x44);
            s[4 * h + 2 * c + 1] = _mm256_shuffle_ps(t[4 * h + c], t[4 * h + 2 + c], 0xee);
        }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
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
