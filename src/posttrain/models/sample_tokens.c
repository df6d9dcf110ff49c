/* Drawing the next token of every row from softmax(logits / temperature), as posttrain.rollout.sampling's
 * sample_next does with PyTorch's operations, in two passes over a row instead of about eight.
 *
 * A row's distribution is inverted at one uniform draw u: the entries are cut into blocks of BLOCK,
 * each block's mass summed (in float64, from float32 exponentials), the block where u * total falls
 * found among their running sums, and the entry within it by summing that block again. The second
 * pass recomputes the block's exponentials (BLOCK of them) instead of keeping the whole row's: so a
 * row is read twice (its maximum, then its exponentials) and nothing the size of the vocabulary is
 * written. The weights are exp((z - max) / temperature), not normalised (the draw scales the total
 * instead), and a token of weight 0 is never drawn: the target stays strictly below the total, and
 * within the block strictly below the block's own sum.
 *
 * Threads come from PyTorch's OpenMP runtime, a row each; each row's result depends on its own
 * inputs only. Built without FMA contraction, as the other kernels.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "simd.h"

#define BLOCK 512

/* out[j] = exp((z[j] - zmax) * scale) for j < n: exp8 on whole vectors, expf on the tail, as block_mass
 * computes them. */
static void block_weights(const float *z, int64_t n, float zmax, float scale, float *out) {
    const __m256 vm = _mm256_set1_ps(zmax), vs = _mm256_set1_ps(scale);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm), vs)));
    for (; j < n; j++) out[j] = expf((z[j] - zmax) * scale);
}

/* The row's largest entry, or NaN where it holds a NaN (which the maximum alone would pass over). */
static float row_max(const float *z, int64_t V) {
    __m256 most[4], nan = _mm256_setzero_ps();
    for (int t = 0; t < 4; t++) most[t] = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 32 <= V; j += 32)
        for (int t = 0; t < 4; t++) {
            __m256 x = _mm256_loadu_ps(z + j + 8 * t);
            most[t] = _mm256_max_ps(most[t], x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
    float m = hmax(_mm256_max_ps(_mm256_max_ps(most[0], most[1]), _mm256_max_ps(most[2], most[3])));
    int any_nan = _mm256_movemask_ps(nan) != 0;
    for (; j < V; j++) {
        any_nan |= isnan(z[j]);
        m = z[j] > m ? z[j] : m;
    }
    return any_nan ? NAN : m;
}

/* The sum of block_weights(z, n, ...) in float64 (whole vectors widened and summed four lanes at a time). */
static double block_mass(const float *z, int64_t n, float zmax, float scale) {
    const __m256 vm = _mm256_set1_ps(zmax), vs = _mm256_set1_ps(scale);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 w = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm), vs));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
    }
    double lanes[4], total = 0.0;
    _mm256_storeu_pd(lanes, _mm256_add_pd(lo, hi));
    for (int t = 0; t < 4; t++) total += lanes[t];
    for (; j < n; j++) total += expf((z[j] - zmax) * scale);
    return total;
}

/* logits [rows, V] (float32), u [rows] uniform in [0, 1) (float64), cdf [rows, ceil(V / BLOCK)] scratch:
 * tokens [rows] the drawn entries, logp [rows] their log-probabilities under softmax(logits / temperature).
 * A row whose weights do not sum to a positive finite total (NaN or infinite logits, all -inf) gets the
 * last entry and a NaN log-probability, as PyTorch's operations give. */
void sample_tokens(const float *logits, int64_t rows, int64_t V, float temperature, const double *u, double *cdf,
                   int64_t *tokens, float *logp, int threads) {
    const int64_t blocks = (V + BLOCK - 1) / BLOCK;
    const float scale = 1.0f / temperature;
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (rows > 1)")
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits + r * V;
        double *sums = cdf + r * blocks;
        float weights[BLOCK];
        const float zmax = row_max(z, V);
        double total = 0.0;
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t start = b * BLOCK, n = V - start < BLOCK ? V - start : BLOCK;
            total += block_mass(z + start, n, zmax, scale);
            sums[b] = total;
        }
        if (!(total > 0.0 && total <= 1e300)) { /* NaN, infinite or empty */
            tokens[r] = V - 1;
            logp[r] = NAN;
            continue;
        }
        const double target = fmin(u[r] * total, nextafter(total, 0.0));
        int64_t b = 0;
        while (sums[b] <= target) b++; /* target < total = sums[blocks - 1]: a block of positive mass */
        const double before = b ? sums[b - 1] : 0.0;
        const int64_t start = b * BLOCK, n = V - start < BLOCK ? V - start : BLOCK;
        block_weights(z + start, n, zmax, scale, weights);
        double own = 0.0; /* the block's sum in the order the search adds it: it differs from sums' in rounding */
        for (int64_t j = 0; j < n; j++) own += weights[j];
        const double rest = fmin(target - before, nextafter(own, 0.0));
        double running = 0.0;
        int64_t j = 0;
        while (j < n - 1 && (running += weights[j]) <= rest) j++;
        tokens[r] = start + j;
        logp[r] = (float)((double)((z[start + j] - zmax) * scale) - log(total));
    }
}
