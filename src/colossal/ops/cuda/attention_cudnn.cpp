// Attention on cuDNN's fused flash-attention engine; see attention_cudnn.h.
//
// Note [cuDNN attention graphs]
// cuDNN 9 picks its fused attention engine ("fort_native_sdpa", wgmma kernels on sm90) by matching
// an operation graph, so the graphs below spell attention out in the order cudnn-frontend lowers
// its SDPA nodes (the frontend itself is not a dependency: the backend API is). Every tensor is
// 4-D [B, H, T, D]; scores [B, H, T, T] and statistics [B, H, T, 1] are virtual (never stored)
// except the ones named below. K enters Q K^T as [B, H, D, T] by swapping its last two strides.
//
// Forward: S = Q K^T (f32) -> S * scale -> causal: select(row >= col, S, -inf) -> m = max_row(S)
// -> E = exp(S - m) -> l = sum_row(E) -> Stats = m + log(l) (stored: our logsumexp) -> P = E / l
// (bf16/f16, bmm2's operand type) -> O = P V.
// Backward: sum = rowsum(dO * O) * 1 (stored, f32 [B, H, T, 1]) -> P = exp(scale Q K^T - Stats)
// (causal mask after the subtraction) -> dV = P^T dO -> dS = P * (dO V^T - sum) * scale -> dK =
// dS^T Q -> dQ_accum = dS K (stored, f32 [B, H, T, D]; the engine initializes it) -> dQ = identity
// (dQ_accum). The transposes P^T, dS^T (bf16/f16) and K are reshape ops onto swapped strides.
// The variant pack must name exactly the graph's non-virtual tensors: an extra uid (the -inf of a
// non-causal graph) makes execution fail with BAD_PARAM_NULL_POINTER.
//
// Dropout (Note [cuDNN attention dropout]) adds an RNG node, M = Bernoulli(1 - p) drawn from the
// Philox seed and offset (int64 [1, 1, 1, 1] device tensors), to both graphs, as the frontend's
// sdpa and sdpa_backward lower set_dropout(p, seed, offset). Forward: P (f32 now) -> P * M ->
// * 1/(1-p) (bf16/f16) -> O = P V. Backward (the RNG node first): the row sum is multiplied by
// (1 - p) instead of 1; dV = (P * M * 1/(1-p))^T dO; dS = (dP * M - sum) * P * 1/(1-p) * scale.
//
// Note [cuDNN attention dropout]
// The mask is a function of (seed, offset, b, h, i, j) inside cuDNN's kernel, so the backward
// draws the forward's mask again from the same two numbers (saved in the op's AttentionParams)
// instead of storing T x T bytes. Our Generator hands out offsets as counts of draws: the op
// reserves B * H * Tq * Tk of them per call (ops/attention.cpp), which keeps two calls' counter
// ranges apart however cuDNN walks its Philox counter. The fill that puts the two numbers on the
// device takes a double, exact to 2^53: the seed is folded into 53 bits (seed ^ seed >> 53) and the
// offset wraps there, neither of which a run reaches in practice. A test-only variant stores M
// (f32 [B, H, T, T], 1 kept, 0 dropped) as an extra output of the RNG node, so that tests can
// rebuild the computation around the very mask the kernel used.
//
// Measured on an H100 (cuDNN 9.19, B8 H12 T1024 D64 causal bf16): forward 48 us, backward 161 us
// (dO.O 18 + main 124 + dQ conversion 16), the same kernels and times as PyTorch's; our own
// flash kernels take 77 and 181 + 32. Building a plan costs 0.05-1.6 s, hence the cache.
#include "colossal/ops/cuda/attention_cudnn.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "colossal/core/cuda_device.h"  // DeviceGuard, properties
#include "colossal/core/tensor.h"
#include "colossal/core/view.h"              // narrow_raw
#include "colossal/ops/cuda/cudnn_graph.h"   // GraphBuilder, Plan, execute
#include "colossal/ops/cuda/cudnn_handle.h"  // CudnnHandle

namespace colossal::ops::cuda {
namespace {

using graph::Dims;
using graph::GraphBuilder;
using graph::Plan;

std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{[] {
    const char* env = std::getenv("COLOSSAL_CUDNN_ATTENTION");
    return env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
  }()};
  return flag;
}

// Unique ids of the tensors the variant pack binds (virtual ones count up from 1000, GraphBuilder::scratch).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kGradOut,
  kGradQ,
  kGradK,
  kGradV,
  kRowSum,
  kGradQAccum,
  kSeed,
  kOffset,
  kDropoutScale,
  kMask,
};

/// The problem as cuDNN sees it: [B, H, T, D] operands with their own strides.
struct Problem {
  int64_t b = 0, h = 0, t = 0, d = 0;
  cudnnDataType_t type = CUDNN_DATA_BFLOAT16;
  bool causal = false;
  double dropout_p = 0.0;   // in [0, 1); the RNG node's Bernoulli probability is fixed in the plan
  bool store_mask = false;  // the test-only graph that also writes the dropout mask
  Dims q{}, k{}, v{}, o{}, grad_out{}, grad_q{}, grad_k{}, grad_v{};  // strides

  bool dropout() const { return dropout_p > 0.0; }

  std::vector<int64_t> key(bool backward, int device) const {
    int64_t dropout_bits = 0;
    std::memcpy(&dropout_bits, &dropout_p, sizeof(dropout_bits));
    std::vector<int64_t> key = {device, backward, static_cast<int64_t>(type), causal, dropout_bits, store_mask, b, h,
                                t,      d};
    for (const Dims* s : {&q, &k, &v, &o, &grad_out, &grad_q, &grad_k, &grad_v})
      key.insert(key.end(), s->begin(), s->end());
    return key;
  }
};

/// A [B, H, T, D] tensor cuDNN can read: 4-D, nonzero strides that keep every row 16-byte aligned
/// (multiples of 8 elements), unit last stride, a 16-byte aligned start.
bool describable(const Tensor& t, Dims& strides) {
  if (t.dim() != 4 || t.stride(3) != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    strides[static_cast<size_t>(i)] = t.stride(i);
    if (t.stride(i) <= 0 || t.stride(i) % 8 != 0) return false;
  }
  strides[3] = 1;
  return true;
}

/// Fills `p` from the forward operands, or returns false when cuDNN does not take them.
bool forward_problem(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionParams& params, Problem& p) {
  if (!cudnn_attention_enabled()) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  p.type = q.dtype() == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  if (!describable(q, p.q) || !describable(k, p.k) || !describable(v, p.v) || !describable(out, p.o)) return false;
  p.b = q.size(0), p.h = q.size(1), p.t = q.size(2), p.d = q.size(3);
  for (const Tensor* t : {&k, &v, &out}) {
    if (t->size(0) != p.b || t->size(1) != p.h || t->size(2) != p.t || t->size(3) != p.d) return false;
  }
  if (p.d % 8 != 0 || p.d > 128 || p.t == 0 || p.b * p.h == 0) return false;
  if (!lse.is_contiguous() || lse.dtype() != DType::f32 || lse.numel() != p.b * p.h * p.t) return false;
  if (!(params.dropout_p >= 0.0 && params.dropout_p < 1.0)) return false;
  p.causal = params.causal;
  p.dropout_p = params.dropout_p;
  return true;
}

/// The Philox seed and offset where the RNG node reads them: int64 device memory, seed at element 0
/// and offset at element 2 (16-byte aligned, as every graph tensor is declared). fill_ is exact to
/// 2^53; see Note [cuDNN attention dropout].
Tensor philox_arguments(const AttentionParams& params, core::Device device) {
  constexpr uint64_t kMask53 = (uint64_t{1} << 53) - 1;
  const Tensor arguments = core::empty({4}, TensorOptions(DType::i64, device));
  core::narrow_raw(arguments, 0, 0, 1)
      .fill_(static_cast<double>((params.dropout_seed ^ (params.dropout_seed >> 53)) & kMask53));
  core::narrow_raw(arguments, 0, 2, 1).fill_(static_cast<double>(params.dropout_offset & kMask53));
  return arguments;
}

/// The RNG node: M = Bernoulli(1 - p) over the [B, H, T, T] scores, stored when the problem asks.
cudnnBackendDescriptor_t dropout_mask(GraphBuilder& g, const Problem& p) {
  const Dims scores = {p.b, p.h, p.t, p.t}, packed = {p.h * p.t * p.t, p.t * p.t, p.t, 1}, one = {1, 1, 1, 1};
  cudnnBackendDescriptor_t seed = g.tensor(kSeed, one, one, CUDNN_DATA_INT64);
  cudnnBackendDescriptor_t offset = g.tensor(kOffset, one, one, CUDNN_DATA_INT64);
  cudnnBackendDescriptor_t mask =
      p.store_mask ? g.tensor(kMask, scores, packed, CUDNN_DATA_FLOAT) : g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.rng_bernoulli(1.0 - p.dropout_p, seed, offset, mask);
  return mask;
}

Dims transposed(const Dims& strides) {
  return {strides[0], strides[1], strides[3], strides[2]};
}

/// select(row >= col, x, -inf) on a [B, H, T, T] score tensor (top-left diagonal: Tq == Tk here).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Problem& p, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t neg_inf) {
  const Dims scores = {p.b, p.h, p.t, p.t}, packed = {p.h * p.t * p.t, p.t * p.t, p.t, 1};
  cudnnBackendDescriptor_t row = g.scratch(scores, packed, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, nullptr, CUDNN_DATA_FLOAT, 2);
  cudnnBackendDescriptor_t col = g.scratch(scores, packed, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, nullptr, CUDNN_DATA_FLOAT, 3);
  cudnnBackendDescriptor_t keep = g.scratch(scores, packed, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t y = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, y, keep);
  return y;
}

void build_forward(GraphBuilder& g, const Problem& p) {
  const Dims bhtd = {p.b, p.h, p.t, p.d}, bhdt = {p.b, p.h, p.d, p.t};
  const Dims scores = {p.b, p.h, p.t, p.t}, packed = {p.h * p.t * p.t, p.t * p.t, p.t, 1};
  const Dims rows = {p.b, p.h, p.t, 1}, row_strides = {p.h * p.t, p.t, 1, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, bhtd, p.q, p.type);
  cudnnBackendDescriptor_t kt = g.tensor(kK, bhdt, transposed(p.k), p.type);
  cudnnBackendDescriptor_t v = g.tensor(kV, bhtd, p.v, p.type);
  cudnnBackendDescriptor_t o = g.tensor(kO, bhtd, p.o, p.type);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, row_strides, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);

  cudnnBackendDescriptor_t s = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s);
  cudnnBackendDescriptor_t scaled = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  if (p.causal) scaled = causal_mask(g, p, scaled, g.scalar(kNegInf));
  cudnnBackendDescriptor_t max = g.scratch(rows, row_strides, CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  cudnnBackendDescriptor_t shifted = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, shifted);
  cudnnBackendDescriptor_t e = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  cudnnBackendDescriptor_t sum = g.scratch(rows, row_strides, CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  cudnnBackendDescriptor_t log_sum = g.scratch(rows, row_strides, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  cudnnBackendDescriptor_t probabilities = g.scratch(scores, packed, p.dropout() ? CUDNN_DATA_FLOAT : p.type);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probabilities);
  if (p.dropout()) {
    cudnnBackendDescriptor_t mask = dropout_mask(g, p);
    cudnnBackendDescriptor_t kept = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, probabilities, mask, kept);
    probabilities = g.scratch(scores, packed, p.type);
    g.pointwise(CUDNN_POINTWISE_MUL, kept, g.scalar(kDropoutScale), probabilities);
  }
  g.matmul(probabilities, v, o);
}

void build_backward(GraphBuilder& g, const Problem& p) {
  const Dims bhtd = {p.b, p.h, p.t, p.d}, bhdt = {p.b, p.h, p.d, p.t};
  const Dims packed_bhtd = {p.h * p.t * p.d, p.t * p.d, p.d, 1};
  const Dims scores = {p.b, p.h, p.t, p.t}, packed = {p.h * p.t * p.t, p.t * p.t, p.t, 1};
  const Dims packed_t = transposed(packed);
  const Dims rows = {p.b, p.h, p.t, 1}, row_strides = {p.h * p.t, p.t, 1, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, bhtd, p.q, p.type);
  cudnnBackendDescriptor_t kt = g.tensor(kK, bhdt, transposed(p.k), p.type);
  cudnnBackendDescriptor_t vt = g.tensor(kV, bhdt, transposed(p.v), p.type);
  cudnnBackendDescriptor_t o = g.tensor(kO, bhtd, p.o, p.type);
  cudnnBackendDescriptor_t grad_out = g.tensor(kGradOut, bhtd, p.grad_out, p.type);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, row_strides, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t grad_q = g.tensor(kGradQ, bhtd, p.grad_q, p.type);
  cudnnBackendDescriptor_t grad_k = g.tensor(kGradK, bhtd, p.grad_k, p.type);
  cudnnBackendDescriptor_t grad_v = g.tensor(kGradV, bhtd, p.grad_v, p.type);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t mask = p.dropout() ? dropout_mask(g, p) : nullptr;
  cudnnBackendDescriptor_t dropout_scale = p.dropout() ? g.scalar(kDropoutScale) : nullptr;

  // sum = rowsum(dO * O) * (1 - p)
  cudnnBackendDescriptor_t products = g.scratch(bhtd, packed_bhtd, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, grad_out, o, products);
  cudnnBackendDescriptor_t row_sum = g.scratch(rows, row_strides, CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, products, row_sum);
  cudnnBackendDescriptor_t sum = g.tensor(kRowSum, rows, row_strides, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, g.scalar(kOne), sum);

  // P = exp(scale Q K^T - Stats), masked
  cudnnBackendDescriptor_t s = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s);
  cudnnBackendDescriptor_t scaled = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  cudnnBackendDescriptor_t shifted = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  if (p.causal) shifted = causal_mask(g, p, shifted, g.scalar(kNegInf));
  cudnnBackendDescriptor_t probabilities = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, probabilities);

  // dV = P^T dO (P * M / (1 - p) with dropout)
  cudnnBackendDescriptor_t used = probabilities;
  if (p.dropout()) {
    cudnnBackendDescriptor_t kept = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, probabilities, mask, kept);
    used = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, kept, dropout_scale, used);
  }
  cudnnBackendDescriptor_t probabilities_t = g.scratch(scores, packed_t, p.type);
  g.reshape(used, probabilities_t);
  g.matmul(probabilities_t, grad_out, grad_v);

  // dS = P * (dO V^T - sum) * scale; with dropout P * (dO V^T * M - sum) / (1 - p) * scale
  cudnnBackendDescriptor_t grad_p = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.matmul(grad_out, vt, grad_p);
  if (p.dropout()) {
    cudnnBackendDescriptor_t masked = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, grad_p, mask, masked);
    grad_p = masked;
  }
  cudnnBackendDescriptor_t centered = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, grad_p, sum, centered);
  cudnnBackendDescriptor_t weighted = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, weighted);
  if (p.dropout()) {
    cudnnBackendDescriptor_t rescaled = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, weighted, dropout_scale, rescaled);
    weighted = rescaled;
  }
  cudnnBackendDescriptor_t grad_s = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, scale, grad_s);

  // dK = dS^T Q
  cudnnBackendDescriptor_t grad_s_t = g.scratch(scores, packed_t, p.type);
  g.reshape(grad_s, grad_s_t);
  g.matmul(grad_s_t, q, grad_k);

  // dQ = dS K, accumulated in f32
  cudnnBackendDescriptor_t k = g.scratch(bhtd, p.k, CUDNN_DATA_FLOAT);
  g.reshape(kt, k);
  cudnnBackendDescriptor_t accum = g.tensor(kGradQAccum, bhtd, packed_bhtd, CUDNN_DATA_FLOAT);
  g.matmul(grad_s, k, accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, accum, nullptr, grad_q);
}

/// The cached plan for a problem, built on first use; nullptr when cuDNN declines it (an older
/// cuDNN, a GPU before sm80, a layout the engine does not take), and our kernels run it.
std::shared_ptr<const Plan> plan_for(const Problem& p, bool backward, core::Device device, cudnnHandle_t handle) {
  static graph::PlanCache<std::vector<int64_t>> cache;
  return cache.get(p.key(backward, device.index), handle,
                   [&](GraphBuilder& g) { backward ? build_backward(g, p) : build_forward(g, p); });
}

}  // namespace

void set_cudnn_attention_enabled(bool enabled) {
  enabled_flag().store(enabled ? 1 : 0);
}
bool cudnn_attention_enabled() {
  return enabled_flag().load() != 0;
}

namespace {

/// The forward, writing the dropout mask into `mask` when it is defined.
bool run_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionParams& params, const Tensor& mask) {
  Problem p;
  if (!forward_problem(out, lse, q, k, v, params, p)) return false;
  if (mask.defined()) {
    if (!p.dropout() || mask.dtype() != DType::f32 || !mask.is_contiguous() || mask.device() != q.device() ||
        mask.shape() != Shape{p.b, p.h, p.t, p.t}) {
      return false;
    }
    p.store_mask = true;
  }
  const core::Device device = q.device();
  core::cuda::DeviceGuard guard(device);
  CudnnHandle handle(device);
  const std::shared_ptr<const Plan> plan = plan_for(p, false, device, handle.get());
  if (!plan) return false;
  float scale = static_cast<float>(params.scale), neg_inf = -std::numeric_limits<float>::infinity();
  float dropout_scale = static_cast<float>(1.0 / (1.0 - params.dropout_p));
  std::vector<std::pair<int64_t, void*>> bindings = {{kQ, q.raw_data()},   {kK, k.raw_data()},       {kV, v.raw_data()},
                                                     {kO, out.raw_data()}, {kStats, lse.raw_data()}, {kScale, &scale}};
  if (p.causal) bindings.emplace_back(kNegInf, &neg_inf);
  Tensor philox;
  if (p.dropout()) {
    philox = philox_arguments(params, device);
    bindings.emplace_back(kSeed, philox.raw_data());
    bindings.emplace_back(kOffset, static_cast<int64_t*>(philox.raw_data()) + 2);
    bindings.emplace_back(kDropoutScale, &dropout_scale);
    if (p.store_mask) bindings.emplace_back(kMask, mask.raw_data());
  }
  const Tensor workspace = graph::workspace_for(*plan, device);
  graph::execute(*plan, handle.get(), bindings, workspace);
  cudnn_attention_counter.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params) {
  return run_forward(out, lse, q, k, v, params, Tensor());
}

bool cudnn_attention_forward_with_mask(const Tensor& out, const Tensor& lse, const Tensor& mask, const Tensor& q,
                                       const Tensor& k, const Tensor& v, const AttentionParams& params) {
  return run_forward(out, lse, q, k, v, params, mask);
}

bool cudnn_attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const AttentionParams& params) {
  Problem p;
  if (!forward_problem(out, lse, q, k, v, params, p)) return false;
  if (!describable(grad_out, p.grad_out) || !describable(grad_q, p.grad_q) || !describable(grad_k, p.grad_k) ||
      !describable(grad_v, p.grad_v)) {
    return false;
  }
  for (const Tensor* t : {&grad_out, &grad_q, &grad_k, &grad_v}) {
    if (t->shape() != q.shape() || t->dtype() != q.dtype()) return false;
  }
  const core::Device device = q.device();
  core::cuda::DeviceGuard guard(device);
  CudnnHandle handle(device);
  const std::shared_ptr<const Plan> plan = plan_for(p, true, device, handle.get());
  if (!plan) return false;
  // The engine's f32 scratch: rowsum(dO * O) and the dQ accumulator (it initializes both).
  const Tensor row_sum = core::empty({p.b, p.h, p.t, 1}, TensorOptions(DType::f32, device));
  const Tensor grad_q_accum = core::empty({p.b, p.h, p.t, p.d}, TensorOptions(DType::f32, device));
  float scale = static_cast<float>(params.scale), neg_inf = -std::numeric_limits<float>::infinity();
  float one = static_cast<float>(1.0 - params.dropout_p),
        dropout_scale = static_cast<float>(1.0 / (1.0 - params.dropout_p));
  std::vector<std::pair<int64_t, void*>> bindings = {{kQ, q.raw_data()},
                                                     {kK, k.raw_data()},
                                                     {kV, v.raw_data()},
                                                     {kO, out.raw_data()},
                                                     {kGradOut, grad_out.raw_data()},
                                                     {kStats, lse.raw_data()},
                                                     {kGradQ, grad_q.raw_data()},
                                                     {kGradK, grad_k.raw_data()},
                                                     {kGradV, grad_v.raw_data()},
                                                     {kScale, &scale},
                                                     {kOne, &one},
                                                     {kRowSum, row_sum.raw_data()},
                                                     {kGradQAccum, grad_q_accum.raw_data()}};
  if (p.causal) bindings.emplace_back(kNegInf, &neg_inf);
  Tensor philox;
  if (p.dropout()) {
    philox = philox_arguments(params, device);
    bindings.emplace_back(kSeed, philox.raw_data());
    bindings.emplace_back(kOffset, static_cast<int64_t*>(philox.raw_data()) + 2);
    bindings.emplace_back(kDropoutScale, &dropout_scale);
  }
  const Tensor workspace = graph::workspace_for(*plan, device);
  graph::execute(*plan, handle.get(), bindings, workspace);
  cudnn_attention_counter.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {

// The fused dropout kernels of ops/nn_kernels.h: cuDNN's engine or nothing (our own kernels draw
// no mask, so what cuDNN declines runs unfused; see ops/attention.cpp).
bool dropout_forward_cuda(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionParams& params) {
  return params.dropout_p > 0.0 && cudnn_attention_forward(out, lse, q, k, v, params);
}

bool dropout_backward_cuda(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                           const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                           const AttentionParams& params) {
  return params.dropout_p > 0.0 &&
         cudnn_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, params);
}

COLOSSAL_REGISTER_KERNEL(attention_dropout_forward_stub, core::DeviceType::cuda, dropout_forward_cuda);
COLOSSAL_REGISTER_KERNEL(attention_dropout_backward_stub, core::DeviceType::cuda, dropout_backward_cuda);

}  // namespace

}  // namespace colossal::ops::cuda
