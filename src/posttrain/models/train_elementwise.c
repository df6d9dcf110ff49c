/* The training pass's RMSNorm and SwiGLU, forward and backward, and the softmax of its LM head's logits;
 * float32, AVX2 and FMA.
 *
 * PyTorch runs Llama's RMSNorm as six operations forward (square, mean, add, rsqrt, two products) and
 * about ten in its backward, and SwiGLU's silu(gate) * up as two forward and three backward; each
 * streams a [rows, width] tensor through memory, and each forward keeps its own result for the
 * backward. Here each is one pass forward and one backward, and only what the backward needs is kept:
 * RMSNorm's input and each row's 1 / rms, SwiGLU's two inputs. The head's softmax statistics take one
 * row at a time through the core's cache (a row of a 49k vocabulary is 196 KB) instead of seven
 * passes over a [rows, vocab] block (see softmax_statistics).
 *
 * Threads come from PyTorch's OpenMP runtime (libgomp.so.1), as in the other kernels; rows are split
 * statically, so the weight gradient's per-thread partial sums, and so the result, depend only on the
 * thread count. Built without FMA contraction: each product is rounded as PyTorch rounds it.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

/* A parallel loop over the local `work` floats: one thread below 16 K of them (not worth waking a second). */
#define PARALLEL_FOR _Pragma("omp parallel for schedule(static) num_threads(threads) if (work >= 16384)")

/* out = weight * (x * inv) per row, inv = 1 / sqrt(mean(x^2) + eps), kept for the backward:
 * x and out [rows, hidden], weight [hidden], inv [rows]. */
void rms_norm_forward(const float *x, const float *weight, int64_t rows, int64_t hidden, float eps, float *out,
                      float *inv, int threads) {
    const int64_t work = rows * hidden;
    PARALLEL_FOR
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * hidden;
        float *o = out + r * hidden;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= hidden; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
        }
        float sum = hsum(acc);
        for (; i < hidden; i++) sum += xr[i] * xr[i];
        float s = 1.0f / sqrtf(sum / (float)hidden + eps);
        inv[r] = s;
        __m256 sv = _mm256_set1_ps(s);
        for (i = 0; i + 8 <= hidden; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                                  _mm256_mul_ps(_mm256_loadu_ps(xr + i), sv)));
        for (; i < hidden; i++) o[i] = weight[i] * (xr[i] * s);
    }
}

/* With xh = x * inv and g = grad_out * weight: grad_x = inv * (g - xh * mean(g * xh)) per row, and
 * grad_weight = the sum over rows of grad_out * xh. partial [threads, hidden] holds each thread's
 * share of that sum, added up into grad_weight [hidden] at the end. */
void rms_norm_backward(const float *x, const float *weight, const float *inv, const float *grad_out, int64_t rows,
                       int64_t hidden, float *grad_x, float *grad_weight, float *partial, int threads) {
    if (rows * hidden < 16384) threads = 1;
    memset(partial, 0, sizeof(float) * threads * hidden);
    _Pragma("omp parallel num_threads(threads)") {
        float *own = partial + omp_get_thread_num() * hidden;
        _Pragma("omp for schedule(static)") for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * hidden, *gr = grad_out + r * hidden;
            float *dx = grad_x + r * hidden;
            __m256 sv = _mm256_set1_ps(inv[r]), acc = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i + 8 <= hidden; i += 8) {
                __m256 xh = _mm256_mul_ps(_mm256_loadu_ps(xr + i), sv), go = _mm256_loadu_ps(gr + i);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(go, _mm256_loadu_ps(weight + i)), xh));
                _mm256_storeu_ps(own + i, _mm256_add_ps(_mm256_loadu_ps(own + i), _mm256_mul_ps(go, xh)));
            }
            float dot = hsum(acc);
            for (; i < hidden; i++) {
                float xh = xr[i] * inv[r];
                dot += gr[i] * weight[i] * xh;
                own[i] += gr[i] * xh;
            }
            __m256 mean = _mm256_set1_ps(dot / (float)hidden);
            for (i = 0; i + 8 <= hidden; i += 8) {
                __m256 xh = _mm256_mul_ps(_mm256_loadu_ps(xr + i), sv);
                __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gr + i), _mm256_loadu_ps(weight + i));
                _mm256_storeu_ps(dx + i, _mm256_mul_ps(sv, _mm256_sub_ps(g, _mm256_mul_ps(xh, mean))));
            }
            for (; i < hidden; i++) dx[i] = inv[r] * (gr[i] * weight[i] - xr[i] * inv[r] * (dot / (float)hidden));
        }
    }
    for (int64_t i = 0; i < hidden; i++) {
        float sum = 0.0f;
        for (int t = 0; t < threads; t++) sum += partial[t * hidden + i];
        grad_weight[i] = sum;
    }
}

/* 1 + e^-g for 8 floats: silu(g) = g / that, as PyTorch computes it, and sigmoid(g) = 1 / that. */
static inline __m256 one_plus_exp_neg8(__m256 g) {
    return _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
}

/* out = silu(gate) * up elementwise over n floats. */
void swiglu_forward(const float *gate, const float *up, int64_t n, float *out, int threads) {
    int64_t blocks = n / 8;
    const int64_t work = n;
    PARALLEL_FOR
    for (int64_t b = 0; b < blocks; b++) {
        __m256 g = _mm256_loadu_ps(gate + 8 * b);
        __m256 silu = _mm256_div_ps(g, one_plus_exp_neg8(g));
        _mm256_storeu_ps(out + 8 * b, _mm256_mul_ps(silu, _mm256_loadu_ps(up + 8 * b)));
    }
    for (int64_t i = 8 * blocks; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* With s = sigmoid(gate): grad_up = grad_out * silu(gate), and grad_gate = grad_out * up * s * (1 + gate *
 * (1 - s)) (the derivative of g * sigmoid(g)), each product in PyTorch's order. */
void swiglu_backward(const float *gate, const float *up, const float *grad_out, int64_t n, float *grad_gate,
                     float *grad_up, int threads) {
    int64_t blocks = n / 8;
    const __m256 one = _mm256_set1_ps(1.0f);
    const int64_t work = n;
    PARALLEL_FOR
    for (int64_t b = 0; b < blocks; b++) {
        __m256 g = _mm256_loadu_ps(gate + 8 * b), go = _mm256_loadu_ps(grad_out + 8 * b), d = one_plus_exp_neg8(g);
        __m256 s = _mm256_div_ps(one, d);
        _mm256_storeu_ps(grad_up + 8 * b, _mm256_mul_ps(go, _mm256_div_ps(g, d)));
        __m256 slope = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s))));
        _mm256_storeu_ps(grad_gate + 8 * b, _mm256_mul_ps(_mm256_mul_ps(go, _mm256_loadu_ps(up + 8 * b)), slope));
    }
    for (int64_t i = 8 * blocks; i < n; i++) {
        float d = 1.0f + expf(-gate[i]), s = 1.0f / d;
        grad_up[i] = grad_out[i] * (gate[i] / d);
        grad_gate[i] = grad_out[i] * up[i] * (s * (1.0f + gate[i] * (1.0f - s)));
    }
}

/* Rows of logits z [rows, V] become their softmax p in place, and for each row: logp = log p[target], entropy =
 * -sum p log p = log total - sum e (z - max) / total and lse = max + log total, where e = exp(z - max) and total =
 * sum e. A row is read from memory once (for its maximum); the pass that exponentiates and the one that
 * normalises find it in the core's cache. The sums run over blocks of 1024 logits in 32 float lanes, each
 * block's added into a double: as accurate as PyTorch's cascaded float sums here (a plain run of float lanes
 * through a 49k vocabulary erred by 25 ulp on the probabilities). */
void softmax_statistics(float *z, const int64_t *targets, int64_t rows, int64_t V, float *logp, float *entropy,
                        float *lse, int threads) {
    const int64_t work = rows * V;
    PARALLEL_FOR
    for (int64_t r = 0; r < rows; r++) {
        float *row = z + r * V;
        int64_t j, whole = V / 32 * 32;
        __m256 most[4];
        for (int t = 0; t < 4; t++) most[t] = _mm256_set1_ps(-INFINITY);
        for (j = 0; j < whole; j += 32)
            for (int t = 0; t < 4; t++) most[t] = _mm256_max_ps(most[t], _mm256_loadu_ps(row + j + 8 * t));
        float m = hmax(_mm256_max_ps(_mm256_max_ps(most[0], most[1]), _mm256_max_ps(most[2], most[3])));
        for (; j < V; j++) m = row[j] > m ? row[j] : m;
        float target = row[targets[r]] - m;
        __m256 vm = _mm256_set1_ps(m);
        double total = 0.0, dot = 0.0;
        for (j = 0; j < whole;) {
            __m256 sum[4], prod[4];
            for (int t = 0; t < 4; t++) sum[t] = prod[t] = _mm256_setzero_ps();
            for (int64_t end = j + 1024 < whole ? j + 1024 : whole; j < end; j += 32)
                for (int t = 0; t < 4; t++) {
                    __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + j + 8 * t), vm), e = exp8(x);
                    _mm256_storeu_ps(row + j + 8 * t, e);
                    sum[t] = _mm256_add_ps(sum[t], e);
                    prod[t] = _mm256_fmadd_ps(e, x, prod[t]);
                }
            total += hsum(_mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3])));
            dot += hsum(_mm256_add_ps(_mm256_add_ps(prod[0], prod[1]), _mm256_add_ps(prod[2], prod[3])));
        }
        for (; j < V; j++) {
            float x = row[j] - m, e = expf(x);
            row[j] = e;
            total += e;
            dot += (double)e * x;
        }
        double log_total = log(total);
        logp[r] = (float)(target - log_total);
        entropy[r] = (float)(log_total - dot / total);
        lse[r] = (float)(m + log_total);
        float inv = (float)(1.0 / total);
        __m256 vi = _mm256_set1_ps(inv);
        for (j = 0; j + 8 <= V; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), vi));
        for (; j < V; j++) row[j] *= inv;
    }
}
