// cuDNN's backend (graph) API for the CUDA kernels that build operation graphs (attention_cudnn.cpp):
// a graph is described op by op, finalized once into an execution plan (heuristics mode A, the first
// engine configuration that finalizes) kept in a PlanCache, and each call binds
// its pointers in a variant pack and executes (~10 us of host time). Internal: includes cudnn.h.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::ops::cuda::graph {

using Dims = std::array<int64_t, 4>;

/// Owns backend descriptors and destroys them in reverse order of creation.
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors();

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type);
  void adopt(cudnnBackendDescriptor_t d) { owned_.push_back(d); }

 private:
  std::vector<cudnnBackendDescriptor_t> owned_;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void* value);
void set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value);
void finalize(cudnnBackendDescriptor_t d);

/// A finalized execution plan and every descriptor it refers to.
struct Plan {
  Descriptors descriptors;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
};

/// Builds one operation graph op by op; build() turns it into a plan. Tensors are 4-D.
class GraphBuilder {
 public:
  GraphBuilder(cudnnHandle_t handle, Descriptors& descriptors) : handle_(handle), d_(descriptors) {}

  /// A tensor bound by `uid` at execution (or a virtual one, never stored), 16-byte aligned.
  cudnnBackendDescriptor_t tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                                  bool is_virtual = false, bool by_value = false);
  /// A virtual tensor with the next free uid (counting up from 1000).
  cudnnBackendDescriptor_t scratch(const Dims& dims, const Dims& strides, cudnnDataType_t type);
  /// A host f32 scalar passed by value.
  cudnnBackendDescriptor_t scalar(int64_t uid);

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1);
  /// c = a b, batched over the leading two dimensions, accumulating in f32.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  /// y <- Bernoulli draws (1 with probability `probability`, else 0) from the Philox stream whose
  /// seed and offset are the int64 [1, 1, 1, 1] tensors `seed` and `offset`.
  void rng_bernoulli(double probability, cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset,
                     cudnnBackendDescriptor_t y);

  /// The operation graph, engine heuristics (mode A) and the first configuration that finalizes;
  /// throws when none does.
  void build(Plan& plan);

 private:
  cudnnHandle_t handle_;
  Descriptors& d_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = 1000;
};

/// Plans by key, each built on first use by `describe(GraphBuilder&)` then GraphBuilder::build. A
/// key whose graph cuDNN declines (any error while building: an older cuDNN, an older GPU, a layout
/// no engine takes) is remembered as nullptr, so the caller falls back without asking again; the
/// environment variable COLOSSAL_CUDNN_GRAPH_VERBOSE=1 prints the reason to stderr.
template <class Key>
class PlanCache {
 public:
  template <class Describe>
  std::shared_ptr<const Plan> get(const Key& key, cudnnHandle_t handle, const Describe& describe) {
    std::lock_guard lock(mutex_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    auto plan = std::make_shared<Plan>();
    try {
      GraphBuilder g(handle, plan->descriptors);
      describe(g);
      g.build(*plan);
    } catch (const std::exception& error) {
      // COLOSSAL_CUDNN_GRAPH_VERBOSE=1 says why (the callers fall back silently).
      if (const char* verbose = std::getenv("COLOSSAL_CUDNN_GRAPH_VERBOSE"); verbose && verbose[0] == '1') {
        std::fprintf(stderr, "colossal: cuDNN declined a graph: %s\n", error.what());
      }
      plan.reset();
    }
    plans_.emplace(key, plan);
    return plan;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Plan>> plans_;
};

/// Binds (uid, pointer) pairs and the workspace, and runs the plan on the handle's stream. The
/// bindings must name exactly the graph's non-virtual tensors.
void execute(const Plan& plan, cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& bindings,
             const Tensor& workspace);

/// The plan's workspace from the caching allocator (undefined when it needs none).
Tensor workspace_for(const Plan& plan, core::Device device);

}  // namespace colossal::ops::cuda::graph
