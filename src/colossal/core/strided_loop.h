// for_each_strided: the loop under every elementwise CPU kernel. N operands share one iteration
// shape, each with its own byte strides (0 for broadcast dimensions). Dimensions that are
// contiguous for every operand are merged, and the body is called once per innermost run with a
// pointer per operand, that run's byte strides and its length, so kernels vectorise the inner loop.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "colossal/core/parallel_for.h"
#include "colossal/core/tensor.h"

namespace colossal::core {

template <size_t N>
struct StridedOperands {
  Shape shape;                                  ///< iteration shape (after merging)
  std::array<std::vector<int64_t>, N> strides;  ///< byte strides per operand, same rank as shape
  std::array<char*, N> base{};
};

/// Builds the operand description for tensors already broadcast to `shape` (use core::expand_to
/// first), merging dimensions that are contiguous for all operands.
template <size_t N>
StridedOperands<N> make_strided_operands(const Shape& shape, const std::array<const Tensor*, N>& tensors) {
  StridedOperands<N> ops;
  const int64_t rank = static_cast<int64_t>(shape.size());
  for (size_t k = 0; k < N; ++k) ops.base[k] = static_cast<char*>(tensors[k]->raw_data());
  // Merge from the innermost dimension outwards; size-1 dims are dropped.
  std::vector<int64_t> merged_shape;
  std::array<std::vector<int64_t>, N> merged_strides;
  for (int64_t d = rank - 1; d >= 0; --d) {
    const int64_t size = shape[d];
    if (size == 1) continue;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = tensors[k]->strides()[d] * static_cast<int64_t>(tensors[k]->element_size());
    bool can_merge = !merged_shape.empty();
    for (size_t k = 0; k < N && can_merge; ++k) {
      can_merge = merged_strides[k].back() * merged_shape.back() == s[k];
    }
    if (can_merge) {
      merged_shape.back() *= size;
    } else {
      merged_shape.push_back(size);
      for (size_t k = 0; k < N; ++k) merged_strides[k].push_back(s[k]);
    }
  }
  if (merged_shape.empty()) {  // a single element (or an all-ones shape)
    merged_shape.push_back(shape_numel(shape));
    for (size_t k = 0; k < N; ++k) merged_strides[k].push_back(0);
  }
  // Stored innermost-first above; flip to outermost-first.
  ops.shape.assign(merged_shape.rbegin(), merged_shape.rend());
  for (size_t k = 0; k < N; ++k) ops.strides[k].assign(merged_strides[k].rbegin(), merged_strides[k].rend());
  return ops;
}

/// Calls body(ptrs, inner_strides, inner_count) for every innermost run, splitting the outer
/// iterations over threads when the total work exceeds `grain` elements.
template <size_t N, class Body>
void for_each_strided(const StridedOperands<N>& ops, Body&& body, int64_t grain = kParallelGrain) {
  const int64_t rank = static_cast<int64_t>(ops.shape.size());
  const int64_t inner = ops.shape.back();
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < rank; ++d) outer *= ops.shape[d];
  if (inner == 0 || outer == 0) return;
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = ops.strides[k].back();

  auto run_range = [&](int64_t begin, int64_t end) {
    // Position of `begin` as a multi-index over the outer dimensions.
    std::vector<int64_t> index(static_cast<size_t>(std::max<int64_t>(rank - 1, 0)), 0);
    int64_t rest = begin;
    for (int64_t d = rank - 2; d >= 0; --d) {
      index[d] = rest % ops.shape[d];
      rest /= ops.shape[d];
    }
    std::array<char*, N> ptrs;
    for (size_t k = 0; k < N; ++k) {
      ptrs[k] = ops.base[k];
      for (int64_t d = 0; d + 1 < rank; ++d) ptrs[k] += index[d] * ops.strides[k][d];
    }
    for (int64_t i = begin; i < end; ++i) {
      body(ptrs, inner_strides, inner);
      // Advance the odometer.
      for (int64_t d = rank - 2; d >= 0; --d) {
        ++index[d];
        for (size_t k = 0; k < N; ++k) ptrs[k] += ops.strides[k][d];
        if (index[d] < ops.shape[d]) break;
        for (size_t k = 0; k < N; ++k) ptrs[k] -= ops.strides[k][d] * ops.shape[d];
        index[d] = 0;
      }
    }
  };
  if (outer == 1) {
    // One long run: split it instead of the (single) outer iteration.
    parallel_for(0, inner, grain, [&](int64_t b, int64_t e) {
      std::array<char*, N> ptrs;
      for (size_t k = 0; k < N; ++k) ptrs[k] = ops.base[k] + b * inner_strides[k];
      body(ptrs, inner_strides, e - b);
    });
    return;
  }
  parallel_for(0, outer, std::max<int64_t>(1, grain / inner), run_range);
}

}  // namespace colossal::core
