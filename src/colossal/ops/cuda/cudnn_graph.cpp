// cuDNN backend-API helpers; see cudnn_graph.h.
#include "colossal/ops/cuda/cudnn_graph.h"

#include <string>

#include "colossal/core/error.h"
#include "colossal/ops/cuda/cudnn_handle.h"  // cudnn_last_error, COLOSSAL_CUDNN_CHECK

namespace colossal::ops::cuda::graph {

Descriptors::~Descriptors() {
  // Destruction cannot fail for valid descriptors; nothing useful to do with an error here.
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
}

cudnnBackendDescriptor_t Descriptors::make(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = nullptr;
  COLOSSAL_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
  owned_.push_back(d);
  return d;
}

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void* value) {
  COLOSSAL_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, count, value));
}

void set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

void finalize(cudnnBackendDescriptor_t d) {
  COLOSSAL_CUDNN_CHECK(cudnnBackendFinalize(d));
}

cudnnBackendDescriptor_t GraphBuilder::tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                                              bool is_virtual, bool by_value) {
  cudnnBackendDescriptor_t t = d_.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  finalize(t);
  return t;
}

cudnnBackendDescriptor_t GraphBuilder::scratch(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
  return tensor(next_virtual_++, dims, strides, type, true);
}

cudnnBackendDescriptor_t GraphBuilder::scalar(int64_t uid) {
  return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                             cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t, cudnnDataType_t precision,
                             int64_t axis) {
  cudnnBackendDescriptor_t pw = d_.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(pw);
  cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (t != nullptr) set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
  set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  finalize(op);
  ops_.push_back(op);
}

void GraphBuilder::matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
  cudnnBackendDescriptor_t mm = d_.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  finalize(mm);
  cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
  set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
  set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
  set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
  finalize(op);
  ops_.push_back(op);
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t rd = d_.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  finalize(rd);
  cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
  set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
  set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
  finalize(op);
  ops_.push_back(op);
}

void GraphBuilder::reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set_descriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
  set_descriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
  finalize(op);
  ops_.push_back(op);
}

void GraphBuilder::rng_bernoulli(double probability, cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset,
                                 cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t rng = d_.make(CUDNN_BACKEND_RNG_DESCRIPTOR);
  const cudnnRngDistribution_t distribution = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  set(rng, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &distribution);
  set(rng, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &probability);
  finalize(rng);
  cudnnBackendDescriptor_t op = d_.make(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
  set_descriptor(op, CUDNN_ATTR_OPERATION_RNG_YDESC, y);
  set_descriptor(op, CUDNN_ATTR_OPERATION_RNG_SEED, seed);  // a tensor (an int64 value would fix it in the plan)
  set_descriptor(op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset);
  set_descriptor(op, CUDNN_ATTR_OPERATION_RNG_DESC, rng);
  finalize(op);
  ops_.push_back(op);
}

void GraphBuilder::build(Plan& plan) {
  cudnnBackendDescriptor_t graph = d_.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
      ops_.data());
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  finalize(graph);
  cudnnBackendDescriptor_t heuristics = d_.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heuristics);
  int64_t count = 0;
  COLOSSAL_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  COLOSSAL_CHECK(count > 0, "cuDNN graph: no engine supports it");
  std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
  for (auto& c : configs) c = d_.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  COLOSSAL_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, configs.data()));
  configs.resize(static_cast<size_t>(count));
  std::string declined;
  for (size_t i = 0; i < configs.size(); ++i) {
    cudnnBackendDescriptor_t candidate = nullptr;
    COLOSSAL_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &candidate));
    cudnnStatus_t status =
        cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    if (status == CUDNN_STATUS_SUCCESS) {
      status = cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
    }
    if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(candidate);
    int64_t workspace = 0, returned = 0;
    if (status == CUDNN_STATUS_SUCCESS) {
      status = cudnnBackendGetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                        &returned, &workspace);
    }
    if (status != CUDNN_STATUS_SUCCESS) {
      declined += fmt::format(" [{}: {}]", i, cudnnGetErrorString(status));
      cudnnBackendDestroyDescriptor(candidate);
      continue;
    }
    d_.adopt(candidate);  // destroyed before the configurations and the graph it was built from
    plan.plan = candidate;
    plan.workspace_bytes = workspace;
    return;
  }
  COLOSSAL_FAIL("cuDNN graph: no engine configuration finalized:{}", declined);
}

void execute(const Plan& plan, cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& bindings,
             const Tensor& workspace) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  uids.reserve(bindings.size());
  pointers.reserve(bindings.size());
  for (const auto& [uid, pointer] : bindings) {
    uids.push_back(uid);
    pointers.push_back(pointer);
  }
  Descriptors owner;
  cudnnBackendDescriptor_t pack = owner.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* workspace_pointer = workspace.defined() ? workspace.raw_data() : nullptr;
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
      pointers.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pointer);
  finalize(pack);
  COLOSSAL_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack));
}

Tensor workspace_for(const Plan& plan, core::Device device) {
  if (plan.workspace_bytes == 0) return Tensor();
  return core::empty({plan.workspace_bytes}, TensorOptions(DType::u8, device));
}

}  // namespace colossal::ops::cuda::graph
