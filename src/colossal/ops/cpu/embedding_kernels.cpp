// CPU embedding kernels: a row gather forward and a scatter-add backward that is parallel without
// atomics and deterministic, for f32, f64, f16 and bf16 weights (the backward sums f16/bf16 in f32).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

/// The multi-index of row-major element `flat` of `shape`, for error messages.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape position(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    position[d] = flat % shape[d];
    flat /= shape[d];
  }
  return position;
}

template <class Index>
void check_index(Index value, int64_t k, const Tensor& indices, int64_t num_embeddings, const char* op = "embedding") {
  if (value >= 0 && value < num_embeddings) [[likely]] {
    return;
  }
  COLOSSAL_FAIL("{}: index {} at position {} of indices {} is out of range for num_embeddings {} (valid: 0..{})", op,
                static_cast<int64_t>(value), unravel(k, indices.shape()), indices.shape(), num_embeddings,
                num_embeddings - 1);
}

void embedding_forward_cpu(const Tensor& out, const Tensor& indices, const Tensor& weight) {
  const int64_t n = indices.numel();
  const int64_t num_embeddings = weight.shape()[0];
  const int64_t dim = weight.shape()[1];
  const int64_t row_stride = weight.strides()[0];
  const int64_t col_stride = weight.strides()[1];
  core::dispatch_index(indices.dtype(), "embedding", [&]<class Index>() {
    const Index* idx = indices.data<Index>();
    // Checked serially up front: an exception must not escape an OpenMP region.
    for (int64_t k = 0; k < n; ++k) check_index(idx[k], k, indices, num_embeddings);
    if (dim == 0) return;
    core::dispatch_floating(weight.dtype(), "embedding", [&]<class T>() {
      const T* w = weight.data<T>();
      T* y = out.data<T>();
      core::parallel_for(0, n, std::max<int64_t>(1, core::kParallelGrain / dim), [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const T* src = w + static_cast<int64_t>(idx[k]) * row_stride;
          T* dst = y + k * dim;
          if (col_stride == 1) {
            std::memcpy(dst, src, static_cast<size_t>(dim) * sizeof(T));
          } else {
            for (int64_t j = 0; j < dim; ++j) dst[j] = src[j * col_stride];
          }
        }
      });
    });
  });
}

void embedding_put_cpu(const Tensor& weight, const Tensor& indices, const Tensor& rows) {
  const int64_t n = indices.numel();
  const int64_t num_embeddings = weight.shape()[0];
  const int64_t dim = weight.shape()[1];
  const int64_t row_stride = weight.strides()[0];
  const int64_t col_stride = weight.strides()[1];
  core::dispatch_index(indices.dtype(), "embedding_put_", [&]<class Index>() {
    const Index* idx = indices.data<Index>();
    for (int64_t k = 0; k < n; ++k) check_index(idx[k], k, indices, num_embeddings, "embedding_put_");
    if (dim == 0) return;
    core::dispatch_floating(weight.dtype(), "embedding_put_", [&]<class T>() {
      T* w = weight.data<T>();
      const T* src_rows = rows.data<T>();
      // Serial: two positions may name one row (with equal rows), which threads must not share.
      for (int64_t k = 0; k < n; ++k) {
        T* dst = w + static_cast<int64_t>(idx[k]) * row_stride;
        const T* src = src_rows + k * dim;
        if (col_stride == 1) {
          std::memcpy(dst, src, static_cast<size_t>(dim) * sizeof(T));
        } else {
          for (int64_t j = 0; j < dim; ++j) dst[j * col_stride] = src[j];
        }
      }
    });
  });
}

// Positions are bucketed by destination row with a stable counting sort, so each thread owns whole
// rows of grad_weight (no two threads write one row) and every row sums its contributions in
// ascending position order whatever the thread count: bitwise reproducible, no atomics. With
// `accumulate` only the rows with contributions are read and written (old + sum, rounded once).
void embedding_backward_cpu(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                            int64_t padding_idx, bool accumulate) {
  const int64_t n = indices.numel();
  const int64_t num_embeddings = grad_weight.shape()[0];
  const int64_t dim = grad_weight.shape()[1];
  std::vector<int64_t> row_start(static_cast<size_t>(num_embeddings) + 1, 0);
  std::vector<int64_t> order;
  core::dispatch_index(indices.dtype(), "embedding backward", [&]<class Index>() {
    const Index* idx = indices.data<Index>();
    for (int64_t k = 0; k < n; ++k) {
      check_index(idx[k], k, indices, num_embeddings);
      if (idx[k] != padding_idx) ++row_start[static_cast<size_t>(idx[k]) + 1];
    }
    for (int64_t r = 0; r < num_embeddings; ++r) row_start[r + 1] += row_start[r];
    order.resize(static_cast<size_t>(row_start[num_embeddings]));
    std::vector<int64_t> next(row_start.begin(), row_start.end() - 1);
    for (int64_t k = 0; k < n; ++k) {
      if (idx[k] != padding_idx) order[static_cast<size_t>(next[static_cast<size_t>(idx[k])]++)] = k;
    }
  });
  core::dispatch_floating(grad_weight.dtype(), "embedding backward", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* dy = grad_out.data<T>();
    T* dw = grad_weight.data<T>();
    core::parallel_for(0, num_embeddings, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(dim, 1)),
                       [&](int64_t begin, int64_t end) {
                         std::vector<Acc> acc(static_cast<size_t>(dim));
                         for (int64_t r = begin; r < end; ++r) {
                           if (accumulate && row_start[r] == row_start[r + 1]) continue;  // keeps its gradient
                           std::fill(acc.begin(), acc.end(), Acc(0));
                           for (int64_t e = row_start[r]; e < row_start[r + 1]; ++e) {
                             const T* src = dy + order[static_cast<size_t>(e)] * dim;
                             for (int64_t j = 0; j < dim; ++j) acc[j] += static_cast<Acc>(src[j]);
                           }
                           T* dst = dw + r * dim;
                           if (accumulate) {
                             for (int64_t j = 0; j < dim; ++j)
                               dst[j] = static_cast<T>(static_cast<Acc>(dst[j]) + acc[j]);
                           } else {
                             for (int64_t j = 0; j < dim; ++j) dst[j] = static_cast<T>(acc[j]);
                           }
                         }
                       });
  });
}

COLOSSAL_REGISTER_KERNEL(embedding_forward_stub, core::DeviceType::cpu, embedding_forward_cpu);
COLOSSAL_REGISTER_KERNEL(embedding_backward_stub, core::DeviceType::cpu, embedding_backward_cpu);
COLOSSAL_REGISTER_KERNEL(embedding_put_stub, core::DeviceType::cpu, embedding_put_cpu);

}  // namespace
}  // namespace colossal::ops
