/* A float32 matrix transposed into a new contiguous one; AVX2.
 *
 * A weight gradient dY^T x on oneDNN needs dY^T contiguous, and PyTorch's strided copy moves a
 * transposed [1094, 1536] gradient at 2.5-4 GB/s on a Zen 4 EPYC (2 threads): 2.5-3.6 ms, a third
 * of the product it feeds. Here 16 x 16 blocks go through registers (four 8 x 8 transposes), so every
 * store fills a whole 64-byte line of the destination and every source line is read once: 0.9-1.3 ms.
 * The columns are walked in bands of 64, each band down all the rows, so that one band's destination
 * lines (64 rows) and source pages stay few however wide the matrix is (an LM head's 49k columns).
 *
 * Threads come from PyTorch's OpenMP runtime (libgomp.so.1), as in the other kernels; they take bands.
 */
#include <omp.h>
#include <stdint.h>

#include "simd.h"

#define BAND 64

/* The 16 x 16 block at rows i.., columns j.. of src (rows ld floats apart) into rows j.., columns i.. of dst
 * (rows `rows` floats apart). */
static inline void block16(const float *src, int64_t ld, float *dst, int64_t rows, int64_t i, int64_t j) {
    for (int h = 0; h < 16; h += 8) {
        __m256 top[8], bottom[8];
        for (int k = 0; k < 8; k++) top[k] = _mm256_loadu_ps(src + (i + k) * ld + j + h);
        for (int k = 0; k < 8; k++) bottom[k] = _mm256_loadu_ps(src + (i + 8 + k) * ld + j + h);
        transpose8(top);
        transpose8(bottom);
        for (int k = 0; k < 8; k++) {
            _mm256_storeu_ps(dst + (j + h + k) * rows + i, top[k]);
            _mm256_storeu_ps(dst + (j + h + k) * rows + i + 8, bottom[k]);
        }
    }
}

/* dst [cols, rows] = src [rows, cols] transposed; src's rows are ld floats apart, dst is contiguous. */
void transpose_f32(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst, int threads) {
    const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16, bands = (cols + BAND - 1) / BAND;
    if (rows * cols < 16384) threads = 1; /* not worth waking a second thread */
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int64_t band = 0; band < bands; band++) {
        const int64_t j0 = band * BAND, j1 = j0 + BAND < cols ? j0 + BAND : cols;
        const int64_t blocked = j1 < full_cols ? j1 : full_cols; /* columns j0 .. blocked go in 16 x 16 blocks */
        for (int64_t i = 0; i < full_rows; i += 16) {
            for (int64_t j = j0; j < blocked; j += 16) block16(src, ld, dst, rows, i, j);
            for (int64_t j = blocked > j0 ? blocked : j0; j < j1; j++)
                for (int64_t k = i; k < i + 16; k++) dst[j * rows + k] = src[k * ld + j];
        }
        for (int64_t k = full_rows; k < rows; k++)
            for (int64_t j = j0; j < j1; j++) dst[j * rows + k] = src[k * ld + j];
    }
}
