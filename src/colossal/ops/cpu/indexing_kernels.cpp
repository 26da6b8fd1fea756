// CPU kernels of where, gather and scatter_add, for every dtype (scatter_add: arithmetic dtypes).
// gather and scatter_add split the columns of the index (positions that differ only along dim)
// over threads: two columns never touch the same output element, so scatter_add needs no atomics
// and sums each element in index order whatever the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/core/strided_loop.h"  // make_strided_operands, for_each_strided
#include "colossal/ops/indexing_kernels.h"

namespace colossal::ops {
namespace {

void where_cpu(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  auto operands = core::make_strided_operands<4>(out.shape(), {&out, &condition, &a, &b});
  core::dispatch_all(out.dtype(), [&]<class T>() {
    core::for_each_strided(operands, [](const std::array<char*, 4>& p, const std::array<int64_t, 4>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const bool take_a = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
        const char* src = take_a ? p[2] + i * s[2] : p[3] + i * s[3];
        *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const T*>(src);
      }
    });
  });
}

/// Element offsets of the start of column `column` (row-major over index's shape with dim left out)
/// in each of the given stride vectors; dim's own coordinate is 0.
template <size_t N>
std::array<int64_t, N> column_offsets(int64_t column, const Shape& shape, int64_t dim,
                                      const std::array<const Shape*, N>& strides) {
  std::array<int64_t, N> offsets{};
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (d == dim) continue;
    const int64_t coordinate = column % shape[d];
    column /= shape[d];
    for (size_t k = 0; k < N; ++k) offsets[k] += coordinate * (*strides[k])[d];
  }
  return offsets;
}

/// Checks every index value against [0, size) serially (an exception must not leave a parallel
/// region), visiting only the distinct elements of a broadcast index.
template <class Index>
void check_indices_of(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  const Shape& shape = index.shape();
  const Shape& strides = index.strides();
  const Index* base = index.data<Index>();
  Shape position(shape.size(), 0);
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t offset = 0;
  if (index.numel() == 0) return;
  while (true) {
    const Index value = base[offset];
    if (value < 0 || value >= size) [[unlikely]] {
      COLOSSAL_FAIL("{}: index {} at position {} of index {} is out of range for dim {} of size {} (valid: 0..{})", op,
                    static_cast<int64_t>(value), position, shape, dim, size, size - 1);
    }
    int64_t d = rank - 1;
    for (; d >= 0; --d) {
      if (strides[d] == 0) continue;  // broadcast: every coordinate reads the same values
      if (++position[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      position[d] = 0;
    }
    if (d < 0) return;
  }
}

void check_index_cpu(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  core::dispatch_index(index.dtype(), op, [&]<class Index>() { check_indices_of<Index>(op, index, dim, size); });
}

int64_t column_count(const Shape& shape, int64_t dim) {
  return shape[dim] == 0 ? 0 : core::shape_numel(shape) / shape[dim];
}

void gather_cpu(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  const Shape& shape = index.shape();
  const int64_t length = shape[dim];
  const int64_t columns = column_count(shape, dim);
  core::dispatch_index(index.dtype(), "gather", [&]<class Index>() {
    core::dispatch_all(a.dtype(), [&]<class T>() {
      const T* src = a.data<T>();
      T* dst = out.data<T>();
      const Index* idx = index.data<Index>();
      const int64_t a_step = a.strides()[dim];
      const int64_t index_step = index.strides()[dim];
      const int64_t out_step = out.strides()[dim];
      core::parallel_for(
          0, columns, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(length, 1)),
          [&](int64_t begin, int64_t end) {
            for (int64_t c = begin; c < end; ++c) {
              const auto [o, i, s] = column_offsets<3>(c, shape, dim, {&out.strides(), &index.strides(), &a.strides()});
              for (int64_t k = 0; k < length; ++k) {
                dst[o + k * out_step] = src[s + static_cast<int64_t>(idx[i + k * index_step]) * a_step];
              }
            }
          });
    });
  });
}

void scatter_add_cpu(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const Shape& shape = index.shape();
  const int64_t length = shape[dim];
  const int64_t columns = column_count(shape, dim);
  core::dispatch_index(index.dtype(), "scatter_add", [&]<class Index>() {
    core::dispatch_arithmetic(out.dtype(), "scatter_add", [&]<class T>() {
      using Acc = core::acc_t<T>;
      const T* from = src.data<T>();
      T* dst = out.data<T>();
      const Index* idx = index.data<Index>();
      const int64_t out_step = out.strides()[dim];
      const int64_t index_step = index.strides()[dim];
      const int64_t src_step = src.strides()[dim];
      core::parallel_for(0, columns, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(length, 1)),
                         [&](int64_t begin, int64_t end) {
                           for (int64_t c = begin; c < end; ++c) {
                             const auto [o, i, s] =
                                 column_offsets<3>(c, shape, dim, {&out.strides(), &index.strides(), &src.strides()});
                             for (int64_t k = 0; k < length; ++k) {
                               T& target = dst[o + static_cast<int64_t>(idx[i + k * index_step]) * out_step];
                               target =
                                   static_cast<T>(static_cast<Acc>(target) + static_cast<Acc>(from[s + k * src_step]));
                             }
                           }
                         });
    });
  });
}

COLOSSAL_REGISTER_KERNEL(check_index_stub, core::DeviceType::cpu, check_index_cpu);
COLOSSAL_REGISTER_KERNEL(where_stub, core::DeviceType::cpu, where_cpu);
COLOSSAL_REGISTER_KERNEL(gather_stub, core::DeviceType::cpu, gather_cpu);
COLOSSAL_REGISTER_KERNEL(scatter_add_stub, core::DeviceType::cpu, scatter_add_cpu);

}  // namespace
}  // namespace colossal::ops
