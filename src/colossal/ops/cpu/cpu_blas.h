// What the CPU kernels that call OpenBLAS share (batched GEMM, attention): typed cblas GEMM
// wrappers that tolerate empty sizes, the compute type per dtype, per-batch offsets and packing of strided
// matrices, and the rule for threads around BLAS. CPU backend only.
#pragma once

#include <cblas.h>  // cblas_sgemm, cblas_dgemm, CBLAS_TRANSPOSE, blasint

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::ops::cpu {

/// The type BLAS computes in for storage type T: double for f64, float for f32, f16 and bf16.
template <class T>
using BlasCompute = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Note [OpenBLAS and our threads]: OpenBLAS (the Debian pthread build, 0.3.21) runs a GEMM on
// its own thread pool once M*N*K passes 65536 * GEMM_MULTITHREAD_THRESHOLD, and on the caller's
// thread below that. It is tempting to spread a batch of small GEMMs over our OpenMP threads, but
// concurrent calls into OpenBLAS serialise on its internal locks: measured on the 2-core dev
// machine, 32x32x32 SGEMMs from 2 OpenMP threads took 11 us each against 0.9 us from one thread,
// and a 256 x 32^3 bmm went from 0.27 ms to 15 ms. So kernels call BLAS from one thread only, one
// batch matrix after another, and parallelise only their own non-BLAS loops.

/// Row-major C[m, n] = op(A) op(B) + beta * C with op(A) [m, k] and op(B) [k, n]. Empty sizes are
/// handled here (BLAS rejects a leading dimension of 0).
template <class C>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const C* a, int64_t lda, const C* b, int64_t ldb,
          C beta, C* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == C(0) ? C(0) : beta * c[i * ldc + j];
    }
    return;
  }
  COLOSSAL_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX,
                 "gemm: sizes M={} N={} K={} (leading dimensions {}, {}, {}) exceed BLAS's 32-bit indices", m, n, k,
                 lda, ldb, ldc);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i32 = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<C, double>) {
    cblas_dgemm(CblasRowMajor, ta, tb, i32(m), i32(n), i32(k), 1.0, a, i32(lda), b, i32(ldb), beta, c, i32(ldc));
  } else {
    static_assert(std::is_same_v<C, float>, "BLAS computes in float or double");
    cblas_sgemm(CblasRowMajor, ta, tb, i32(m), i32(n), i32(k), 1.0f, a, i32(lda), b, i32(ldb), beta, c, i32(ldc));
  }
}

/// Element offset of every matrix of t [batch..., rows, cols], in row-major order of the batch
/// index (t's first batch_rank dimensions; stride 0 on broadcast ones is fine).
inline std::vector<int64_t> batch_offsets(const Tensor& t, int64_t batch_rank) {
  int64_t count = 1;
  for (int64_t d = 0; d < batch_rank; ++d) count *= t.shape()[d];
  std::vector<int64_t> offsets(static_cast<size_t>(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, offset = 0;
    for (int64_t d = batch_rank - 1; d >= 0; --d) {
      offset += (rest % t.shape()[d]) * t.strides()[d];
      rest /= t.shape()[d];
    }
    offsets[i] = offset;
  }
  return offsets;
}

/// Copies a [rows, cols] matrix with element strides (rs, cs) into a row-major buffer of type C.
template <class C, class T>
void pack_matrix(const T* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, C* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = static_cast<C>(src[i * rs + j * cs]);
  }
}

}  // namespace colossal::ops::cpu
