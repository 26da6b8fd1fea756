// CPU batched GEMM through OpenBLAS: f32 and f64 go straight to cblas_sgemm / cblas_dgemm, f16 and
// bf16 are converted to f32 around cblas_sgemm. Transposed views reach BLAS as transpose flags;
// only layouts BLAS cannot describe (e.g. a step along the last dimension) are packed.
#include <optional>
#include <type_traits>
#include <vector>

#include "colossal/ops/cpu/cpu_blas.h"  // gemm, batch_offsets, pack_matrix, BlasCompute
#include "colossal/ops/linalg_kernels.h"

namespace colossal::ops {
namespace {

/// How BLAS reads a [rows, cols] matrix stored with element strides (row_stride, col_stride).
struct BlasMatrix {
  bool trans;
  int64_t ld;
};

/// The transpose flag and leading dimension that describe the layout to row-major BLAS, or nothing
/// when neither dimension is unit-stride. The stride of a size-1 dimension is never used, so it is
/// chosen to suit BLAS (views produced by unsqueeze or expand often carry odd ones there).
std::optional<BlasMatrix> blas_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  {  // row-major: (i, j) at i * ld + j
    const int64_t rs = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    const int64_t cs = cols == 1 ? 1 : col_stride;
    if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return BlasMatrix{false, rs};
  }
  {  // column-major, i.e. the transpose of a row-major [cols, rows]: (i, j) at j * ld + i
    const int64_t rs = rows == 1 ? 1 : row_stride;
    const int64_t cs = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return BlasMatrix{true, cs};
  }
  return std::nullopt;
}

void batched_gemm_cpu(const Tensor& out, const Tensor& a, const Tensor& b, double beta) {
  const int64_t rank = out.dim();
  const int64_t batch_rank = rank - 2;
  const int64_t m = out.shape()[rank - 2], n = out.shape()[rank - 1], k = a.shape()[rank - 1];
  const std::vector<int64_t> a_offsets = cpu::batch_offsets(a, batch_rank);
  const std::vector<int64_t> b_offsets = cpu::batch_offsets(b, batch_rank);
  const int64_t count = static_cast<int64_t>(a_offsets.size());
  if (count == 0 || m == 0 || n == 0) return;
  const int64_t a_rs = a.strides()[rank - 2], a_cs = a.strides()[rank - 1];
  const int64_t b_rs = b.strides()[rank - 2], b_cs = b.strides()[rank - 1];
  const std::optional<BlasMatrix> a_layout = blas_layout(m, k, a_rs, a_cs);
  const std::optional<BlasMatrix> b_layout = blas_layout(k, n, b_rs, b_cs);

  core::dispatch_floating(out.dtype(), "matmul", [&]<class T>() {
    using Compute = cpu::BlasCompute<T>;
    constexpr bool native = std::is_same_v<T, Compute>;
    // f16/bf16 operands, and layouts BLAS cannot describe, are packed row-major in Compute.
    const bool pack_a = !native || !a_layout;
    const bool pack_b = !native || !b_layout;
    const BlasMatrix la = pack_a ? BlasMatrix{false, k} : *a_layout;
    const BlasMatrix lb = pack_b ? BlasMatrix{false, n} : *b_layout;
    const T* a_base = a.data<T>();
    const T* b_base = b.data<T>();
    T* out_base = out.data<T>();

    auto run = [&](int64_t begin, int64_t end) {
      std::vector<Compute> a_buf(pack_a ? m * k : 0), b_buf(pack_b ? k * n : 0), c_buf(native ? 0 : m * n);
      for (int64_t i = begin; i < end; ++i) {
        const Compute* a_blas;
        const Compute* b_blas;
        if (pack_a) {
          cpu::pack_matrix(a_base + a_offsets[i], m, k, a_rs, a_cs, a_buf.data());
          a_blas = a_buf.data();
        } else {
          a_blas = reinterpret_cast<const Compute*>(a_base + a_offsets[i]);
        }
        if (pack_b) {
          cpu::pack_matrix(b_base + b_offsets[i], k, n, b_rs, b_cs, b_buf.data());
          b_blas = b_buf.data();
        } else {
          b_blas = reinterpret_cast<const Compute*>(b_base + b_offsets[i]);
        }
        T* c_ptr = out_base + i * m * n;
        if constexpr (native) {
          cpu::gemm<Compute>(la.trans, lb.trans, m, n, k, a_blas, la.ld, b_blas, lb.ld, static_cast<Compute>(beta),
                             c_ptr, n);
        } else {
          if (beta != 0.0) {
            for (int64_t j = 0; j < m * n; ++j) c_buf[j] = static_cast<Compute>(c_ptr[j]);
          }
          cpu::gemm<Compute>(la.trans, lb.trans, m, n, k, a_blas, la.ld, b_blas, lb.ld, static_cast<Compute>(beta),
                             c_buf.data(), n);
          for (int64_t j = 0; j < m * n; ++j) c_ptr[j] = static_cast<T>(c_buf[j]);
        }
      }
    };
    // One matrix at a time; see Note [OpenBLAS and our threads] in cpu_blas.h.
    run(0, count);
  });
}

COLOSSAL_REGISTER_KERNEL(batched_gemm_stub, core::DeviceType::cpu, batched_gemm_cpu);

}  // namespace
}  // namespace colossal::ops
