// Module: the base of every layer and model. It owns named parameters, buffers and child modules in
// registration order, gives them dotted names ("h.0.attn.c_attn.weight") as PyTorch does, switches
// train/eval, converts dtype/device, and saves/loads state dicts under those names.
//
// Note [Parameter slots]: a module keeps each parameter and buffer in a slot whose address never
// changes (a deque), and register_parameter() returns a reference to it. Layers keep a pointer to
// their slots, so after to(dtype) or to(device), which put converted tensors into the slots, the
// layer's forward sees the new tensors. Tensor handles taken before the conversion keep pointing at
// the old tensors: build optimizers after to(), as PyTorch's documentation also asks. A conversion
// that changes nothing (same dtype, same device) keeps the handles.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/nn/state_dict.h"

namespace colossal::nn {

/// What load_state_dict(strict = false) could not match (with strict = true either throws).
struct LoadResult {
  std::vector<std::string> missing_keys;     ///< in the module, absent from the state dict
  std::vector<std::string> unexpected_keys;  ///< in the state dict, absent from the module
};

class Module {
 public:
  /// type_name is what error messages and to_string() call the module ("Linear").
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  /// The computation of single-input modules. Modules with other signatures (a model taking ids
  /// and targets) add their own methods; calling this on them throws.
  virtual Tensor forward(const Tensor& input);
  /// forward() between this module's forward hooks: what a parent calls on a child whose calls
  /// others may want to see (Sequential's children, the models' transformer blocks, the Engine's
  /// model). See Note [Forward hooks] in module.cpp.
  Tensor operator()(const Tensor& input);

  // ---- forward hooks (Note [Forward hooks])
  /// Runs before forward() when the module is called through operator(), with the input.
  using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
  /// Runs after forward() when called through operator(); returning a defined tensor replaces the
  /// output (ZeRO-3 puts an autograd node there whose backward runs before the module's).
  using ForwardHook = std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  /// Each returns an id for remove_forward_hook; hooks run in registration order.
  int64_t register_forward_pre_hook(ForwardPreHook hook);
  int64_t register_forward_hook(ForwardHook hook);
  /// Removes the pre-hook or hook of that id (nothing when there is none).
  void remove_forward_hook(int64_t id);

  // ---- registration (names must be non-empty, contain no '.', and be unique in this module)
  /// Registers `value` as a trainable leaf (detached if it was not a leaf) and returns its slot
  /// (see Note [Parameter slots]). An undefined value registers an absent parameter (as a bias
  /// of None in PyTorch): it has a slot but no name in parameters() or state_dict().
  Tensor& register_parameter(std::string name, Tensor value, bool requires_grad = true);
  /// Registers state that is not trained (running statistics). Non-persistent buffers stay out of
  /// state_dict().
  Tensor& register_buffer(std::string name, Tensor value, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }

  // ---- traversal (registration order, this module's own entries before its children's)
  /// Every defined parameter under its dotted name; a tensor shared by two modules (tied weights)
  /// appears once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  /// This module (named "") and every descendant, pre-order. The pointers live as long as this module.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// Calls fn on every descendant and then on this module (children first, as torch's apply).
  void apply(const std::function<void(Module&)>& fn);

  /// Lookup by dotted path; each throws naming the nearest existing names.
  Tensor& parameter(std::string_view dotted_name);
  Tensor& buffer(std::string_view dotted_name);
  std::shared_ptr<Module> submodule(std::string_view dotted_name) const;

  // ---- modes and conversion
  /// Sets training mode on this module and every descendant.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves parameters (with their gradients) and buffers to device. See Note [Parameter slots].
  Module& to(Device device);
  /// Converts floating parameters (with their gradients) and floating buffers to a floating dtype;
  /// integer buffers (num_batches_tracked) stay as they are.
  Module& to(DType dtype);

  /// Drops (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);
  /// Elements over unique parameters; only those requiring grad when trainable_only.
  int64_t num_parameters(bool trainable_only = false) const;

  // ---- state dicts
  /// Parameters and persistent buffers under their dotted names, as detached handles on the
  /// module's own storage (clone them to keep a snapshot across training).
  StateDict state_dict() const;
  /// Copies the state dict's tensors into this module's (casting dtype and moving device). Every
  /// problem is found before anything is copied, so a failed load leaves the module unchanged:
  /// shape mismatches always throw; missing and unexpected keys throw when strict and are returned
  /// otherwise. The message lists every offending key with the nearest names on the other side.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  /// A tree of type names and extra_repr(), like printing a torch module.
  std::string to_string() const;
  /// The constructor arguments worth printing ("in_features=4, out_features=3, bias=true").
  virtual std::string extra_repr() const { return ""; }

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
    bool persistent = true;  // buffers only
  };

  void add_child(std::string name, std::shared_ptr<Module> module);
  /// This module's dotted path from the root of the tree it is registered in ("" for the root).
  std::string path() const;
  void check_new_name(const std::string& name, const char* what) const;
  /// Visits every slot of this module and its descendants (dotted name, slot, is_parameter).
  /// The parameter or buffer (`slots` picks which) at a dotted path; throws naming the nearest names.
  Tensor& find_slot(std::string_view dotted_name, std::deque<Slot> Module::*slots, const char* kind);
  void visit_slots(const std::string& prefix, const std::function<void(const std::string&, Slot&, bool)>& fn);
  void collect(const std::string& prefix, bool recurse, bool parameters_wanted,
               std::vector<std::pair<std::string, Tensor>>& out, std::vector<const core::TensorImpl*>& seen) const;
  void collect_state(const std::string& prefix, StateDict& out) const;
  void append_repr(std::string& out, const std::string& indent) const;
  void convert(const std::function<Tensor(const Tensor&)>& fn, bool floating_only);

  std::string type_name_;
  bool training_ = true;
  /// The module this one was last registered in (not owning; cleared when that parent dies). It
  /// gives parameters their full dotted names even when children are added after the parent was
  /// itself registered (a ModuleList filled later).
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  std::deque<Slot> parameters_;
  std::deque<Slot> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<int64_t, ForwardPreHook>> forward_pre_hooks_;
  std::vector<std::pair<int64_t, ForwardHook>> forward_hooks_;
  int64_t next_hook_id_ = 0;
};

/// Runs its children in order, each on the previous one's output; children are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t index) const;
  template <class M>
  std::shared_ptr<M> at(size_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    COLOSSAL_CHECK(typed != nullptr, "Sequential::at({}): the module is a {}, not the requested type", index,
                   (*this)[index]->type_name());
    return typed;
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

/// Holds modules under "0", "1", ... so their parameters are registered; has no forward (the
/// owner runs them, e.g. transformer blocks in a loop).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t index) const;
  template <class M>
  std::shared_ptr<M> at(size_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    COLOSSAL_CHECK(typed != nullptr, "ModuleList::at({}): the module is a {}, not the requested type", index,
                   (*this)[index]->type_name());
    return typed;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace colossal::nn
