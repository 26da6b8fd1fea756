// Module registration, traversal, conversion and state-dict loading; Sequential and ModuleList.
#include "colossal/nn/module.h"

#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/view.h"           // cast_raw, to_device_raw

namespace colossal::nn {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  return name.empty() ? prefix : prefix + "." + name;
}

std::string suggestion(std::string_view name, const std::vector<std::string>& candidates, const char* where) {
  const auto near = nearest_names(name, candidates);
  if (near.empty()) return "";
  return fmt::format(" (nearest {}: '{}')", where, fmt::join(near, "', '"));
}

/// When every unexpected key is some missing key behind one common prefix ("transformer.",
/// "module."), says so: that is one fix, not hundreds of separate problems.
std::string prefix_hint(const std::vector<std::string>& missing, const std::vector<std::string>& unexpected) {
  if (missing.empty() || unexpected.empty()) return "";
  const std::unordered_set<std::string> missing_set(missing.begin(), missing.end());
  for (const std::string& m : missing) {
    const std::string& u = unexpected.front();
    if (u.size() <= m.size() + 1 || !u.ends_with("." + m)) continue;
    const std::string prefix = u.substr(0, u.size() - m.size());
    bool all = true;
    for (const std::string& key : unexpected) {
      all = all && key.starts_with(prefix) && missing_set.contains(key.substr(prefix.size()));
    }
    if (all) {
      return fmt::format(
          "\n  hint: every unexpected key is a missing key with the prefix '{}'; strip it from the state dict", prefix);
    }
  }
  return "";
}

/// A converted parameter must stay a leaf that trains, keeps its name and its hooks.
Tensor adopt_parameter(const Tensor& old_param, Tensor converted, const std::function<Tensor(const Tensor&)>& fn) {
  if (!converted.is_leaf() || converted.autograd_meta_if_exists() != nullptr) converted = converted.detach();
  if (const core::AutogradMeta* meta = old_param.autograd_meta_if_exists()) {
    core::AutogradMeta& new_meta = converted.autograd_meta();
    new_meta.requires_grad = meta->requires_grad;
    new_meta.name = meta->name;
    new_meta.grad_hooks = meta->grad_hooks;
    new_meta.grad_ready_hooks = meta->grad_ready_hooks;
    if (meta->grad.defined()) new_meta.grad = fn(meta->grad);
  }
  return converted;
}

}  // namespace

Tensor Module::forward(const Tensor& input) {
  COLOSSAL_FAIL("{} has no single-input forward(); call the method its header declares for its inputs", type_name_);
}

// Note [Forward hooks]
// forward() is the virtual computation and parents call it directly where nothing needs to see the
// call (a layer's sublayers); operator() runs it between the module's forward hooks, as torch's
// __call__ does. The call sites that go through operator() are the units others hook: Sequential's
// children, GPT-2's and ViT's transformer blocks and the Engine's call of the model. ZeRO-3
// (parallel/zero/zero3.h) gathers a unit's parameters in its pre-hook, frees them in its hook and
// there puts an identity autograd node on the output whose backward gathers them again before the
// unit's backward runs. Hooks added or removed while hooks run take effect at the next call.
Tensor Module::operator()(const Tensor& input) {
  if (forward_pre_hooks_.empty() && forward_hooks_.empty()) return forward(input);
  const auto pre_hooks = forward_pre_hooks_;
  for (const auto& [id, hook] : pre_hooks) hook(*this, input);
  Tensor output = forward(input);
  const auto hooks = forward_hooks_;
  for (const auto& [id, hook] : hooks) {
    if (Tensor replaced = hook(*this, input, output); replaced.defined()) output = std::move(replaced);
  }
  return output;
}

int64_t Module::register_forward_pre_hook(ForwardPreHook hook) {
  forward_pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

int64_t Module::register_forward_hook(ForwardHook hook) {
  forward_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_forward_hook(int64_t id) {
  std::erase_if(forward_pre_hooks_, [id](const auto& entry) { return entry.first == id; });
  std::erase_if(forward_hooks_, [id](const auto& entry) { return entry.first == id; });
}

void Module::check_new_name(const std::string& name, const char* what) const {
  COLOSSAL_CHECK(!name.empty(), "{}: {} name must not be empty", type_name_, what);
  COLOSSAL_CHECK(name.find('.') == std::string::npos,
                 "{}: {} name '{}' must not contain '.', which separates the levels of dotted names", type_name_, what,
                 name);
  auto taken = [&](const auto& slots) {
    for (const auto& slot : slots) {
      if (slot.name == name) return true;
    }
    return false;
  };
  bool child_taken = false;
  for (const auto& [child_name, child] : children_) child_taken = child_taken || child_name == name;
  COLOSSAL_CHECK(!taken(parameters_) && !taken(buffers_) && !child_taken,
                 "{}: cannot register {} '{}': the name is already used by a parameter, buffer or child", type_name_,
                 what, name);
}

Tensor& Module::register_parameter(std::string name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  if (value.defined()) {
    COLOSSAL_CHECK(core::is_floating(value.dtype()),
                   "{}: parameter '{}' must be floating, got {}; integer state belongs in register_buffer", type_name_,
                   name, value.dtype());
    if (!value.is_leaf()) value = value.detach();
    value.set_requires_grad(requires_grad);
    value.autograd_meta().name = join_name(path(), name);
  }
  parameters_.push_back({std::move(name), std::move(value), true});
  return parameters_.back().tensor;
}

Tensor& Module::register_buffer(std::string name, Tensor value, bool persistent) {
  check_new_name(name, "buffer");
  if (value.defined() && !value.is_leaf()) value = value.detach();
  buffers_.push_back({std::move(name), std::move(value), persistent});
  return buffers_.back().tensor;
}

Module::~Module() {
  for (const auto& [name, child] : children_) {
    if (child->parent_ == this) child->parent_ = nullptr;
  }
}

std::string Module::path() const {
  return parent_ == nullptr ? std::string() : join_name(parent_->path(), name_in_parent_);
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  COLOSSAL_CHECK(module != nullptr, "{}: cannot register a null module as '{}'", type_name_, name);
  for (const Module* ancestor = this; ancestor != nullptr; ancestor = ancestor->parent_) {
    COLOSSAL_CHECK(ancestor != module.get(), "{}: registering '{}' would make a module its own descendant", type_name_,
                   name);
  }
  check_new_name(name, "module");
  module->parent_ = this;
  module->name_in_parent_ = name;
  // Parameters carry their full dotted path for error messages (autograd and optimizers print it).
  const std::string prefix = module->path();
  for (auto& [param_name, param] : module->named_parameters())
    param.autograd_meta().name = join_name(prefix, param_name);
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool parameters_wanted,
                     std::vector<std::pair<std::string, Tensor>>& out,
                     std::vector<const core::TensorImpl*>& seen) const {
  for (const Slot& slot : parameters_wanted ? parameters_ : buffers_) {
    if (!slot.tensor.defined()) continue;
    const core::TensorImpl* impl = slot.tensor.impl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    out.emplace_back(join_name(prefix, slot.name), slot.tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(join_name(prefix, name), true, parameters_wanted, out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const core::TensorImpl*> seen;
  collect("", recurse, true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters(recurse)) out.push_back(std::move(tensor));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const core::TensorImpl*> seen;
  collect("", recurse, false, out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_buffers(recurse)) out.push_back(std::move(tensor));
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_) {
    for (auto& [sub_name, sub] : child->named_modules()) out.emplace_back(join_name(name, sub_name), sub);
  }
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

std::shared_ptr<Module> Module::submodule(std::string_view dotted_name) const {
  const Module* current = this;
  std::shared_ptr<Module> found;
  size_t start = 0;
  while (start <= dotted_name.size()) {
    const size_t dot = dotted_name.find('.', start);
    const std::string_view part =
        dotted_name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    found = nullptr;
    for (const auto& [name, child] : current->children_) {
      if (name == part) found = child;
    }
    if (found == nullptr) {
      std::vector<std::string> names;
      for (auto& [name, module] : const_cast<Module*>(this)->named_modules()) {
        if (!name.empty()) names.push_back(name);
      }
      COLOSSAL_FAIL("{} has no submodule '{}'{}", type_name_, dotted_name, suggestion(dotted_name, names, "modules"));
    }
    current = found.get();
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return found;
}

Tensor& Module::find_slot(std::string_view dotted_name, std::deque<Slot> Module::*slots, const char* kind) {
  const size_t dot = dotted_name.rfind('.');
  Module* owner = this;
  std::shared_ptr<Module> keep_alive;
  if (dot != std::string_view::npos) {
    keep_alive = submodule(dotted_name.substr(0, dot));
    owner = keep_alive.get();
  }
  const std::string_view local = dot == std::string_view::npos ? dotted_name : dotted_name.substr(dot + 1);
  for (Slot& slot : owner->*slots) {
    if (slot.name == local) return slot.tensor;
  }
  const bool is_parameter = slots == &Module::parameters_;
  std::vector<std::string> names;
  for (auto& [name, tensor] : is_parameter ? named_parameters() : named_buffers()) names.push_back(name);
  COLOSSAL_FAIL("{} has no {} '{}'{}", type_name_, kind, dotted_name,
                suggestion(dotted_name, names, is_parameter ? "parameters" : "buffers"));
}

Tensor& Module::parameter(std::string_view dotted_name) {
  return find_slot(dotted_name, &Module::parameters_, "parameter");
}

Tensor& Module::buffer(std::string_view dotted_name) {
  return find_slot(dotted_name, &Module::buffers_, "buffer");
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::visit_slots(const std::string& prefix, const std::function<void(const std::string&, Slot&, bool)>& fn) {
  for (Slot& slot : parameters_) fn(join_name(prefix, slot.name), slot, true);
  for (Slot& slot : buffers_) fn(join_name(prefix, slot.name), slot, false);
  for (const auto& [name, child] : children_) child->visit_slots(join_name(prefix, name), fn);
}

void Module::convert(const std::function<Tensor(const Tensor&)>& fn, bool floating_only) {
  autograd::NoGradGuard no_grad;
  // Tied tensors (one TensorImpl in two slots) must stay tied after the conversion.
  std::unordered_map<const core::TensorImpl*, Tensor> converted;
  visit_slots("", [&](const std::string&, Slot& slot, bool is_parameter) {
    const Tensor old = slot.tensor;
    if (!old.defined() || (floating_only && !core::is_floating(old.dtype()))) return;
    if (auto it = converted.find(old.impl()); it != converted.end()) {
      slot.tensor = it->second;
      return;
    }
    Tensor fresh = fn(old);
    if (!fresh.is_same(old) && is_parameter) fresh = adopt_parameter(old, fresh, fn);
    converted.emplace(old.impl(), fresh);
    slot.tensor = fresh;
  });
}

Module& Module::to(Device device) {
  convert([device](const Tensor& t) { return t.device() == device ? t : core::to_device_raw(t, device); }, false);
  return *this;
}

Module& Module::to(DType dtype) {
  COLOSSAL_CHECK(core::is_floating(dtype), "{}.to({}): modules convert to floating dtypes only (f32, f64, f16, bf16)",
                 type_name_, dtype);
  convert([dtype](const Tensor& t) { return t.dtype() == dtype ? t : core::cast_raw(t, dtype); }, true);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& param : parameters()) {
    if (set_to_none) {
      if (param.grad().defined()) param.set_grad(Tensor());
    } else if (param.grad().defined()) {
      param.grad().zero_();
    }
  }
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t total = 0;
  for (const Tensor& param : parameters()) {
    if (!trainable_only || param.requires_grad()) total += param.numel();
  }
  return total;
}

void Module::collect_state(const std::string& prefix, StateDict& out) const {
  for (const Slot& slot : parameters_) {
    if (slot.tensor.defined()) out.insert(join_name(prefix, slot.name), slot.tensor.detach());
  }
  for (const Slot& slot : buffers_) {
    if (slot.tensor.defined() && slot.persistent) out.insert(join_name(prefix, slot.name), slot.tensor.detach());
  }
  for (const auto& [name, child] : children_) child->collect_state(join_name(prefix, name), out);
}

StateDict Module::state_dict() const {
  StateDict out;
  collect_state("", out);
  return out;
}

LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  const std::vector<std::string> own_keys = own.keys();
  const std::vector<std::string> state_keys = state.keys();
  LoadResult result;
  std::vector<std::string> mismatches;
  for (const auto& [name, dst] : own) {
    const Tensor* src = state.find(name);
    if (src == nullptr) {
      result.missing_keys.push_back(name);
    } else if (!src->defined() || src->shape() != dst.shape()) {
      mismatches.push_back(fmt::format("shape mismatch '{}': state dict has {}, module has {}", name,
                                       src->defined() ? fmt::format("{}", src->shape()) : "an undefined tensor",
                                       dst.shape()));
    }
  }
  for (const auto& [name, src] : state) {
    if (!own.contains(name)) result.unexpected_keys.push_back(name);
  }

  const bool key_problems = strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty());
  if (key_problems || !mismatches.empty()) {
    std::string message = fmt::format("load_state_dict into {}: ", type_name_);
    std::vector<std::string> counts;
    if (strict) {
      if (!result.missing_keys.empty()) counts.push_back(fmt::format("{} missing key(s)", result.missing_keys.size()));
      if (!result.unexpected_keys.empty()) {
        counts.push_back(fmt::format("{} unexpected key(s)", result.unexpected_keys.size()));
      }
    }
    if (!mismatches.empty()) counts.push_back(fmt::format("{} shape mismatch(es)", mismatches.size()));
    message += fmt::format("{}; nothing was loaded", fmt::join(counts, ", "));
    if (strict) {
      for (const std::string& key : result.missing_keys) {
        message += fmt::format("\n  missing '{}'{}", key, suggestion(key, result.unexpected_keys, "in the state dict"));
      }
      for (const std::string& key : result.unexpected_keys) {
        message += fmt::format("\n  unexpected '{}'{}", key, suggestion(key, result.missing_keys, "in the module"));
      }
      message += prefix_hint(result.missing_keys, result.unexpected_keys);
    }
    for (const std::string& line : mismatches) message += "\n  " + line;
    if (key_problems)
      message += "\n  (load_state_dict(state, /*strict=*/false) loads the matching keys and returns the rest)";
    COLOSSAL_FAIL("{}", message);
  }

  autograd::NoGradGuard no_grad;
  for (const auto& [name, dst] : own) {
    const Tensor* src = state.find(name);
    if (src == nullptr) continue;
    dst.copy_(src->device() == dst.device() ? *src : core::to_device_raw(*src, dst.device()));
  }
  return result;
}

void Module::append_repr(std::string& out, const std::string& indent) const {
  out += type_name_ + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [name, child] : children_) {
      out += indent + "  (" + name + "): ";
      child->append_repr(out, indent + "  ");
      out += "\n";
    }
    out += indent;
  }
  out += ")";
}

std::string Module::to_string() const {
  std::string out;
  append_repr(out, "");
  return out;
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& module : modules) push_back(module);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& module : modules_) x = (*module)(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  COLOSSAL_CHECK(index < modules_.size(), "Sequential: index {} out of range for {} modules", index, modules_.size());
  return modules_[index];
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](size_t index) const {
  COLOSSAL_CHECK(index < modules_.size(), "ModuleList: index {} out of range for {} modules", index, modules_.size());
  return modules_[index];
}

}  // namespace colossal::nn
