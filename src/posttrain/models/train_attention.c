/* Attention of a training pass, forward and backward, with AVX2 and FMA: float32, grouped-query
 * heads, causal or under a boolean mask.
 *
 * Why our own: PyTorch's CPU flash-attention kernel runs the short sequences of RL batches (heads
 * of 64, tens to a few hundred keys) at 60-70 GFLOP/s where the CPU's matmuls reach about 220 (Zen 4
 * EPYC, 2 threads): attention took 7-10% of a training pass. Composing it from PyTorch's batched
 * matmuls and softmax is slower still, as every elementwise pass then streams the [queries, keys]
 * scores through memory. Here a work item is one (sequence, KV head): its keys (and values, for the
 * backward) are packed once into panels of 16 keys, as posttrain/models/panel_gemm.c packs weights,
 * and the rows of its query heads are taken 64 at a time, so that a block's scores, probabilities
 * and their gradients stay in the core's cache. Work stops where the mask leaves nothing: the scores
 * of six rows at the last panel any of them sees, a row's softmax at its own last panel, each
 * weighted sum at the rows or keys that can contribute (under a causal mask a block of 64 rows of 64
 * completion tokens over a 35-token prompt computes a third fewer products than a stop per block).
 *
 * The forward keeps each row's log-normaliser (lse); the backward recomputes the probabilities from
 * it, p = exp(s - lse), as FlashAttention does (Dao et al., 2022, arXiv:2205.14135), so no
 * [queries, keys] tensor outlives a block. With s = scale q.k: dV = P^T dO, dP = dO V^T,
 * dS = P (dP - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q.
 *
 * Layouts (contiguous float32): q [B, H, L, D], k and v [B, KV, Lk, D], o and dO like q, lse
 * [B, H, L]; keep [B, L, Lk] bytes (1: the key is visible), or NULL for causal attention, where
 * query i sees keys 0 .. i. A query that sees no key gets a zero output and passes no
 * gradient. D is a multiple of 8; query head h reads KV head h / (H / KV). Threads come from
 * PyTorch's OpenMP runtime, as in panel_gemm.c.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define PANEL 16 /* keys per panel */
#define BLOCK 64 /* query rows per block */
#define CHUNK 64 /* rows of a weighted sum's right operand per pass (16 KB at D = 64: first-level cache) */

static inline int64_t round_up(int64_t n) { return (n + PANEL - 1) / PANEL * PANEL; }

/* A block's scores have one row per query, a cache line longer than its keys: with a power-of-two row
 * stride, the rows of a column (which the backward's column sums read) would share a few cache sets. */
static inline int64_t row_stride(int64_t Lk) { return round_up(Lk) + PANEL; }

/* The scratch floats one thread needs: two packed [Lk, D] operands, two blocks of scores, and a block's
 * bounds (struct bounds: as many int32 as floats). */
int64_t attention_scratch(int64_t Lk, int64_t D) {
    return 2 * round_up(Lk) * D + 2 * BLOCK * row_stride(Lk) + BLOCK + 2 * round_up(Lk);
}

/* Where a block's sums can stop: row r sees keys below seen[r] (an upper bound under a mask); key j (below the
 * most any row sees) is seen by rows first[j] .. last[j] - 1 at most. */
struct bounds {
    int32_t *seen, *first, *last;
};

static struct bounds bounds_at(float *at, int64_t Lk) {
    int32_t *base = (int32_t *)at;
    return (struct bounds){base, base + BLOCK, base + BLOCK + round_up(Lk)};
}

/* src [n, D] -> dst [ceil(n / 16), D, 16]; keys past n are zero. */
static void pack_panels(const float *src, int64_t n, int64_t D, float *dst) {
    for (int64_t j = 0; j < round_up(n); j++) {
        float *col = dst + (j / PANEL) * D * PANEL + j % PANEL;
        for (int64_t d = 0; d < D; d++) col[d * PANEL] = j < n ? src[j * D + d] : 0.0f;
    }
}

/* Rows r .. r + rows (rows <= 6, a constant where inlined) of dot_panels for panel w. */
static inline __attribute__((always_inline)) void dot_panel_rows(const float *a, int64_t D, const float *w, __m256 s,
                                                                 float *out, int64_t ld, const int rows) {
    __m256 lo[6], hi[6];
    for (int i = 0; i < rows; i++) lo[i] = hi[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 w0 = _mm256_loadu_ps(w + d * PANEL), w1 = _mm256_loadu_ps(w + d * PANEL + 8);
        for (int i = 0; i < rows; i++) {
            __m256 x = _mm256_broadcast_ss(a + i * D + d);
            lo[i] = _mm256_fmadd_ps(x, w0, lo[i]);
            hi[i] = _mm256_fmadd_ps(x, w1, hi[i]);
        }
    }
    for (int i = 0; i < rows; i++) {
        _mm256_storeu_ps(out + i * ld, _mm256_mul_ps(lo[i], s));
        _mm256_storeu_ps(out + i * ld + 8, _mm256_mul_ps(hi[i], s));
    }
}

/* out[r, j] = scale * a[r, :] . b[j, :] for r < rows and the keys b's packed panels hold up to the last one
 * that any of six rows sees (seen[r] keys); a [rows, D], out row stride ld. Six rows share each load of a
 * panel (12 sums in registers). */
static void dot_panels(const float *a, int64_t rows, int64_t D, const float *b, const int32_t *seen, float scale,
                       float *out, int64_t ld) {
    __m256 s = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < rows; r += 6) {
        int64_t group = rows - r < 6 ? rows - r : 6, most = 0;
        for (int64_t i = r; i < r + group; i++) most = seen[i] > most ? seen[i] : most;
        for (int64_t p = 0; p < round_up(most) / PANEL; p++) {
            const float *w = b + p * D * PANEL;
            float *o = out + r * ld + p * PANEL;
            switch (group) {
                case 6: dot_panel_rows(a + r * D, D, w, s, o, ld, 6); break;
                case 5: dot_panel_rows(a + r * D, D, w, s, o, ld, 5); break;
                case 4: dot_panel_rows(a + r * D, D, w, s, o, ld, 4); break;
                case 3: dot_panel_rows(a + r * D, D, w, s, o, ld, 3); break;
                case 2: dot_panel_rows(a + r * D, D, w, s, o, ld, 2); break;
                case 1: dot_panel_rows(a + r * D, D, w, s, o, ld, 1); break;
            }
        }
    }
}

/* Two outputs' slices of `vecs` vectors (4 or 1, a constant where inlined): out0 += alpha * sum_{i < n}
 * c0[i * stride] x[i * ld, :], out1 likewise with c1 (only when both). Each load of x serves both
 * sums, which stay in local registers (through a pointer argument they might alias x). */
static inline __attribute__((always_inline)) void weigh_pair(const float *c0, const float *c1, int64_t stride,
                                                             int64_t n, const float *x, int64_t ld, float alpha,
                                                             float *out0, float *out1, int both, const int vecs) {
    __m256 s0[4], s1[4];
    for (int t = 0; t < vecs; t++) s0[t] = s1[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i++) {
        __m256 a = _mm256_broadcast_ss(c0 + i * stride), b = _mm256_broadcast_ss(c1 + i * stride);
        for (int t = 0; t < vecs; t++) {
            __m256 xi = _mm256_loadu_ps(x + i * ld + 8 * t);
            s0[t] = _mm256_fmadd_ps(a, xi, s0[t]);
            s1[t] = _mm256_fmadd_ps(b, xi, s1[t]);
        }
    }
    __m256 al = _mm256_set1_ps(alpha);
    for (int t = 0; t < vecs; t++) {
        _mm256_storeu_ps(out0 + 8 * t, _mm256_fmadd_ps(s0[t], al, _mm256_loadu_ps(out0 + 8 * t)));
        if (both) _mm256_storeu_ps(out1 + 8 * t, _mm256_fmadd_ps(s1[t], al, _mm256_loadu_ps(out1 + 8 * t)));
    }
}

/* out[u, :] += alpha * sum_i c[u * cstep + i * stride] x[i, :] for u < outs (x [n, D], out [outs, D]), i from
 * lo[u] (0 without lo; never decreasing in u, as a key's first row) up to hi[u]: the terms outside are zeros.
 * Outputs go in pairs (over both ranges); the sum runs over chunks of CHUNK rows of x, each reused by every
 * output. */
static void weigh(const float *c, int64_t outs, int64_t cstep, int64_t stride, int64_t n, const int32_t *lo,
                  const int32_t *hi, const float *x, int64_t D, float alpha, float *out) {
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t i1 = n - i0 < CHUNK ? n : i0 + CHUNK;
        for (int64_t u = 0; u < outs; u += 2) {
            int both = outs - u > 1;
            int64_t start = lo ? lo[u] : 0, end = both && hi[u + 1] > hi[u] ? hi[u + 1] : hi[u];
            start = start > i0 ? start : i0;
            end = end < i1 ? end : i1;
            if (start >= end) continue;
            const float *c0 = c + u * cstep + start * stride, *c1 = both ? c0 + cstep : c0, *xs = x + start * D;
            float *o = out + u * D;
            int64_t d = 0, m = end - start;
            for (; d + 32 <= D; d += 32) weigh_pair(c0, c1, stride, m, xs + d, D, alpha, o + d, o + D + d, both, 4);
            for (; d < D; d += 8) weigh_pair(c0, c1, stride, m, xs + d, D, alpha, o + d, o + D + d, both, 1);
        }
    }
}

/* How many keys query i may see at most: 0 .. i when causal; under a mask (keep: its sequence's), up to its
 * last visible key, so that a block stops there (a causal mask's saving, also when it comes as a mask). */
static inline int64_t visible(int64_t i, int64_t Lk, const uint8_t *keep) {
    if (!keep) return i + 1 > Lk ? Lk : i + 1;
    int64_t n = Lk;
    while (n > 0 && !keep[i * Lk + n - 1]) n--;
    return n;
}

/* The bounds of rows r0 .. r0 + rows of a work item (row r is query r % L of its head); returns the most keys
 * any of them sees. */
static int64_t block_bounds(int64_t r0, int64_t rows, int64_t L, int64_t Lk, const uint8_t *keep, struct bounds b) {
    int64_t most = 0;
    for (int64_t r = 0; r < rows; r++) {
        b.seen[r] = (int32_t)visible((r0 + r) % L, Lk, keep);
        most = b.seen[r] > most ? b.seen[r] : most;
    }
    /* first the rows that see exactly j + 1 keys (first[j] the least, last[j] the greatest + 1), then a key's
     * over every count above it */
    for (int64_t j = 0; j < most; j++) b.first[j] = (int32_t)rows, b.last[j] = 0;
    for (int64_t r = 0; r < rows; r++)
        if (b.seen[r]) {
            int64_t j = b.seen[r] - 1;
            b.first[j] = b.first[j] < r ? b.first[j] : (int32_t)r;
            b.last[j] = (int32_t)r + 1;
        }
    for (int64_t j = most - 2; j >= 0; j--) {
        b.first[j] = b.first[j] < b.first[j + 1] ? b.first[j] : b.first[j + 1];
        b.last[j] = b.last[j] > b.last[j + 1] ? b.last[j] : b.last[j + 1];
    }
    return most;
}

/* One query's scores s [cols] turned into probabilities in place, 0 for keys it does not see (masked,
 * or from `seen` on). Forward (lse NULL): the softmax; returns its log-normaliser. Backward: exp(s - *lse). */
static float probabilities(float *s, int64_t cols, const uint8_t *keep_row, int64_t seen, const float *lse) {
    if (keep_row)
        for (int64_t j = 0; j < seen; j++)
            if (!keep_row[j]) s[j] = -INFINITY;
    for (int64_t j = seen; j < cols; j++) s[j] = -INFINITY;
    float m = -INFINITY;
    if (lse)
        m = *lse;
    else { /* the masked scores are -inf now */
        __m256 most = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < cols; j += 8) most = _mm256_max_ps(most, _mm256_loadu_ps(s + j));
        m = hmax(most);
    }
    if (isinf(m)) { /* it sees no key */
        memset(s, 0, cols * sizeof(float));
        return INFINITY;
    }
    __m256 vm = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < cols; j += 8) { /* cols is a multiple of 16 */
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (lse) return m;
    float total = hsum(sum);
    __m256 inv = _mm256_set1_ps(1.0f / total);
    for (int64_t j = 0; j < cols; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
    return m + logf(total);
}

/* A block's row of scores s [cols] (computed up to its own last panel, seen keys rounded up) as
 * probabilities(), and zeros from there to cols, so that sums over the block's rows may read it. */
static float block_row_probabilities(float *s, int64_t cols, const uint8_t *keep_row, int64_t seen, const float *lse) {
    int64_t own = round_up(seen);
    float result = probabilities(s, own, keep_row, seen, lse);
    memset(s + own, 0, (cols - own) * sizeof(float));
    return result;
}

void attention_forward(const float *q, const float *k, const float *v, const uint8_t *keep,
                       int64_t B, int64_t H, int64_t KV, int64_t L, int64_t Lk, int64_t D, float scale, float *o,
                       float *lse, float *scratch, int threads) {
    int64_t G = H / KV, rows = G * L, ld = row_stride(Lk);
    _Pragma("omp parallel num_threads(threads)") {
        float *kp = scratch + omp_get_thread_num() * attention_scratch(Lk, D), *s = kp + 2 * round_up(Lk) * D;
        struct bounds bounds = bounds_at(s + 2 * BLOCK * ld, Lk);
        _Pragma("omp for schedule(dynamic)") for (int64_t item = 0; item < B * KV; item++) {
            int64_t b = item / KV, first = (b * H + item % KV * G) * L;
            const float *Q = q + first * D, *V = v + item * Lk * D;
            float *O = o + first * D;
            const uint8_t *mask = keep ? keep + b * L * Lk : 0; /* this sequence's */
            pack_panels(k + item * Lk * D, Lk, D, kp);
            memset(O, 0, rows * D * sizeof(float));
            for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
                int64_t n = rows - r0 < BLOCK ? rows - r0 : BLOCK;
                int64_t most = block_bounds(r0, n, L, Lk, mask, bounds), cols = round_up(most);
                dot_panels(Q + r0 * D, n, D, kp, bounds.seen, scale, s, ld);
                for (int64_t r = r0; r < r0 + n; r++) {
                    int64_t i = r % L;
                    lse[first + r] = block_row_probabilities(s + (r - r0) * ld, cols, mask ? mask + i * Lk : 0,
                                                             bounds.seen[r - r0], 0);
                }
                weigh(s, n, ld, 1, most, 0, bounds.seen, V, D, 1.0f, O + r0 * D);
            }
        }
    }
}

void attention_backward(const float *q, const float *k, const float *v, const uint8_t *keep,
                        int64_t B, int64_t H, int64_t KV, int64_t L, int64_t Lk, int64_t D, float scale,
                        const float *o, const float *lse, const float *dout, float *dq, float *dk, float *dv,
                        float *scratch, int threads) {
    int64_t G = H / KV, rows = G * L, ld = row_stride(Lk);
    _Pragma("omp parallel num_threads(threads)") {
        float *kp = scratch + omp_get_thread_num() * attention_scratch(Lk, D), *vp = kp + round_up(Lk) * D;
        float *p = vp + round_up(Lk) * D, *ds = p + BLOCK * ld;
        struct bounds bounds = bounds_at(ds + BLOCK * ld, Lk);
        _Pragma("omp for schedule(dynamic)") for (int64_t item = 0; item < B * KV; item++) {
            int64_t b = item / KV, first = (b * H + item % KV * G) * L;
            const float *Q = q + first * D, *K = k + item * Lk * D, *O = o + first * D, *dO = dout + first * D;
            float *dQ = dq + first * D, *dK = dk + item * Lk * D, *dV = dv + item * Lk * D;
            const uint8_t *mask = keep ? keep + b * L * Lk : 0;
            pack_panels(K, Lk, D, kp);
            pack_panels(v + item * Lk * D, Lk, D, vp);
            memset(dQ, 0, rows * D * sizeof(float));
            memset(dK, 0, Lk * D * sizeof(float));
            memset(dV, 0, Lk * D * sizeof(float));
            for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
                int64_t n = rows - r0 < BLOCK ? rows - r0 : BLOCK;
                int64_t most = block_bounds(r0, n, L, Lk, mask, bounds), cols = round_up(most);
                dot_panels(Q + r0 * D, n, D, kp, bounds.seen, scale, p, ld);
                dot_panels(dO + r0 * D, n, D, vp, bounds.seen, 1.0f, ds, ld); /* dP, then dS in place */
                for (int64_t r = r0; r < r0 + n; r++) {
                    int64_t i = r % L, seen = bounds.seen[r - r0], own = round_up(seen);
                    float *pr = p + (r - r0) * ld, *dsr = ds + (r - r0) * ld;
                    block_row_probabilities(pr, cols, mask ? mask + i * Lk : 0, seen, lse + first + r);
                    __m256 acc = _mm256_setzero_ps();
                    for (int64_t d = 0; d < D; d += 8)
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(dO + r * D + d), _mm256_loadu_ps(O + r * D + d), acc);
                    __m256 delta = _mm256_set1_ps(hsum(acc));
                    for (int64_t j = 0; j < own; j += 8)
                        _mm256_storeu_ps(dsr + j, _mm256_mul_ps(_mm256_loadu_ps(pr + j),
                                                                _mm256_sub_ps(_mm256_loadu_ps(dsr + j), delta)));
                    memset(dsr + own, 0, (cols - own) * sizeof(float));
                }
                /* dV[j] += sum_r P[r, j] dO[r] */
                weigh(p, most, 1, ld, n, bounds.first, bounds.last, dO + r0 * D, D, 1.0f, dV);
                /* dQ[r] = scale sum_j dS[r, j] K[j] */
                weigh(ds, n, ld, 1, most, 0, bounds.seen, K, D, scale, dQ + r0 * D);
                /* dK[j] += scale sum_r dS[r, j] Q[r] */
                weigh(ds, most, 1, ld, n, bounds.first, bounds.last, Q + r0 * D, D, scale, dK);
            }
        }
    }
}
