// scaled_dot_product_attention: shape checks, broadcasting of the batch (and head) dimensions, and
// autograd through the fused forward and backward kernels of ops/nn_kernels.h. The forward saves
// only each query row's logsumexp; the backward recomputes the probabilities from it, as flash
// attention does, so memory stays O(T) per row instead of O(Tq * Tk). Attention dropout runs inside
// the fused kernel where one takes it, else through the unfused composition (Note [Attention dropout]).
//
// Note [Attention dropout]
// Dropout on the probabilities needs either a kernel that draws the mask itself or the probabilities
// materialised. The fused path (attention_dropout_*_stub; on CUDA cuDNN's engine) draws the mask
// from the Philox stream (generator seed, generator offset) inside the kernel: the op reads the
// generator's offset, asks the kernel, and only when it took the problem reserves B * H * Tq * Tk
// offsets (a range no later draw overlaps, however the kernel walks its counter; Note [cuDNN
// attention dropout] in ops/cuda/attention_cudnn.cpp). The autograd node keeps the seed and offset
// in its AttentionParams, and the backward kernel draws the same mask again from them: no mask is
// stored. Everything else (the CPU, f32, shapes the engine declines, p == 1) runs the composition
// softmax(q k^T * scale + mask) -> ops::dropout -> matmul, whose mask is Note [Dropout mask]'s,
// one generator offset per call, the same on every device. A seed so reproduces a run on one
// device and path; the fused and unfused masks differ, as torch's do between its backends.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // expand_raw, contiguous_raw, broadcast_shapes
#include "colossal/ops/autocast.h"
#include "colossal/ops/elementwise.h"  // add, mul
#include "colossal/ops/linalg.h"       // matmul
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/nn_kernels.h"
#include "colossal/ops/reduction.h"  // sum_to

namespace colossal::ops {

constinit core::DispatchStub<AttentionForwardKernel> attention_forward_stub("attention_forward");
constinit core::DispatchStub<AttentionBackwardKernel> attention_backward_stub("attention_backward");
constinit core::DispatchStub<AttentionDropoutForwardKernel> attention_dropout_forward_stub("attention_dropout_forward");
constinit core::DispatchStub<AttentionDropoutBackwardKernel> attention_dropout_backward_stub(
    "attention_dropout_backward");

namespace {

Shape batch_shape(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 2);
}

/// Whether the shapes broadcast together: aligned from the right, each dimension's sizes other
/// than 1 agree.
bool batches_broadcast(const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  for (size_t i = 1; i <= rank; ++i) {
    int64_t size = 1;
    for (const Shape& s : shapes) {
      if (i > s.size() || s[s.size() - i] == 1) continue;
      if (size != 1 && s[s.size() - i] != size) return false;
      size = s[s.size() - i];
    }
  }
  return true;
}

/// The CUDA kernels write strided outputs and read a strided grad_out in place; the CPU kernels
/// take contiguous ones. These run the stubs either way.
void forward_into(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionParams& params) {
  if (out.numel() == 0) return;
  if (q.device().is_cuda() || out.is_contiguous()) return attention_forward_stub(q.device(), out, lse, q, k, v, params);
  const Tensor buffer = core::empty(out.shape(), TensorOptions(out.dtype(), out.device()));
  attention_forward_stub(q.device(), buffer, lse, q, k, v, params);
  core::copy_stub(out.device(), out, buffer);
}

void backward_into(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                   const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const AttentionParams& params) {
  if (params.dropout_p > 0.0) {
    // The forward ran on a fused dropout kernel; only its backward can draw the same mask again. It
    // reads operands in place where their rows are aligned: a gradient that is not (a broadcast one,
    // from a sum) is made contiguous, and gradients the kernel cannot write go through buffers.
    auto fused = [&](const Tensor& gq, const Tensor& gk, const Tensor& gv, const Tensor& go) {
      return attention_dropout_backward_stub(q.device(), gq, gk, gv, go, q, k, v, out, lse, params);
    };
    if (fused(grad_q, grad_k, grad_v, grad_out)) return;
    const std::array<const Tensor*, 3> grads = {&grad_q, &grad_k, &grad_v};
    std::array<Tensor, 3> buffers;
    for (size_t i = 0; i < grads.size(); ++i) {
      buffers[i] = core::empty(grads[i]->shape(), TensorOptions(grads[i]->dtype(), grads[i]->device()));
    }
    const Tensor dense_grad_out = core::empty(grad_out.shape(), TensorOptions(grad_out.dtype(), grad_out.device()));
    core::copy_stub(grad_out.device(), dense_grad_out, grad_out);
    COLOSSAL_CHECK(fused(buffers[0], buffers[1], buffers[2], dense_grad_out),
                   "scaled_dot_product_attention: the fused kernel took the forward with dropout (q {}, dropout_p {}) "
                   "but declines its backward, and the mask it drew cannot be recomputed elsewhere; set "
                   "COLOSSAL_CUDNN_ATTENTION=0 to run attention dropout unfused",
                   q.shape(), params.dropout_p);
    for (size_t i = 0; i < grads.size(); ++i) core::copy_stub(q.device(), *grads[i], buffers[i]);
    return;
  }
  if (q.device().is_cuda()) {
    return attention_backward_stub(q.device(), grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, params);
  }
  const std::array<const Tensor*, 3> grads = {&grad_q, &grad_k, &grad_v};
  std::array<Tensor, 3> buffers;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = *grads[i];
    buffers[i] = g.is_contiguous() ? g : core::empty(g.shape(), TensorOptions(g.dtype(), g.device()));
  }
  attention_backward_stub(q.device(), buffers[0], buffers[1], buffers[2], core::contiguous_raw(grad_out), q, k, v,
                          core::contiguous_raw(out), lse, params);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!buffers[i].is_same(*grads[i]) && grads[i]->numel() > 0) core::copy_stub(q.device(), *grads[i], buffers[i]);
  }
}

/// t [..., T, D] expanded (a view) to the common batch shape.
Tensor expand_batch(const Tensor& t, const Shape& batch) {
  Shape full = batch;
  full.insert(full.end(), {t.size(-2), t.size(-1)});
  return core::expand_raw(t, full);
}

/// Whether a fused dropout kernel may take the problem: the device has one and p < 1 (at 1 the
/// kept ones' scale is infinite; the unfused path zeroes everything). The op skips the fused path's
/// allocations where none may.
bool may_fuse_dropout(core::Device device, double dropout_p) {
  return dropout_p < 1.0 && attention_dropout_forward_stub.supports(device.type);
}

/// Runs the fused dropout kernel of q's device on the problem and returns true, with params holding
/// the dropout and the generator's range reserved (Note [Attention dropout]); false, params and the
/// generator untouched, when there is no such kernel or it declines.
bool fused_dropout_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           AttentionParams& params, const AttentionOptions& options) {
  if (out.numel() == 0 || !may_fuse_dropout(q.device(), options.dropout_p)) return false;
  core::Generator& generator = options.generator != nullptr ? *options.generator : core::default_generator();
  AttentionParams trial = params;
  trial.dropout_p = options.dropout_p;
  trial.dropout_seed = generator.seed();
  trial.dropout_offset = generator.state().offset;
  if (!attention_dropout_forward_stub(q.device(), out, lse, q, k, v, trial)) return false;
  const int64_t scores = (out.numel() / out.size(-1)) * k.size(-2);  // B * H * Tq * Tk
  generator.next_offset(static_cast<uint64_t>(scores));
  params = trial;
  return true;
}

/// softmax(q k^T * scale [+ causal mask]) -> dropout -> v with differentiable ops, the probabilities
/// materialised (Note [Attention dropout]). The batch dimensions broadcast as matmul's do. A causal
/// row that sees no key (Tq > Tk) has no mask added and is zeroed after the softmax: the fused
/// kernels' output there.
Tensor unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                         double dropout_p, core::Generator* generator) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), params.scale);
  std::vector<double> visible;
  if (params.causal) {
    std::vector<double> mask(static_cast<size_t>(tq * tk), 0.0);
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t last = i + tk - tq;  // the last key query i sees
      if (last < 0) {
        if (visible.empty()) visible.assign(static_cast<size_t>(tq), 1.0);
        visible[static_cast<size_t>(i)] = 0.0;
        continue;
      }
      for (int64_t j = last + 1; j < tk; ++j) mask[i * tk + j] = -std::numeric_limits<double>::infinity();
    }
    scores = add(scores, core::from_vector(mask, {tq, tk}, TensorOptions(scores.dtype(), scores.device())));
  }
  Tensor probabilities = softmax(scores, -1);
  if (!visible.empty()) {
    probabilities =
        mul(probabilities, core::from_vector(visible, {tq, 1}, TensorOptions(scores.dtype(), scores.device())));
  }
  return matmul(dropout(probabilities, dropout_p, true, generator), v);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return scaled_dot_product_attention(autocast::to_lower(q, *dtype), autocast::to_lower(k, *dtype),
                                        autocast::to_lower(v, *dtype), options);
  }
  const char* op = "scaled_dot_product_attention";
  COLOSSAL_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined tensors", op);
  for (const Tensor* t : {&q, &k, &v}) {
    COLOSSAL_CHECK(core::is_floating(t->dtype()),
                   "{}: expected floating q, k, v (f32, f64, f16, bf16), got {}, {}, {}; convert with .to(DType::f32)",
                   op, q.dtype(), k.dtype(), v.dtype());
  }
  COLOSSAL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "{}: q, k and v must share a dtype, got {}, {}, {}",
                 op, q.dtype(), k.dtype(), v.dtype());
  COLOSSAL_CHECK(q.device() == k.device() && q.device() == v.device(),
                 "{}: q, k and v must be on one device, got {}, {}, {}", op, q.device(), k.device(), v.device());
  COLOSSAL_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
                 "{}: q, k and v need at least 2 dimensions [..., T, D], got q {}, k {}, v {}", op, q.shape(),
                 k.shape(), v.shape());
  COLOSSAL_CHECK(q.size(-1) == k.size(-1), "{}: q {} and k {} must have the same head dimension (last), {} vs {}", op,
                 q.shape(), k.shape(), q.size(-1), k.size(-1));
  COLOSSAL_CHECK(k.size(-2) == v.size(-2),
                 "{}: k {} and v {} must have the same sequence length (second-to-last), {} vs {}", op, k.shape(),
                 v.shape(), k.size(-2), v.size(-2));
  COLOSSAL_CHECK(batches_broadcast({batch_shape(q), batch_shape(k), batch_shape(v)}),
                 "{}: the batch dimensions of q {}, k {} and v {} cannot be broadcast together", op, q.shape(),
                 k.shape(), v.shape());
  const Shape batch =
      core::broadcast_shapes(core::broadcast_shapes(batch_shape(q), batch_shape(k), op), batch_shape(v), op);
  const int64_t head_dim = q.size(-1), tq = q.size(-2), dv = v.size(-1);
  COLOSSAL_CHECK(options.scale.has_value() || head_dim > 0,
                 "{}: the default scale 1 / sqrt(head_dim) needs head_dim > 0, got q {}", op, q.shape());
  COLOSSAL_CHECK(options.dropout_p >= 0.0 && options.dropout_p <= 1.0, "{}: dropout_p must be in [0, 1], got {}", op,
                 options.dropout_p);
  AttentionParams params;
  params.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  params.causal = options.causal;

  if (options.dropout_p > 0.0 && !may_fuse_dropout(q.device(), options.dropout_p)) {
    return unfused_attention(q, k, v, params, options.dropout_p, options.generator);
  }
  const Tensor qb = expand_batch(q, batch);
  const Tensor kb = expand_batch(k, batch);
  const Tensor vb = expand_batch(v, batch);
  const DType stat_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Shape out_shape = batch, lse_shape = batch;
  out_shape.insert(out_shape.end(), {tq, dv});
  lse_shape.push_back(tq);
  Tensor out = core::empty(out_shape, TensorOptions(q.dtype(), q.device()));
  Tensor lse = core::empty(lse_shape, TensorOptions(stat_dtype, q.device()));
  if (options.dropout_p == 0.0) {
    forward_into(out, lse, qb, kb, vb, params);
  } else if (!fused_dropout_forward(out, lse, qb, kb, vb, params, options)) {
    return unfused_attention(q, k, v, params, options.dropout_p, options.generator);
  }

  autograd::record("scaled_dot_product_attention", {q, k, v}, {out},
                   [qb = qb.detach(), kb = kb.detach(), vb = vb.detach(), out = out.detach(), lse = lse.detach(),
                    params, q_shape = q.shape(), k_shape = k.shape(),
                    v_shape = v.shape()](const std::vector<Tensor>& grads, const autograd::Node& node) {
                     const TensorOptions options(qb.dtype(), qb.device());
                     Tensor grad_q = core::empty(qb.shape(), options);
                     Tensor grad_k = core::empty(kb.shape(), options);
                     Tensor grad_v = core::empty(vb.shape(), options);
                     backward_into(grad_q, grad_k, grad_v, grads[0], qb, kb, vb, out, lse, params);
                     // The kernel's gradients are per broadcast batch entry; sum them back onto each input's shape.
                     return std::vector<Tensor>{node.needs_input_grad(0) ? sum_to(grad_q, q_shape) : Tensor(),
                                                node.needs_input_grad(1) ? sum_to(grad_k, k_shape) : Tensor(),
                                                node.needs_input_grad(2) ? sum_to(grad_v, v_shape) : Tensor()};
                   });
  return out;
}

Tensor packed_qkv_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& options) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return packed_qkv_attention(autocast::to_lower(qkv, *dtype), num_heads, options);
  }
  const char* op = "packed_qkv_attention";
  COLOSSAL_CHECK(qkv.defined() && qkv.dim() == 3, "{}: qkv must be [B, T, 3 * C], got shape {}", op,
                 qkv.defined() ? qkv.shape() : Shape{});
  COLOSSAL_CHECK(core::is_floating(qkv.dtype()), "{}: expected a floating qkv (f32, f64, f16, bf16), got {}", op,
                 qkv.dtype());
  COLOSSAL_CHECK(num_heads > 0, "{}: num_heads must be positive, got {}", op, num_heads);
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), width = qkv.size(2);
  COLOSSAL_CHECK(width % (3 * num_heads) == 0 && width > 0,
                 "{}: qkv {} has a last dimension of {}, which is not 3 * num_heads ({}) * head_dim", op, qkv.shape(),
                 width, num_heads);
  COLOSSAL_CHECK(options.dropout_p >= 0.0 && options.dropout_p <= 1.0, "{}: dropout_p must be in [0, 1], got {}", op,
                 options.dropout_p);
  const int64_t channels = width / 3, head_dim = channels / num_heads;
  AttentionParams params;
  params.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  params.causal = options.causal;
  const TensorOptions like(qkv.dtype(), qkv.device());
  auto unfused = [&] {
    // [B, T, 3, H, D] -> [3, B, H, T, D] as differentiable views: the layout timm's Attention and
    // HF's _split_heads produce.
    const Tensor heads = qkv.reshape({batch, tokens, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
    return unfused_attention(heads.select(0, 0), heads.select(0, 1), heads.select(0, 2), params, options.dropout_p,
                             options.generator)
        .transpose(1, 2)
        .reshape({batch, tokens, channels});
  };
  if (options.dropout_p > 0.0 && !may_fuse_dropout(qkv.device(), options.dropout_p)) return unfused();

  // q, k and v as [B, H, T, D] views of [B, T, 3, H, D]; the output written as [B, T, H, D] (heads
  // merged) through a [B, H, T, D] view of it.
  const Tensor base = core::contiguous_raw(qkv);
  auto split = [=](const Tensor& packed) {
    const Tensor heads =
        core::permute_raw(core::view_raw(packed, {batch, tokens, 3, num_heads, head_dim}), {2, 0, 3, 1, 4});
    return std::array<Tensor, 3>{core::select_raw(heads, 0, 0), core::select_raw(heads, 0, 1),
                                 core::select_raw(heads, 0, 2)};
  };
  auto heads_view = [=](const Tensor& merged) {
    return core::transpose_raw(core::view_raw(merged, {batch, tokens, num_heads, head_dim}), 1, 2);
  };
  const auto [q, k, v] = split(base);
  Tensor merged = core::empty({batch, tokens, channels}, like);
  const Tensor out = heads_view(merged);
  const Tensor lse = core::empty({batch, num_heads, tokens},
                                 TensorOptions(qkv.dtype() == DType::f64 ? DType::f64 : DType::f32, qkv.device()));
  if (options.dropout_p == 0.0) {
    forward_into(out, lse, q, k, v, params);
  } else if (!fused_dropout_forward(out, lse, q, k, v, params, options)) {
    return unfused();
  }

  autograd::record(op, {qkv}, {merged},
                   [base = base.detach(), out = out.detach(), lse = lse.detach(), params, split, heads_view](
                       const std::vector<Tensor>& grads, const autograd::Node&) {
                     const auto [q, k, v] = split(base);
                     Tensor grad_qkv = core::empty(base.shape(), TensorOptions(base.dtype(), base.device()));
                     const auto [grad_q, grad_k, grad_v] = split(grad_qkv);
                     backward_into(grad_q, grad_k, grad_v, heads_view(core::contiguous_raw(grads[0])), q, k, v, out,
                                   lse, params);
                     return std::vector<Tensor>{grad_qkv};
                   });
  return merged;
}

}  // namespace colossal::ops
