// Kernel signatures and dispatch stubs of the indexing ops (ops/indexing.cpp): where, gather and
// its adjoint scatter_add. index_select is gather with a broadcast index and cat/split/stack are
// copies into and views of slices, so they need no kernels of their own. The CPU kernels live in
// ops/cpu/indexing_kernels.cpp; a CUDA backend registers its own.
#pragma once

#include <cstdint>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

/// out <- condition ? a : b elementwise. condition (bool), a and b are already broadcast to out's
/// shape (any strides, stride 0 included); a, b and out share one dtype.
using WhereKernel = void(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b);

// gather/scatter_add work on "columns": the positions of `index` that differ only along `dim`.
// index has the rank of the other operands and any strides (a broadcast index is fine); its values
// lie in [0, size) of the indexed tensor along dim: the op checks that first with check_index_stub.

/// Throws, naming `op`, the value, its position in index and the valid range, unless every value of
/// index (any strides) lies in [0, size); `dim` is only named in the message.
using CheckIndexKernel = void(const char* op, const Tensor& index, int64_t dim, int64_t size);

/// out (contiguous, index's shape) <- a[..., index[..., k, ...], ...] along dim; a any strides.
using GatherKernel = void(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index);
/// out (contiguous) += src at index along dim, for every position of index (src may be larger than
/// index; only its leading part is read). Deterministic: each column is summed in order of k.
using ScatterAddKernel = void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

extern core::DispatchStub<CheckIndexKernel> check_index_stub;
extern core::DispatchStub<WhereKernel> where_stub;
extern core::DispatchStub<GatherKernel> gather_stub;
extern core::DispatchStub<ScatterAddKernel> scatter_add_stub;

}  // namespace colossal::ops
