// Joining, splitting and indexing: cat, stack, split, index_select, gather, scatter_add, where,
// masked_fill. All differentiable in their floating inputs.
#pragma once

#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::ops {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Chunks of split_size along dim (the last may be smaller); views of a.
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
/// Chunks with the given sizes, which must add up to a's size along dim.
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// Entries of a along dim at the (1-D, integer) positions in index.
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
/// out[i][j] = a[index[i][j]][j] for dim 0 (and so on): index has a's rank.
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
/// a with src added at index along dim (the adjoint of gather).
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
/// condition ? a : b, broadcasting all three; condition is bool.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
/// a with value wherever mask (bool, broadcast to a) is true.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

}  // namespace colossal::ops
