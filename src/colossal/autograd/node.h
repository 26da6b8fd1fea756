// The recorded graph: a Node per op application, with an Edge per differentiable input pointing
// at the node that produced it (or a leaf's AccumulateGrad). The engine walks these backwards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> function;
  /// Which input of `function` this gradient feeds.
  uint32_t input_nr = 0;
  bool valid() const { return function != nullptr; }
};

/// Shape, dtype and device of a node output, so the engine can supply zeros for an output whose
/// gradient never arrives.
struct OutputMeta {
  core::Shape shape;
  core::DType dtype = core::DType::f32;
  core::Device device{};
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  /// Gradients w.r.t. this node's inputs (one per next edge; undefined where not needed), given
  /// gradients w.r.t. its outputs (all defined: the engine fills missing ones with zeros).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  /// Drops saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  /// True when input i's gradient is wanted (its edge leads somewhere).
  bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }
  /// Creation order; the engine runs later nodes first among those ready.
  uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<OutputMeta>& output_meta() { return output_meta_; }
  const std::vector<OutputMeta>& output_meta() const { return output_meta_; }

  /// Hooks on output `output_nr`'s gradient before apply() (Tensor hooks on non-leaves).
  using PreHook = std::function<Tensor(const Tensor&)>;
  void add_pre_hook(uint32_t output_nr, PreHook hook) { pre_hooks_.emplace_back(output_nr, std::move(hook)); }
  void run_pre_hooks(std::vector<Tensor>& grad_outputs) const;
  bool has_pre_hooks() const { return !pre_hooks_.empty(); }

 private:
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> output_meta_;
  std::vector<std::pair<uint32_t, PreHook>> pre_hooks_;
  uint64_t sequence_nr_;
};

/// A node whose backward is a closure; what every built-in op records (see function.h record()).
class LambdaNode final : public Node {
 public:
  using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs, const Node& node)>;
  LambdaNode(std::string name, BackwardFn backward) : name_(std::move(name)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  std::string name_;
  BackwardFn backward_;
};

/// The sink for a leaf's gradient: runs the leaf's hooks, adds into .grad, then its grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  const Tensor& leaf() const { return leaf_; }
  /// What apply() does after its addition, for a gradient the op that computed it already added into
  /// the leaf's .grad (Note [Gradient accumulation in the op] in engine.cpp): the grad-ready hooks.
  void run_ready_hooks();

 private:
  Tensor leaf_;
};

/// True when nothing but the caller's handle can see t's memory (one handle, one storage user,
/// contiguous over its whole storage), so it may be written in place.
bool exclusively_owned(const Tensor& t);

/// The edge a gradient for `t` flows along: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);
/// The leaf's AccumulateGrad, created on first use and shared afterwards.
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

}  // namespace colossal::autograd
