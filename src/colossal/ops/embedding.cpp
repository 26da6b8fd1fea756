// embedding: input checks, the flattened [n, dim] layout the kernels work on, and autograd through
// the deterministic scatter-add backward kernel (ops/loss_kernels.h), which adds into the gradient
// the weight's joins where the engine offers one.
#include "colossal/autograd/engine.h"    // accumulation_target, mark_accumulated
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw, view_raw
#include "colossal/ops/loss_kernels.h"
#include "colossal/ops/nn_functional.h"

namespace colossal::ops {

constinit core::DispatchStub<EmbeddingForwardKernel> embedding_forward_stub("embedding_forward");
constinit core::DispatchStub<EmbeddingBackwardKernel> embedding_backward_stub("embedding_backward");
constinit core::DispatchStub<EmbeddingPutKernel> embedding_put_stub("embedding_put");

Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx) {
  COLOSSAL_CHECK(indices.defined() && weight.defined(), "embedding: indices and weight must be defined");
  COLOSSAL_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64,
                 "embedding: indices must be i32 or i64, got {} of shape {}", indices.dtype(), indices.shape());
  COLOSSAL_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got shape {}", weight.shape());
  COLOSSAL_CHECK(core::is_floating(weight.dtype()),
                 "embedding: weight must be floating (f32, f64, f16, bf16), got {} of shape {}", weight.dtype(),
                 weight.shape());
  COLOSSAL_CHECK(indices.device() == weight.device(), "embedding: indices are on {} but weight is on {}",
                 indices.device(), weight.device());
  const int64_t num_embeddings = weight.shape()[0];
  const int64_t dim = weight.shape()[1];
  // Negative padding_idx means "no padding row" (the default -1), as documented in the header.
  COLOSSAL_CHECK(padding_idx < num_embeddings,
                 "embedding: padding_idx {} is out of range for num_embeddings {} (valid: 0..{}, or negative for none)",
                 padding_idx, num_embeddings, num_embeddings - 1);

  const Tensor flat_indices = core::contiguous_raw(indices);
  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = core::empty(out_shape, TensorOptions(weight.dtype(), weight.device()));
  if (indices.numel() > 0) {  // with dim == 0 the indices are still checked
    embedding_forward_stub(weight.device(), core::view_raw(out, {indices.numel(), dim}), flat_indices, weight);
  }

  autograd::record(
      "embedding", {weight}, {out},
      [saved_indices = flat_indices.detach(), weight_shape = weight.shape(), dtype = weight.dtype(),
       device = weight.device(), padding_idx](const std::vector<Tensor>& grads, const autograd::Node& node) {
        const int64_t n = saved_indices.numel();
        const Tensor grad_out = core::view_raw(core::contiguous_raw(grads[0]), {n, weight_shape[1]});
        // Where the gradient joins a sum (the .grad of earlier microbatches, or another use's waiting at
        // the leaf: a tied weight's), the kernel adds the rows the indices name into it and leaves the
        // rest alone, instead of clearing a whole table for the engine to add (Note [Gradient
        // accumulation in the op] in autograd/engine.cpp).
        const Tensor target = autograd::accumulation_target(node, 0, dtype);
        if (target.defined() && target.shape() == weight_shape && target.is_contiguous()) {
          if (target.numel() > 0) embedding_backward_stub(device, target, grad_out, saved_indices, padding_idx, true);
          autograd::mark_accumulated(node, 0);
          return std::vector<Tensor>{Tensor()};
        }
        Tensor grad_weight = core::empty(weight_shape, TensorOptions(dtype, device));
        if (grad_weight.numel() > 0) {
          embedding_backward_stub(device, grad_weight, grad_out, saved_indices, padding_idx, false);
        }
        return std::vector<Tensor>{grad_weight};
      });
  return out;
}

void embedding_put_(const Tensor& weight, const Tensor& indices, const Tensor& rows) {
  COLOSSAL_CHECK(indices.defined() && weight.defined() && rows.defined(),
                 "embedding_put_: weight, indices and rows must be defined");
  COLOSSAL_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64,
                 "embedding_put_: indices must be i32 or i64, got {} of shape {}", indices.dtype(), indices.shape());
  COLOSSAL_CHECK(weight.dim() == 2 && core::is_floating(weight.dtype()),
                 "embedding_put_: weight must be a floating [num_embeddings, dim], got {} of shape {}", weight.dtype(),
                 weight.shape());
  COLOSSAL_CHECK(!weight.requires_grad(),
                 "embedding_put_: weight of shape {} requires a gradient; embedding_put_ writes in place outside "
                 "autograd (use it on a gradient or under no_grad on a detached tensor)",
                 weight.shape());
  Shape expected = indices.shape();
  expected.push_back(weight.shape()[1]);
  COLOSSAL_CHECK(rows.shape() == expected && rows.dtype() == weight.dtype(),
                 "embedding_put_: rows must be {} of shape {} (indices {} and the weight's dim), got {} of shape {}",
                 weight.dtype(), expected, indices.shape(), rows.dtype(), rows.shape());
  COLOSSAL_CHECK(indices.device() == weight.device() && rows.device() == weight.device(),
                 "embedding_put_: weight is on {}, indices on {}, rows on {}; put them on one device", weight.device(),
                 indices.device(), rows.device());
  if (indices.numel() == 0) return;
  embedding_put_stub(weight.device(), weight, core::contiguous_raw(indices),
                     core::view_raw(core::contiguous_raw(rows), {indices.numel(), weight.shape()[1]}));
}

}  // namespace colossal::ops
