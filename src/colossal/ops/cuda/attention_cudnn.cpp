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
// Measured on an H100 (cuDNN 9.19, B8 H12 T1024 D64 causal bf16): forward 48 us, backward 161 us
// (dO.O 18 + main 124 + dQ conversion 16), the same kernels and times as PyTorch's; our own
// flash kernels take 77 and 181 + 32. Building a plan costs 0.05-1.6 s, hence the cache.
#include "colossal/ops/cuda/attention_cudnn.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "colossal/core/cuda_device.h"  // DeviceGuard, properties
#include "colossal/core/tensor.h"
#include "colossal/ops/cuda/cudnn_handle.h"

namespace colossal::ops::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{[] {
    const char* env = std::getenv("COLOSSAL_CUDNN_ATTENTION");
    return env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
  }()};
  return flag;
}

// Unique ids of the tensors the variant pack binds; virtual tensors count up from kFirstVirtual.
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
  kFirstVirtual = 100
};

/// The problem as cuDNN sees it: [B, H, T, D] operands with their own strides.
struct Problem {
  int64_t b = 0, h = 0, t = 0, d = 0;
  cudnnDataType_t type = CUDNN_DATA_BFLOAT16;
  bool causal = false;
  Dims q{}, k{}, v{}, o{}, grad_out{}, grad_q{}, grad_k{}, grad_v{};  // strides

  std::vector<int64_t> key(bool backward, int device) const {
    std::vector<int64_t> key = {device, backward, static_cast<int64_t>(type), causal, b, h, t, d};
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
  p.causal = params.causal;
  return true;
}

/// Owns backend descriptors and destroys them in reverse order of creation.
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    check(cudnnBackendCreateDescriptor(type, &d), "create a descriptor");
    owned_.push_back(d);
    return d;
  }

  /// Throws (to the plan builder, which then declines the problem) on a failed call.
  static void check(cudnnStatus_t status, const char* what) {
    if (status != CUDNN_STATUS_SUCCESS) {
      COLOSSAL_FAIL("cuDNN attention graph: {} failed: {} ({})", what, cudnnGetErrorString(status), cudnn_last_error());
    }
  }

 private:
  std::vector<cudnnBackendDescriptor_t> owned_;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void* value) {
  Descriptors::check(cudnnBackendSetAttribute(d, name, type, count, value), "set an attribute");
}
void set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
void finalize(cudnnBackendDescriptor_t d, const char* what) {
  Descriptors::check(cudnnBackendFinalize(d), what);
}

/// A built graph's execution plan, with every descriptor it refers to.
struct Plan {
  Descriptors descriptors;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
};

/// Builds one operation graph op by op (see the Note for the graphs).
class GraphBuilder {
 public:
  GraphBuilder(cudnnHandle_t handle, Descriptors& descriptors) : handle_(handle), d_(descriptors) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                                  bool is_virtual = false, bool by_value = false) {
    cudnnBackendDescriptor_t t = d_.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(t, "a tensor");
    return t;
  }
  cudnnBackendDescriptor_t scratch(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return tensor(next_virtual_++, dims, strides, type, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = d_.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    finalize(op, "a pointwise op");
    ops_.push_back(op);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = d_.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(mm, "a matmul descriptor");
    cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(op, "a matmul op");
    ops_.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = d_.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(rd, "a reduction descriptor");
    cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    finalize(op, "a reduction op");
    ops_.push_back(op);
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_descriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_descriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(op, "a reshape op");
    ops_.push_back(op);
  }

  /// The operation graph, heuristics (mode A), and the first engine configuration whose plan finalizes.
  void build(Plan& plan) {
    cudnnBackendDescriptor_t graph = d_.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    finalize(graph, "the operation graph");
    cudnnBackendDescriptor_t heuristics = d_.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heuristics, "the engine heuristics");
    int64_t count = 0;
    Descriptors::check(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                       "count the engine configurations");
    COLOSSAL_CHECK(count > 0, "cuDNN attention graph: no engine supports it");
    std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
    for (auto& c : configs) c = d_.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    Descriptors::check(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, configs.data()),
                       "read the engine configurations");
    std::string declined;
    for (int64_t i = 0; i < count; ++i) {
      cudnnBackendDescriptor_t candidate = nullptr;
      Descriptors::check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &candidate),
                         "create an execution plan");
      cudnnStatus_t status =
          cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      if (status == CUDNN_STATUS_SUCCESS) {
        status = cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[static_cast<size_t>(i)]);
      }
      if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(candidate);
      if (status != CUDNN_STATUS_SUCCESS) {
        declined += fmt::format(" [{}: {}]", i, cudnnGetErrorString(status));
        cudnnBackendDestroyDescriptor(candidate);
        continue;
      }
      plan.plan = candidate;
      break;
    }
    COLOSSAL_CHECK(plan.plan != nullptr, "cuDNN attention graph: no engine configuration finalized:{}", declined);
    // The plan joins the descriptors it was built from, after them: destroyed first.
    Descriptors::check(cudnnBackendGetAttribute(plan.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                1, &count, &plan.workspace_bytes),
                       "read the workspace size");
  }

 private:
  cudnnHandle_t handle_;
  Descriptors& d_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

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
  cudnnBackendDescriptor_t probabilities = g.scratch(scores, packed, p.type);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probabilities);
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

  // sum = rowsum(dO * O)
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

  // dV = P^T dO
  cudnnBackendDescriptor_t probabilities_t = g.scratch(scores, packed_t, p.type);
  g.reshape(probabilities, probabilities_t);
  g.matmul(probabilities_t, grad_out, grad_v);

  // dS = P * (dO V^T - sum) * scale
  cudnnBackendDescriptor_t grad_p = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.matmul(grad_out, vt, grad_p);
  cudnnBackendDescriptor_t centered = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, grad_p, sum, centered);
  cudnnBackendDescriptor_t weighted = g.scratch(scores, packed, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, weighted);
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

/// The cached plan for a problem, built on first use; nullptr when cuDNN declines it (remembered).
std::shared_ptr<const Plan> plan_for(const Problem& p, bool backward, core::Device device, cudnnHandle_t handle) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::shared_ptr<const Plan>> cache;
  const std::vector<int64_t> key = p.key(backward, device.index);
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto plan = std::make_shared<Plan>();
  try {
    GraphBuilder g(handle, plan->descriptors);
    backward ? build_backward(g, p) : build_forward(g, p);
    g.build(*plan);
  } catch (const std::exception&) {
    // Declined (an older cuDNN, a GPU before sm80, a layout the engine does not take): our kernels run it.
    plan.reset();
  }
  cache.emplace(key, plan);
  return plan;
}

/// Binds the operands to the plan's uids and runs it on the handle's (the current) stream.
void execute(const Plan& plan, cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& bindings,
             const Tensor& workspace) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, pointer] : bindings) {
    uids.push_back(uid);
    pointers.push_back(pointer);
  }
  Descriptors pack_owner;
  cudnnBackendDescriptor_t pack = pack_owner.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* workspace_pointer = workspace.defined() ? workspace.raw_data() : nullptr;
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
      pointers.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pointer);
  finalize(pack, "the variant pack");
  COLOSSAL_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack));
}

Tensor workspace_for(const Plan& plan, core::Device device) {
  if (plan.workspace_bytes == 0) return Tensor();
  return core::empty({plan.workspace_bytes}, TensorOptions(DType::u8, device));
}

}  // namespace

void set_cudnn_attention_enabled(bool enabled) {
  enabled_flag().store(enabled ? 1 : 0);
}
bool cudnn_attention_enabled() {
  return enabled_flag().load() != 0;
}

bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params) {
  Problem p;
  if (!forward_problem(out, lse, q, k, v, params, p)) return false;
  const core::Device device = q.device();
  core::cuda::DeviceGuard guard(device);
  CudnnHandle handle(device);
  const std::shared_ptr<const Plan> plan = plan_for(p, false, device, handle.get());
  if (!plan) return false;
  float scale = static_cast<float>(params.scale), neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<std::pair<int64_t, void*>> bindings = {{kQ, q.raw_data()},   {kK, k.raw_data()},       {kV, v.raw_data()},
                                                     {kO, out.raw_data()}, {kStats, lse.raw_data()}, {kScale, &scale}};
  if (p.causal) bindings.emplace_back(kNegInf, &neg_inf);
  const Tensor workspace = workspace_for(*plan, device);
  execute(*plan, handle.get(), bindings, workspace);
  cudnn_attention_counter.fetch_add(1, std::memory_order_relaxed);
  return true;
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
  float scale = static_cast<float>(params.scale), neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
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
  const Tensor workspace = workspace_for(*plan, device);
  execute(*plan, handle.get(), bindings, workspace);
  cudnn_attention_counter.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace colossal::ops::cuda
