// matmul, bmm, linear, linear_gelu and gelu_mlp: their shape rules and backward formulas, computed
// by the batched GEMM stub and, where the backend fuses them, the GEMM-with-epilogue stub
// (ops/linalg_kernels.h). Backward: dA = dC B^T and dB = A^T dC, summed over the batch dimensions
// an operand was broadcast along.
#include "colossal/ops/linalg.h"
#include "colossal/ops/autocast.h"

#include <algorithm>
#include <atomic>

#include "colossal/autograd/engine.h"          // accumulation_target, mark_accumulated
#include "colossal/autograd/function.h"        // record, any_requires_grad
#include "colossal/core/view.h"                // expand_raw, transpose_raw, try_view, broadcast_shapes
#include "colossal/ops/elementwise_kernels.h"  // unary_stub, unary_backward_stub (tanh GELU)
#include "colossal/ops/linalg_kernels.h"
#include "colossal/ops/reduction.h"  // sum, sum_to

namespace colossal::ops {

constinit core::DispatchStub<BatchedGemmKernel> batched_gemm_stub("batched_gemm");
constinit core::DispatchStub<FusedGemmKernel> fused_gemm_stub("fused_gemm");

namespace {
std::atomic<Float32MatmulPrecision> float32_precision{Float32MatmulPrecision::high};
}  // namespace

void set_float32_matmul_precision(Float32MatmulPrecision precision) {
  float32_precision.store(precision);
}
Float32MatmulPrecision float32_matmul_precision() {
  return float32_precision.load();
}

namespace {

using autograd::Node;

void check_floating_pair(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  COLOSSAL_CHECK(a.defined() && b.defined(), "{}: {} and {} must be defined tensors", op, a_name, b_name);
  COLOSSAL_CHECK(
      core::is_floating(a.dtype()) && core::is_floating(b.dtype()),
      "{}: expected floating tensors (f32, f64, f16, bf16), got {} {} and {} {}; convert with .to(DType::f32)", op,
      a_name, a.dtype(), b_name, b.dtype());
  COLOSSAL_CHECK(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}; convert one so the dtypes match", op, a_name,
                 a.dtype(), b_name, b.dtype());
  COLOSSAL_CHECK(a.device() == b.device(), "{}: {} {} is on {} but {} {} is on {}; move one with .to(device)", op,
                 a_name, a.shape(), a.device(), b_name, b.shape(), b.device());
}

/// A view with the new shape when the strides allow one, else a contiguous copy.
Tensor reshape_raw(const Tensor& t, const Shape& shape) {
  Tensor v = core::try_view(t, shape);
  return v.defined() ? v : core::view_raw(core::contiguous_raw(t), shape);
}

Tensor transpose_last(const Tensor& t) {
  return core::transpose_raw(t, -1, -2);
}

/// t as a matrix [product of all but the last dimension, last dimension].
Tensor flatten_to_matrix(const Tensor& t) {
  return reshape_raw(t, {core::shape_numel(Shape(t.shape().begin(), t.shape().end() - 1)), t.size(-1)});
}

Shape batch_shape(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 2);
}

/// The broadcast of the batch dimensions of a and b, which are at least 2-D views of the operands
/// the user passed as user_a and user_b (named in the error).
Shape broadcast_batches(const char* op, const Tensor& a, const Tensor& b, const Tensor& user_a, const Tensor& user_b) {
  const Shape a_batch = batch_shape(a), b_batch = batch_shape(b);
  for (size_t i = 1; i <= std::min(a_batch.size(), b_batch.size()); ++i) {
    const int64_t x = a_batch[a_batch.size() - i], y = b_batch[b_batch.size() - i];
    COLOSSAL_CHECK(x == y || x == 1 || y == 1,
                   "{}: batch dimensions {} of a {} and {} of b {} cannot be broadcast together", op, a_batch,
                   user_a.shape(), b_batch, user_b.shape());
  }
  return core::broadcast_shapes(a_batch, b_batch, op);
}

/// a [..., M, K] times b [..., K, N] with the batch dimensions broadcast; not recorded.
Tensor gemm(const Tensor& a, const Tensor& b) {
  Shape batch = core::broadcast_shapes(batch_shape(a), batch_shape(b), "matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = core::empty(out_shape, TensorOptions(a.dtype(), a.device()));
  batched_gemm_stub(out.device(), out, core::expand_raw(a, a_shape), core::expand_raw(b, b_shape), 0.0);
  return out;
}

/// Computes a_mat @ b_mat (matrices or batches of them: views of the user's a and b) and records
/// the backward for a and b, whose shapes the gradients are reshaped back to.
Tensor matrix_product(const char* name, const Tensor& a, const Tensor& b, const Tensor& a_mat, const Tensor& b_mat,
                      const Shape& out_shape) {
  Tensor out_mat = gemm(a_mat, b_mat);
  Tensor out = core::view_raw(out_mat, out_shape);
  if (out.is_same(out_mat)) out = out.detach();
  autograd::record(name, {a, b}, {out},
                   [a_shape = a.shape(), b_shape = b.shape(), a_mat = a_mat.detach(), b_mat = b_mat.detach(),
                    out_mat_shape = out_mat.shape()](const std::vector<Tensor>& grads, const Node& node) {
                     const Tensor grad = reshape_raw(grads[0], out_mat_shape);
                     Tensor grad_a, grad_b;
                     if (node.needs_input_grad(0)) {
                       grad_a = reshape_raw(sum_to(gemm(grad, transpose_last(b_mat)), a_mat.shape()), a_shape);
                     }
                     if (node.needs_input_grad(1)) {
                       grad_b = reshape_raw(sum_to(gemm(transpose_last(a_mat), grad), b_mat.shape()), b_shape);
                     }
                     return std::vector<Tensor>{grad_a, grad_b};
                   });
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return matmul(autocast::to_lower(a, *dtype), autocast::to_lower(b, *dtype));
  }
  check_floating_pair("matmul", a, "a", b, "b");
  COLOSSAL_CHECK(a.dim() >= 1 && b.dim() >= 1,
                 "matmul: both operands need at least one dimension, got a {} and b {}; use mul for scalars", a.shape(),
                 b.shape());
  const int64_t a_inner = a.size(-1);
  const int64_t b_inner = b.dim() == 1 ? b.size(0) : b.size(-2);
  COLOSSAL_CHECK(a_inner == b_inner,
                 "matmul: inner dimensions differ: a {} @ b {} (a's last dimension is {}, b's {} is {})", a.shape(),
                 b.shape(), a_inner, b.dim() == 1 ? "only dimension" : "second-to-last dimension", b_inner);

  // The output drops the row dimension a 1-D a was given and the column dimension of a 1-D b.
  Shape out_shape;
  if (a.dim() >= 3 && b.dim() <= 2) {
    // Fold a's batch dimensions into its rows: one GEMM, and b's gradient needs no batch reduction.
    const Tensor a_mat = flatten_to_matrix(a);
    const Tensor b_mat = b.dim() == 1 ? core::unsqueeze_raw(b, 1) : b;
    out_shape.assign(a.shape().begin(), a.shape().end() - 1);
    if (b.dim() == 2) out_shape.push_back(b.size(1));
    return matrix_product("matmul", a, b, a_mat, b_mat, out_shape);
  }
  const Tensor a_mat = a.dim() == 1 ? core::unsqueeze_raw(a, 0) : a;
  const Tensor b_mat = b.dim() == 1 ? core::unsqueeze_raw(b, 1) : b;
  out_shape = broadcast_batches("matmul", a_mat, b_mat, a, b);
  if (a.dim() > 1) out_shape.push_back(a.size(-2));
  if (b.dim() > 1) out_shape.push_back(b.size(-1));
  return matrix_product("matmul", a, b, a_mat, b_mat, out_shape);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return bmm(autocast::to_lower(a, *dtype), autocast::to_lower(b, *dtype));
  }
  check_floating_pair("bmm", a, "a", b, "b");
  COLOSSAL_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands [B, M, K] and [B, K, N], got a {} and b {}",
                 a.shape(), b.shape());
  COLOSSAL_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: a {} and b {} (bmm does not broadcast; use matmul)",
                 a.shape(), b.shape());
  COLOSSAL_CHECK(a.size(2) == b.size(1), "bmm: inner dimensions differ: a {} @ b {} ({} vs {})", a.shape(), b.shape(),
                 a.size(2), b.size(1));
  return matrix_product("bmm", a, b, a, b, {a.size(0), a.size(1), b.size(2)});
}

namespace {

/// Checks linear's operands: x [..., in], weight [out, in] and an optional bias [out].
void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_floating_pair(op, x, "input", weight, "weight");
  COLOSSAL_CHECK(weight.dim() == 2, "{}: weight must be [out_features, in_features], got shape {}", op, weight.shape());
  COLOSSAL_CHECK(x.dim() >= 1, "{}: input must have at least one dimension, got shape {}", op, x.shape());
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  COLOSSAL_CHECK(x.size(-1) == in_features,
                 "{}: input {} has {} features in its last dimension but weight {} expects {}", op, x.shape(),
                 x.size(-1), weight.shape(), in_features);
  if (bias.defined()) {
    check_floating_pair(op, x, "input", bias, "bias");
    COLOSSAL_CHECK(bias.dim() == 1 && bias.size(0) == out_features,
                   "{}: bias must be [{}] to match weight {}, got shape {}", op, out_features, weight.shape(),
                   bias.shape());
  }
}

/// Runs the backend's fused GEMM when it has one for this case; false when the caller must compose.
bool try_fused_gemm(const Tensor& out, const Tensor& a, const Tensor& b, const GemmEpilogue& epilogue) {
  return fused_gemm_stub.supports(out.device().type) && fused_gemm_stub(out.device(), out, a, b, epilogue);
}

/// x_mat [rows, in] @ weight^T + bias, not recorded.
Tensor linear_forward(const Tensor& x_mat, const Tensor& weight, const Tensor& bias) {
  Tensor out = core::empty({x_mat.size(0), weight.size(0)}, TensorOptions(x_mat.dtype(), x_mat.device()));
  const Tensor weight_t = transpose_last(weight);
  if (bias.defined() && try_fused_gemm(out, x_mat, weight_t, {.bias = bias})) return out;
  double beta = 0.0;
  if (bias.defined()) {  // the bias goes into the output first and the GEMM accumulates onto it
    out.copy_(core::expand_raw(bias, out.shape()));
    beta = 1.0;
  }
  batched_gemm_stub(out.device(), out, x_mat, weight_t, beta);
  return out;
}

/// out_mat [rows, out] viewed as the output of a linear layer on x: [..., out].
Tensor linear_output(const Tensor& out_mat, const Tensor& x) {
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_mat.size(1));
  Tensor out = core::view_raw(out_mat, out_shape);
  return out.is_same(out_mat) ? out.detach() : out;
}

/// Which of a linear layer's x, weight and bias need a gradient; and the node and its input that the
/// weight is, where its gradient may be added into the sum it joins (Note [Gradient accumulation in the
/// op] in autograd/engine.cpp).
struct LinearNeeds {
  bool x = false, weight = false, bias = false;
  const Node* node = nullptr;
  size_t weight_input = 0;
};

/// The needs of a node whose inputs first..first+2 are a linear layer's x, weight and bias.
LinearNeeds linear_needs(const Node& node, size_t first) {
  return {.x = node.needs_input_grad(first),
          .weight = node.needs_input_grad(first + 1),
          .bias = node.needs_input_grad(first + 2),
          .node = &node,
          .weight_input = first + 1};
}

/// Gradients of x, weight and bias of y = x_mat @ weight^T + bias from grad = dy [rows, out] (those
/// not needed stay undefined); the weight and bias gradients come from one GEMM where the backend
/// fuses the bias reduction.
std::vector<Tensor> linear_backward(const Tensor& grad, const Tensor& x_mat, const Tensor& weight, const Shape& x_shape,
                                    const LinearNeeds& needs, const InputGradHook& hook = {}) {
  Tensor grad_x, grad_weight, grad_bias;
  if (needs.x) grad_x = reshape_raw(gemm(grad, weight), x_shape);
  // The hook's work on grad_x (an all-reduce) runs while the weight's and bias's GEMMs do.
  const std::function<void()> finish = hook && grad_x.defined() ? hook(grad_x) : std::function<void()>();
  const Tensor grad_t = transpose_last(grad);
  // A weight that is the transpose of a contiguous [in, out] tensor (nn::Conv1D's view of its
  // parameter) gets its gradient as x^T dy, contiguous in the parameter's own layout: transposed
  // back on its way to the parameter, it needs no copy. The bias gradient is then its own sum.
  const bool transposed_weight =
      weight.dim() == 2 && weight.size(0) > 1 && weight.stride(0) == 1 && weight.stride(1) == weight.size(0);
  // Where the weight's gradient joins a sum (microbatches, micro-steps, chunks), the GEMM adds it
  // there (beta = 1) instead of writing it for a separate addition.
  // The bias gradient comes out of the weight gradient's GEMM where the backend can sum it there (the
  // epilogue that sums grad over the rows, K of that GEMM): no pass of its own over grad.
  const bool fuse_bias = needs.weight && needs.bias && fused_gemm_stub.supports(grad.device().type);
  // The weight gradient into `out` (added where `add`): [in, out] = x^T grad for a transposed weight,
  // else [out, in] = grad^T x; with the bias gradient where fused.
  auto weight_gemm = [&](const Tensor& out, bool add) {
    if (fuse_bias) {
      Tensor bias = core::empty({weight.size(0)}, TensorOptions(grad.dtype(), grad.device()));
      const bool fused = transposed_weight ? try_fused_gemm(out, transpose_last(x_mat), grad,
                                                            {.bias_grad_of_b = bias, .accumulate = add})
                                           : try_fused_gemm(out, grad_t, x_mat, {.bias_grad = bias, .accumulate = add});
      if (fused) {
        grad_bias = bias;
        return;
      }
    }
    if (transposed_weight) {
      batched_gemm_stub(grad.device(), out, transpose_last(x_mat), grad, add ? 1.0 : 0.0);
    } else {
      batched_gemm_stub(grad.device(), out, grad_t, x_mat, add ? 1.0 : 0.0);
    }
  };
  bool weight_added = false;
  if (needs.weight && needs.node != nullptr) {
    const Tensor target = autograd::accumulation_target(*needs.node, needs.weight_input, grad.dtype());
    if (target.defined()) {  // of weight's shape; the GEMM writes it where its layout is the product's
      const Tensor out = transposed_weight ? transpose_last(target) : target;
      if (out.is_contiguous()) {
        weight_gemm(out, /*add=*/true);
        weight_added = true;
        autograd::mark_accumulated(*needs.node, needs.weight_input);
      }
    }
  }
  if (needs.weight && !weight_added) {
    const Tensor out = transposed_weight
                           ? core::empty({weight.size(1), weight.size(0)}, TensorOptions(grad.dtype(), grad.device()))
                           : core::empty(weight.shape(), TensorOptions(grad.dtype(), grad.device()));
    weight_gemm(out, /*add=*/false);
    grad_weight = transposed_weight ? transpose_last(out) : out;
  }
  if (needs.bias && !grad_bias.defined()) grad_bias = sum(grad, {0});
  if (finish) finish();
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

namespace {

/// Records `out` (x [..., in] times weight [out, in] transposed, plus bias) as linear's node; x_mat is
/// x flattened to [rows, in].
Tensor record_linear(Tensor out, const Tensor& x, const Tensor& x_mat, const Tensor& weight, const Tensor& bias,
                     InputGradHook hook) {
  autograd::record("linear", {x, weight, bias}, {out},
                   [x_shape = x.shape(), x_mat = x_mat.detach(), weight = weight.detach(), rows = x_mat.size(0),
                    hook = std::move(hook)](const std::vector<Tensor>& grads, const Node& node) {
                     const Tensor grad = reshape_raw(grads[0], {rows, weight.size(0)});
                     return linear_backward(grad, x_mat, weight, x_shape, linear_needs(node, 0), hook);
                   });
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, InputGradHook hook) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return linear(autocast::to_lower(x, *dtype), autocast::to_lower(weight, *dtype), autocast::to_lower(bias, *dtype),
                  std::move(hook));
  }
  check_linear("linear", x, weight, bias);
  const Tensor x_mat = flatten_to_matrix(x);
  return record_linear(linear_output(linear_forward(x_mat, weight, bias), x), x, x_mat, weight, bias, std::move(hook));
}

// Note [Row blocks of a linear's output]
// A row-parallel layer's partial product must be all-reduced before anything reads it, and the
// all-reduce of a [8, 1024, 2048] bf16 activation (32 MB) takes ~100 us on 2 H100s: in forward it sits
// on the critical path 48 times per GPT 1.3B step. Each output row depends only on its input row, so
// the GEMM can be run as a few GEMMs over blocks of rows, each block's all-reduce started as soon as
// its GEMM is enqueued, running on the communicator's stream under the next block's GEMM; only the last
// block's all-reduce is left exposed. The blocks keep every row's products whole (the blocks split M,
// never K), so each row's sum is a full-K product as in the one GEMM (the GEMM library may still pick
// another algorithm for the smaller M, as for any shape).
Tensor linear_in_row_blocks(const Tensor& x, const Tensor& weight, int64_t blocks,
                            const std::function<void(const Tensor& block)>& on_block) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return linear_in_row_blocks(autocast::to_lower(x, *dtype), autocast::to_lower(weight, *dtype), blocks, on_block);
  }
  COLOSSAL_CHECK(blocks >= 1, "linear_in_row_blocks: blocks must be >= 1, got {}", blocks);
  check_linear("linear_in_row_blocks", x, weight, Tensor());
  const Tensor x_mat = flatten_to_matrix(x);
  const int64_t rows = x_mat.size(0);
  Tensor out_mat = core::empty({rows, weight.size(0)}, TensorOptions(x_mat.dtype(), x_mat.device()));
  const Tensor weight_t = transpose_last(weight);
  const int64_t n = std::max<int64_t>(1, std::min(blocks, rows));
  for (int64_t k = 0, begin = 0; k < n; ++k) {
    const int64_t end = rows * (k + 1) / n;
    if (end > begin) {
      const Tensor block = out_mat.narrow(0, begin, end - begin);
      batched_gemm_stub(out_mat.device(), block, x_mat.narrow(0, begin, end - begin), weight_t, 0.0);
      if (on_block) on_block(block);
    }
    begin = end;
  }
  return record_linear(linear_output(out_mat, x), x, x_mat, weight, Tensor(), {});
}

// Note [A row-parallel layer's residual in its GEMM]
// A transformer block adds a row-parallel layer's output to its residual: h = x + (sum_r z_r W_r + b).
// Done as written, each rank all-reduces its partial product, then adds the bias (a pass over the
// activation) and the residual (another, reading two), about 60 us each for GPT 1.3B's [8, 1024,
// 2048] bf16 on an H100, twice a block. linear_add_part folds both into the GEMM that makes the
// partial product: rank r of p adds x + b to its output's r-th part of the rows, so the group's sum
// holds x + b once in every row. On cuBLASLt that part's GEMM reads the residual as its C (beta = 1,
// C apart from D) and the bias through its epilogue: no pass of its own. Elsewhere x + b is written
// into those rows first (a pass over 1/p of the activation) and the GEMM adds onto them. The bias and the
// residual are replicated, so every rank's backward gives them the whole output gradient, as the
// separate adds did; the partial product's own gradients are linear's. With row blocks (Note [Row
// blocks of a linear's output]) each block's rows are made by up to three GEMMs, those in this rank's
// part with beta = 1, and the block is handed on before the next block's GEMMs.
Tensor linear_add_part(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, int64_t part,
                       int64_t parts, int64_t blocks, const std::function<void(const Tensor& block)>& on_block) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return linear_add_part(autocast::to_lower(x, *dtype), autocast::to_lower(weight, *dtype),
                           autocast::to_lower(bias, *dtype), autocast::to_lower(residual, *dtype), part, parts, blocks,
                           on_block);
  }
  check_linear("linear_add_part", x, weight, bias);
  COLOSSAL_CHECK(parts >= 1 && part >= 0 && part < parts, "linear_add_part: part {} of {}", part, parts);
  COLOSSAL_CHECK(blocks >= 1, "linear_add_part: blocks must be >= 1, got {}", blocks);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  COLOSSAL_CHECK(residual.defined() && residual.shape() == out_shape,
                 "linear_add_part: the residual must have the output's shape {}, got {}", out_shape,
                 residual.defined() ? fmt::format("{}", residual.shape()) : std::string("an undefined tensor"));
  check_floating_pair("linear_add_part", x, "input", residual, "residual");
  const Tensor x_mat = flatten_to_matrix(x);
  const int64_t rows = x_mat.size(0);
  const Tensor residual_mat = core::contiguous_raw(reshape_raw(residual, {rows, weight.size(0)}));
  Tensor out = core::empty({rows, weight.size(0)}, TensorOptions(x_mat.dtype(), x_mat.device()));
  const Tensor weight_t = transpose_last(weight);
  const int64_t begin = rows * part / parts, end = rows * (part + 1) / parts;
  auto product = [&](int64_t from, int64_t to) {
    if (to > from)
      batched_gemm_stub(out.device(), out.narrow(0, from, to - from), x_mat.narrow(0, from, to - from), weight_t, 0.0);
  };
  // Rows of this rank's part: one fused GEMM reading the residual (and the bias) where the backend
  // has it; else the residual and bias written into the output and the GEMM adding onto them.
  auto product_plus_residual = [&](int64_t from, int64_t to) {
    if (to <= from) return;
    const Tensor rows_out = out.narrow(0, from, to - from), rows_x = x_mat.narrow(0, from, to - from);
    const Tensor rows_residual = residual_mat.narrow(0, from, to - from);
    if (try_fused_gemm(rows_out, rows_x, weight_t, {.bias = bias, .addend = rows_residual})) return;
    if (bias.defined()) {
      binary_stub(out.device(), BinaryOp::add, rows_out, rows_residual, core::expand_raw(bias, rows_out.shape()), 1.0);
    } else {
      rows_out.copy_(rows_residual);
    }
    batched_gemm_stub(out.device(), rows_out, rows_x, weight_t, 1.0);
  };
  // Each block of rows: its rows outside this rank's part made afresh, those inside with the
  // residual and bias; then the block is whole.
  const int64_t n = std::max<int64_t>(1, std::min(blocks, rows));
  for (int64_t k = 0, from = 0; k < n; ++k) {
    const int64_t to = rows * (k + 1) / n;
    product(from, std::min(to, begin));
    product_plus_residual(std::max(from, begin), std::min(to, end));
    product(std::max(from, end), to);
    if (on_block && to > from) on_block(out.narrow(0, from, to - from));
    from = to;
  }
  const Tensor y = linear_output(out, x);
  autograd::record("linear_add_part", {x, weight, bias, residual}, {y},
                   [x_shape = x.shape(), x_mat = x_mat.detach(), weight = weight.detach(), rows, out_shape](
                       const std::vector<Tensor>& grads, const Node& node) {
                     const Tensor grad = reshape_raw(grads[0], {rows, weight.size(0)});
                     std::vector<Tensor> g = linear_backward(grad, x_mat, weight, x_shape, linear_needs(node, 0));
                     g.push_back(node.needs_input_grad(3) ? reshape_raw(grad, out_shape) : Tensor());
                     return g;
                   });
  return y;
}

namespace {

/// gelu(x_mat [rows, in] @ weight^T + bias), not recorded. When keep_pre_activation, *pre_activation
/// receives the pre-activation (on the fused path a view whose row stride may be padded past out);
/// the composite computes it anyway.
Tensor linear_gelu_forward(const Tensor& x_mat, const Tensor& weight, const Tensor& bias, bool keep_pre_activation,
                           Tensor* pre_activation) {
  Tensor out_mat = core::empty({x_mat.size(0), weight.size(0)}, TensorOptions(x_mat.dtype(), x_mat.device()));
  const GemmEpilogue epilogue{
      .bias = bias, .gelu_tanh = true, .pre_activation = keep_pre_activation ? pre_activation : nullptr};
  if (!try_fused_gemm(out_mat, x_mat, transpose_last(weight), epilogue)) {
    *pre_activation = linear_forward(x_mat, weight, bias);
    if (out_mat.numel() > 0) {
      unary_stub(x_mat.device(), UnaryOp::gelu_tanh, out_mat, *pre_activation, 0.0, 0.0);
    }
  }
  return out_mat;
}

/// The gradient of gelu's input from grad = d gelu(pre_activation) [rows, hidden], not recorded.
Tensor gelu_tanh_backward(const Tensor& grad, const Tensor& pre_activation, const Tensor& activation) {
  Tensor grad_pre = core::empty(grad.shape(), TensorOptions(grad.dtype(), grad.device()));
  if (grad_pre.numel() > 0) {
    unary_backward_stub(grad.device(), UnaryOp::gelu_tanh, grad_pre, grad, pre_activation, activation, 0.0, 0.0);
  }
  return grad_pre;
}

}  // namespace

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, InputGradHook hook) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return linear_gelu(autocast::to_lower(x, *dtype), autocast::to_lower(weight, *dtype),
                       autocast::to_lower(bias, *dtype), std::move(hook));
  }
  check_linear("linear_gelu", x, weight, bias);
  const Tensor x_mat = flatten_to_matrix(x);
  const int64_t rows = x_mat.size(0);
  // The pre-activation is only kept when a backward will need it.
  Tensor pre_activation;
  const Tensor out_mat =
      linear_gelu_forward(x_mat, weight, bias, autograd::any_requires_grad({x, weight, bias}), &pre_activation);
  Tensor out = linear_output(out_mat, x);
  autograd::record(
      "linear_gelu", {x, weight, bias}, {out},
      [x_shape = x.shape(), x_mat = x_mat.detach(), weight = weight.detach(), rows,
       pre_activation = pre_activation.defined() ? pre_activation.detach() : Tensor(), activation = out_mat.detach(),
       hook = std::move(hook)](const std::vector<Tensor>& grads, const Node& node) {
        const Tensor grad = reshape_raw(grads[0], {rows, weight.size(0)});
        const Tensor grad_pre = gelu_tanh_backward(grad, pre_activation, activation);
        return linear_backward(grad_pre, x_mat, weight, x_shape, linear_needs(node, 0), hook);
      });
  return out;
}

namespace {

/// Backward of gelu_mlp's hidden layer from grad = dy [rows, out] of the projection with weight
/// proj_weight [out, hidden]: the gradients of x, fc_weight and fc_bias. See Note [Fused GELU
/// backward].
std::vector<Tensor> gelu_mlp_hidden_backward(const Tensor& grad, const Tensor& proj_weight, const Tensor& x_mat,
                                             const Tensor& fc_weight, const Tensor& pre_activation,
                                             const Tensor& activation, const Shape& x_shape, LinearNeeds needs) {
  Tensor grad_pre;
  if (fused_gemm_stub.supports(grad.device().type)) {
    Tensor fused = core::empty({grad.size(0), fc_weight.size(0)}, TensorOptions(grad.dtype(), grad.device()));
    if (try_fused_gemm(fused, grad, proj_weight, {.gelu_grad_pre_activation = pre_activation})) {
      fused_gelu_backward_counter.fetch_add(1, std::memory_order_relaxed);
      grad_pre = fused;
    }
  }
  // Else linear's backward for the projection's input, then linear_gelu's: the two ops' kernels.
  if (!grad_pre.defined()) grad_pre = gelu_tanh_backward(gemm(grad, proj_weight), pre_activation, activation);
  return linear_backward(grad_pre, x_mat, fc_weight, x_shape, needs);
}

}  // namespace

// Note [Fused GELU backward]
// Run as linear_gelu then linear, an MLP's backward writes the gradient of the activation
// (dh = dy W2, [rows, hidden]), then reads it back with the pre-activation in an elementwise kernel
// that writes the gradient of the pre-activation: for GPT-2 small at 16 x 1024 tokens, three passes
// over 100 MB per layer besides the GEMMs. cuBLASLt's CUBLASLT_EPILOGUE_DGELU does that in the
// epilogue of the dh GEMM: it multiplies the product by GELU's derivative at the auxiliary input,
// the pre-activation in the layout that CUBLASLT_EPILOGUE_GELU_AUX_BIAS wrote in the forward
// (leading dimension a multiple of 8). One autograd node holds both layers so that the backward
// sees dy, W2 and the pre-activation together; it saves what the two ops' nodes would, and never
// holds dh and the pre-activation's gradient at once.
// The first bias's gradient is left to linear's backward (a sum over the rows, or the BGRADB
// epilogue of the weight gradient's GEMM) rather than taken from CUBLASLT_EPILOGUE_DGELU_BGRAD,
// which computes it in the same call (fused_gemm_stub offers it, and the GPU tests check it): on an
// H100 with cuBLAS 13.0, bench/kernels/gpu_kernels_bench timed the bf16 dh GEMM of GPT-2
// (16384 x 768 x 3072) at 0.103 ms plain, 0.156 ms with DGELU and 0.474 ms with DGELU_BGRAD, while
// the separate sum over the rows took 0.046 ms. Re-measure with a new cuBLAS before switching.
// Where the backend has no such kernel (the CPU, f64, a pre-activation without the padded layout,
// a case cuBLASLt declines) the two ops' backward kernels run in their order, so the values are
// theirs.

Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return gelu_mlp(autocast::to_lower(x, *dtype), autocast::to_lower(fc_weight, *dtype),
                    autocast::to_lower(fc_bias, *dtype), autocast::to_lower(proj_weight, *dtype),
                    autocast::to_lower(proj_bias, *dtype));
  }
  check_linear("gelu_mlp", x, fc_weight, fc_bias);
  check_floating_pair("gelu_mlp", x, "input", proj_weight, "proj_weight");
  COLOSSAL_CHECK(proj_weight.dim() == 2 && proj_weight.size(1) == fc_weight.size(0),
                 "gelu_mlp: proj_weight must be [out_features, {}] to follow weight {}, got shape {}",
                 fc_weight.size(0), fc_weight.shape(), proj_weight.shape());
  if (proj_bias.defined()) {
    check_floating_pair("gelu_mlp", x, "input", proj_bias, "proj_bias");
    COLOSSAL_CHECK(proj_bias.dim() == 1 && proj_bias.size(0) == proj_weight.size(0),
                   "gelu_mlp: proj_bias must be [{}] to match proj_weight {}, got shape {}", proj_weight.size(0),
                   proj_weight.shape(), proj_bias.shape());
  }
  const Tensor x_mat = flatten_to_matrix(x);
  const int64_t rows = x_mat.size(0);
  const bool needs_backward = autograd::any_requires_grad({x, fc_weight, fc_bias, proj_weight, proj_bias});
  Tensor pre_activation;
  const Tensor activation = linear_gelu_forward(x_mat, fc_weight, fc_bias, needs_backward, &pre_activation);
  Tensor out = linear_output(linear_forward(activation, proj_weight, proj_bias), x);
  autograd::record(
      "gelu_mlp", {x, fc_weight, fc_bias, proj_weight, proj_bias}, {out},
      [x_shape = x.shape(), x_mat = x_mat.detach(), fc_weight = fc_weight.detach(), proj_weight = proj_weight.detach(),
       rows, pre_activation = pre_activation.defined() ? pre_activation.detach() : Tensor(),
       activation = activation.detach()](const std::vector<Tensor>& grads, const Node& node) {
        const Tensor grad = reshape_raw(grads[0], {rows, proj_weight.size(0)});
        const LinearNeeds fc_needs = linear_needs(node, 0);
        const LinearNeeds proj_needs{
            .weight = node.needs_input_grad(3), .bias = node.needs_input_grad(4), .node = &node, .weight_input = 3};
        const std::vector<Tensor> proj_grads = linear_backward(grad, activation, proj_weight, {}, proj_needs);
        std::vector<Tensor> fc_grads(3);
        if (fc_needs.x || fc_needs.weight || fc_needs.bias) {
          fc_grads = gelu_mlp_hidden_backward(grad, proj_weight, x_mat, fc_weight, pre_activation, activation, x_shape,
                                              fc_needs);
        }
        return std::vector<Tensor>{fc_grads[0], fc_grads[1], fc_grads[2], proj_grads[1], proj_grads[2]};
      });
  return out;
}

}  // namespace colossal::ops
