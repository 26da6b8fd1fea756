// The Optimizer base: parameter groups with defaults, per-parameter state, the flat state_dict
// format, and the decay / no-decay grouping rule.
#include "colossal/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "colossal/core/error.h"       // COLOSSAL_CHECK
#include "colossal/core/view.h"        // copy_stub
#include "colossal/optim/clip_grad.h"  // scale_

namespace colossal::optim {

// Note [Multi-tensor optimizer kernels]
// Every optimizer's step() validates each group's hyper-parameters, then gathers the parameters
// that have gradients into MultiTensorLists (one per device) and hands each list to its update:
// a DispatchStub (sgd_step_stub, adam_step_stub, ...) when a backend registered a kernel for that
// device, the per-tensor reference loop otherwise. The reference loop is written with in-place
// ops:: calls, so it already runs on any device whose elementwise kernels exist; a fused CUDA
// kernel (one launch over all tensors of a group, as apex's multi_tensor_apply) only has to
// register itself on the stub to replace it. Scalars that depend on the step count (bias
// corrections) are computed per tensor from lists.steps, so a kernel sees the same numbers.

double ParamGroup::get(const std::string& key) const {
  auto it = options.find(key);
  if (it != options.end()) return it->second;
  std::vector<std::string> keys;
  for (const auto& [k, v] : options) keys.push_back(k);
  COLOSSAL_FAIL("param group has no option '{}'; it has: {}", key, fmt::join(keys, ", "));
}

std::string ParamGroup::param_label(size_t index) const {
  if (index < names.size()) return fmt::format("'{}'", names[index]);
  return fmt::format("#{}", index);
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {
  COLOSSAL_CHECK(!groups.empty(), "{}: needs at least one param group", name_);
  for (size_t g = 0; g < groups.size(); ++g) {
    check_and_fill_group(groups[g], g);
    groups_.push_back(std::move(groups[g]));
  }
  check_no_duplicate_params();
  // Hyper-parameter ranges are checked by the derived constructor: a virtual call from here would
  // not reach it.
}

std::string Optimizer::group_context(size_t group_index) const {
  return fmt::format("{}: param group {}: ", name_, group_index);
}

double Optimizer::checked_option(const ParamGroup& group, size_t group_index, const std::string& key,
                                 bool (*valid)(double), const char* range) const {
  COLOSSAL_CHECK(group.has(key), "{}option '{}' is missing", group_context(group_index), key);
  const double value = group.get(key);
  COLOSSAL_CHECK(valid(value), "{}{} must be {}, got {}", group_context(group_index), key, range, value);
  return value;
}

void Optimizer::check_and_fill_group(ParamGroup& group, size_t group_index) const {
  const std::string context = group_context(group_index);
  COLOSSAL_CHECK(group.names.empty() || group.names.size() == group.params.size(),
                 "{}names must be empty or one per parameter: {} names for {} parameters", context, group.names.size(),
                 group.params.size());
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    COLOSSAL_CHECK(p.defined(), "{}parameter {} is an undefined tensor", context, group.param_label(i));
    COLOSSAL_CHECK(core::is_floating(p.dtype()), "{}parameter {} has dtype {}; only floating tensors can be optimized",
                   context, group.param_label(i), p.dtype());
    COLOSSAL_CHECK(p.is_leaf(),
                   "{}parameter {} is not a leaf (it was produced by an op); optimize the leaf it came from", context,
                   group.param_label(i));
  }
  for (const auto& [key, value] : group.options) {
    if (!defaults_.contains(key)) {
      std::vector<std::string> known;
      for (const auto& [k, v] : defaults_) known.push_back(k);
      COLOSSAL_FAIL("{}unknown option '{}'; {} options are: {}", context, key, name_, fmt::join(known, ", "));
    }
  }
  for (const auto& [key, value] : defaults_) group.options.try_emplace(key, value);
}

void Optimizer::check_no_duplicate_params() const {
  std::unordered_set<const core::TensorImpl*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      COLOSSAL_CHECK(seen.insert(groups_[g].params[i].impl()).second,
                     "{}parameter {} appears more than once across the param groups; each parameter must be in "
                     "exactly one group",
                     group_context(g), groups_[g].param_label(i));
    }
  }
}

void Optimizer::validate_all_groups() const {
  for (size_t g = 0; g < groups_.size(); ++g) validate_group(groups_[g], g);
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t index = groups_.size();
  check_and_fill_group(group, index);
  validate_group(group, index);
  groups_.push_back(std::move(group));
  try {
    check_no_duplicate_params();
  } catch (...) {
    groups_.pop_back();
    throw;
  }
}

void Optimizer::scale_gradients_in_next_step(Tensor scale) {
  COLOSSAL_CHECK(!scale.defined() || scale.numel() == 1,
                 "{}: scale_gradients_in_next_step expects a one-element tensor, got shape {}", name_, scale.shape());
  if (scale.defined() && scale.dtype() != DType::f64) scale = scale.to(DType::f64);
  grad_scale_ = scale.defined() ? scale.reshape({}) : scale;
}

Tensor Optimizer::release_grad_scale() {
  return std::exchange(grad_scale_, Tensor());
}

void Optimizer::take_grad_scale() {
  grad_scale_ = Tensor();
  grad_unscale_ = 1.0;
  write_through_.clear();
}

void Optimizer::unscale_gradients_in_next_step(double factor) {
  COLOSSAL_CHECK(supports_mixed_precision_step(),
                 "{}: unscale_gradients_in_next_step: this optimizer does not unscale inside its update; multiply the "
                 "gradients first (optim::sum_of_squares with a scale)",
                 name_);
  COLOSSAL_CHECK(std::isfinite(factor) && factor > 0.0,
                 "{}: unscale_gradients_in_next_step expects a finite factor > 0, got {}", name_, factor);
  grad_unscale_ = factor;
}

void Optimizer::write_through_in_next_step(const std::vector<Tensor>& params, const std::vector<Tensor>& copies) {
  // Called by mixed precision every step: the messages are formatted only when a check fails.
  COLOSSAL_CHECK(supports_mixed_precision_step(),
                 "{}: write_through_in_next_step: this optimizer does not write its parameters through; copy them "
                 "after step() (optim::multi_tensor_copy)",
                 name_);
  COLOSSAL_CHECK(params.size() == copies.size(), "{}: write_through_in_next_step: {} copies for {} parameters", name_,
                 copies.size(), params.size());
  std::unordered_map<const core::TensorImpl*, std::pair<size_t, size_t>> where;  // parameter -> (group, index)
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) where.emplace(groups_[g].params[i].impl(), std::pair{g, i});
  }
  std::unordered_map<const core::TensorImpl*, Tensor> mapping;
  for (size_t k = 0; k < params.size(); ++k) {
    COLOSSAL_CHECK(params[k].defined(), "{}: write_through_in_next_step: parameter {} of the list is undefined", name_,
                   k);
    const auto it = where.find(params[k].impl());
    COLOSSAL_CHECK(it != where.end(),
                   "{}: write_through_in_next_step: tensor {} of the list (shape {}) is not a parameter of this "
                   "optimizer",
                   name_, k, params[k].shape());
    const auto [g, i] = it->second;
    const Tensor& p = groups_[g].params[i];
    const Tensor& copy = copies[k];
    const auto label = [&] {
      return fmt::format("{}: write_through_in_next_step: param group {}: parameter {}", name_, g,
                         groups_[g].param_label(i));
    };
    COLOSSAL_CHECK(copy.defined(), "{}: its copy is undefined", label());
    COLOSSAL_CHECK(copy.shape() == p.shape(), "{} has shape {} but its copy has shape {}", label(), p.shape(),
                   copy.shape());
    COLOSSAL_CHECK(copy.device() == p.device(), "{} is on {} but its copy is on {}", label(), p.device(),
                   copy.device());
    COLOSSAL_CHECK(copy.dtype() == DType::f32 || core::is_reduced_float(copy.dtype()),
                   "{}: its copy is {}; a copy must be f32, bf16 or f16", label(), copy.dtype());
    COLOSSAL_CHECK(!copy.is_same(p), "{}: its copy is the parameter itself", label());
    mapping.insert_or_assign(params[k].impl(), copy);
  }
  write_through_ = std::move(mapping);
}

void Optimizer::apply_grad_scale_in_place() {
  if (!grad_scale_.defined()) return;
  std::vector<Tensor> grads;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      if (Tensor grad = p.grad(); grad.defined()) grads.push_back(grad);
    }
  }
  scale_(grads, grad_scale_);
  grad_scale_ = Tensor();
}

void Optimizer::step_next_in_parts(std::vector<std::vector<Tensor>> parts, std::function<void(size_t)> after_part) {
  // This optimizer's parameters as (group, index), named only in an error (the Engine calls this
  // every step).
  std::unordered_map<const core::TensorImpl*, std::pair<size_t, size_t>> where;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) where.emplace(groups_[g].params[i].impl(), std::pair{g, i});
  }
  std::unordered_map<const core::TensorImpl*, size_t> part_of;
  for (size_t part = 0; part < parts.size(); ++part) {
    for (size_t k = 0; k < parts[part].size(); ++k) {
      const Tensor& param = parts[part][k];
      const auto found = param.defined() ? where.find(param.impl()) : where.end();
      COLOSSAL_CHECK(found != where.end(),
                     "{}: step_next_in_parts: tensor {} of part {} is not a parameter of this optimizer", name_, k,
                     part);
      const auto [it, inserted] = part_of.emplace(param.impl(), part);
      const auto [g, i] = found->second;
      COLOSSAL_CHECK(inserted, "{}: step_next_in_parts: param group {}: parameter {} is in part {} and in part {}",
                     name_, g, groups_[g].param_label(i), it->second, part);
    }
  }
  part_of_ = std::move(part_of);
  num_parts_ = parts.size();
  after_part_ = std::move(after_part);
}

void Optimizer::step() {
  if (num_parts_ == 0) {
    update_parameters();
    return;
  }
  const auto part_of = std::exchange(part_of_, {});
  const size_t num_parts = std::exchange(num_parts_, 0);
  const auto after_part = std::exchange(after_part_, {});
  // Every gradient, set aside while the other parts step and put back after; the hand-overs of this
  // step, armed again for each part.
  struct Held {
    Tensor param, grad;
    size_t part;
  };
  std::vector<Held> held;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      Tensor& param = groups_[g].params[i];
      Tensor grad = param.grad();
      if (!grad.defined()) continue;
      const auto it = part_of.find(param.impl());
      COLOSSAL_CHECK(it != part_of.end(),
                     "{}: step in parts: param group {}: parameter {} has a gradient but is in no part of "
                     "step_next_in_parts",
                     name_, g, groups_[g].param_label(i));
      held.push_back(Held{param, grad, it->second});
    }
  }
  const Tensor grad_scale = grad_scale_;
  const double grad_unscale = grad_unscale_;
  const auto write_through = write_through_;
  auto put_back = [&] {
    for (Held& h : held) h.param.set_grad(h.grad);
  };
  try {
    for (size_t part = 0; part < num_parts; ++part) {
      for (Held& h : held) h.param.set_grad(h.part == part ? h.grad : Tensor());
      grad_scale_ = grad_scale;
      grad_unscale_ = grad_unscale;
      write_through_ = write_through;
      update_parameters();
      if (after_part) after_part(part);
    }
  } catch (...) {
    put_back();
    take_grad_scale();
    throw;
  }
  put_back();
  take_grad_scale();
}

void Optimizer::zero_grad(bool set_to_none) {
  take_grad_scale();
  part_of_.clear();
  num_parts_ = 0;
  after_part_ = nullptr;
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) {
      if (set_to_none) {
        p.set_grad(Tensor());
      } else if (Tensor grad = p.grad(); grad.defined()) {
        grad.zero_();
      }
    }
  }
}

ParamState& Optimizer::state(size_t group, size_t param) {
  COLOSSAL_CHECK(group < groups_.size(), "{}: param group {} out of range [0, {})", name_, group, groups_.size());
  COLOSSAL_CHECK(param < groups_[group].params.size(), "{}parameter index {} out of range [0, {})",
                 group_context(group), param, groups_[group].params.size());
  if (state_.size() < groups_.size()) state_.resize(groups_.size());
  auto& group_state = state_[group];
  if (group_state.size() < groups_[group].params.size()) group_state.resize(groups_[group].params.size());
  return group_state[param];
}

const ParamState* Optimizer::find_state(size_t group, size_t param) const {
  if (group >= state_.size() || param >= state_[group].size()) return nullptr;
  const ParamState& s = state_[group][param];
  return s.step == 0 && s.buffers.empty() ? nullptr : &s;
}

std::vector<MultiTensorLists> Optimizer::gather_for_update(size_t group_index,
                                                           const std::vector<std::string>& buffer_names) {
  const ParamGroup& group = groups_[group_index];
  std::vector<MultiTensorLists> buckets;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    COLOSSAL_CHECK(grad.shape() == p.shape(), "{}parameter {} has shape {} but its gradient has shape {}",
                   group_context(group_index), group.param_label(i), p.shape(), grad.shape());
    COLOSSAL_CHECK(grad.device() == p.device(), "{}parameter {} is on {} but its gradient is on {}",
                   group_context(group_index), group.param_label(i), p.device(), grad.device());
    // A 16-bit gradient of an f32 parameter is what mixed precision hands over unconverted (Note
    // [Fused mixed-precision step]); optimizers without that support keep their promoting
    // reference loop for mismatched dtypes, as before.
    COLOSSAL_CHECK(!supports_mixed_precision_step() || p.dtype() != DType::f32 || grad.dtype() == DType::f32 ||
                       core::is_reduced_float(grad.dtype()),
                   "{}parameter {} is f32 but its gradient is {}; an f32 parameter's gradient must be f32, bf16 or f16",
                   group_context(group_index), group.param_label(i), grad.dtype());
    auto bucket = std::find_if(buckets.begin(), buckets.end(), [&](const auto& b) { return b.device == p.device(); });
    if (bucket == buckets.end()) {
      MultiTensorLists lists;
      lists.device = p.device();
      lists.state.resize(buffer_names.size());
      buckets.push_back(std::move(lists));
      bucket = buckets.end() - 1;
    }
    ParamState& s = state(group_index, i);
    bool created = false;
    for (size_t k = 0; k < buffer_names.size(); ++k) {
      auto [it, inserted] = s.buffers.try_emplace(buffer_names[k]);
      if (inserted) it->second = core::zeros_like(p);
      created = created || inserted;
      bucket->state[k].push_back(it->second);
    }
    s.step += 1;
    bucket->params.push_back(p);
    bucket->grads.push_back(grad);
    bucket->steps.push_back(s.step);
    bucket->buffers_created.push_back(created ? 1 : 0);
    if (!write_through_.empty()) {
      // Index-aligned with params once any parameter of the bucket has a copy.
      const auto it = write_through_.find(p.impl());
      if (it != write_through_.end() && bucket->write_through.size() + 1 < bucket->params.size()) {
        bucket->write_through.resize(bucket->params.size() - 1);
      }
      if (it != write_through_.end() || !bucket->write_through.empty()) {
        bucket->write_through.push_back(it != write_through_.end() ? it->second : Tensor());
      }
    }
  }
  for (MultiTensorLists& lists : buckets) {
    lists.grad_unscale = grad_unscale_;
    if (!grad_scale_.defined()) continue;
    lists.grad_scale = grad_scale_.device() == lists.device ? grad_scale_ : grad_scale_.to(lists.device);
  }
  return buckets;
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  int64_t global = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    std::vector<int64_t> indices;
    for (size_t i = 0; i < group.params.size(); ++i, ++global) {
      indices.push_back(global);
      const ParamState* s = find_state(g, i);
      if (s == nullptr) continue;
      out[fmt::format("state.{}.step", global)] = core::scalar_tensor(static_cast<double>(s->step), DType::i64);
      for (const auto& [name, buffer] : s->buffers) out[fmt::format("state.{}.{}", global, name)] = buffer.detach();
    }
    out[fmt::format("param_groups.{}.params", g)] =
        core::from_vector(indices, {static_cast<int64_t>(indices.size())}, DType::i64);
    for (const auto& [key, value] : group.options) {
      out[fmt::format("param_groups.{}.{}", g, key)] = core::scalar_tensor(value, DType::f64);
    }
  }
  return out;
}

namespace {

/// Splits "a.b.c" into its three parts; returns false when the key has another form.
bool split_key(const std::string& key, std::string_view& head, std::string_view& index, std::string_view& tail) {
  const size_t first = key.find('.');
  if (first == std::string::npos) return false;
  const size_t second = key.find('.', first + 1);
  if (second == std::string::npos) return false;
  const std::string_view view(key);
  head = view.substr(0, first);
  index = view.substr(first + 1, second - first - 1);
  tail = view.substr(second + 1);
  return !index.empty() && index.size() <= 18 && !tail.empty() &&
         std::all_of(index.begin(), index.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

void Optimizer::load_state_dict(const StateDict& state_dict) {
  const std::string context = fmt::format("{}: load_state_dict: ", name_);
  // Where each global parameter index lives.
  std::vector<std::pair<size_t, size_t>> locations;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) locations.emplace_back(g, i);
  }

  std::vector<std::map<std::string, double>> new_options(groups_.size());
  std::vector<bool> saw_params(groups_.size(), false);
  std::map<size_t, ParamState> new_state;  // by global index
  for (const auto& [key, tensor] : state_dict) {
    std::string_view head, index_text, tail;
    COLOSSAL_CHECK(split_key(key, head, index_text, tail) && (head == "state" || head == "param_groups"),
                   "{}unexpected key '{}'; keys have the form state.<i>.<name> or param_groups.<g>.<option>", context,
                   key);
    COLOSSAL_CHECK(tensor.defined(), "{}key '{}' holds an undefined tensor", context, key);
    const size_t index = std::stoull(std::string(index_text));
    const std::string name(tail);
    if (head == "param_groups") {
      COLOSSAL_CHECK(index < groups_.size(), "{}key '{}' names param group {}, but this optimizer has {} group(s)",
                     context, key, index, groups_.size());
      if (name == "params") {
        COLOSSAL_CHECK(tensor.dim() == 1 && tensor.numel() == static_cast<int64_t>(groups_[index].params.size()),
                       "{}param group {} was saved with {} parameter(s) (key '{}', shape {}), but has {} now", context,
                       index, tensor.numel(), key, tensor.shape(), groups_[index].params.size());
        saw_params[index] = true;
        continue;
      }
      COLOSSAL_CHECK(defaults_.contains(name), "{}key '{}' names option '{}', which {} does not have", context, key,
                     name, name_);
      COLOSSAL_CHECK(tensor.numel() == 1, "{}key '{}' must hold one value, got shape {}", context, key, tensor.shape());
      new_options[index][name] = tensor.item<double>();
      continue;
    }
    COLOSSAL_CHECK(index < locations.size(), "{}key '{}' names parameter {}, but this optimizer has {} parameter(s)",
                   context, key, index, locations.size());
    ParamState& s = new_state[index];
    if (name == "step") {
      COLOSSAL_CHECK(tensor.numel() == 1, "{}key '{}' must hold one value, got shape {}", context, key, tensor.shape());
      s.step = tensor.item<int64_t>();
      COLOSSAL_CHECK(s.step >= 0, "{}key '{}' holds step {}; steps are >= 0", context, key, s.step);
      continue;
    }
    const auto [g, i] = locations[index];
    const Tensor& p = groups_[g].params[i];
    COLOSSAL_CHECK(tensor.shape() == p.shape(), "{}key '{}' has shape {}, but parameter {} of group {} has shape {}",
                   context, key, tensor.shape(), groups_[g].param_label(i), g, p.shape());
    Tensor copy = core::empty(p.shape(), TensorOptions(p.dtype(), p.device()));
    copy.copy_(tensor);
    s.buffers[name] = copy;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    COLOSSAL_CHECK(saw_params[g], "{}missing key 'param_groups.{}.params'", context, g);
    for (const auto& [key, value] : defaults_) {
      COLOSSAL_CHECK(new_options[g].contains(key), "{}missing key 'param_groups.{}.{}'", context, g, key);
    }
    ParamGroup candidate = groups_[g];
    candidate.options = new_options[g];
    validate_group(candidate, g);
  }
  for (const auto& [index, s] : new_state) {
    COLOSSAL_CHECK(s.step > 0 || !s.buffers.empty(), "{}state of parameter {} has neither a step nor buffers", context,
                   index);
    COLOSSAL_CHECK(state_dict.contains(fmt::format("state.{}.step", index)), "{}missing key 'state.{}.step'", context,
                   index);
  }

  // Everything checked: commit.
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(new_options[g]);
  state_.assign(groups_.size(), {});
  for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
  for (auto& [index, s] : new_state) {
    const auto [g, i] = locations[index];
    state_[g][i] = std::move(s);
  }
}

bool default_no_weight_decay(const std::string& name, const Tensor& param) {
  if (param.dim() <= 1) return true;
  if (name.ends_with("bias")) return true;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('.', start), name.size());
    std::string component = name.substr(start, end - start);
    std::transform(component.begin(), component.end(), component.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (component.find("norm") != std::string::npos || component.starts_with("ln")) return true;
    start = end + 1;
  }
  return false;
}

std::vector<ParamGroup> make_param_groups(
    const NamedParameters& params, double weight_decay,
    const std::function<bool(const std::string&, const Tensor&)>& no_weight_decay) {
  COLOSSAL_CHECK(weight_decay >= 0.0, "make_param_groups: weight_decay must be >= 0, got {}", weight_decay);
  COLOSSAL_CHECK(no_weight_decay != nullptr, "make_param_groups: no_weight_decay predicate is empty");
  ParamGroup decay, no_decay;
  decay.set("weight_decay", weight_decay);
  no_decay.set("weight_decay", 0.0);
  for (const auto& [name, param] : params) {
    COLOSSAL_CHECK(param.defined(), "make_param_groups: parameter '{}' is an undefined tensor", name);
    if (!param.requires_grad()) continue;
    ParamGroup& target = no_weight_decay(name, param) ? no_decay : decay;
    target.params.push_back(param);
    target.names.push_back(name);
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  ParamGroup group;
  group.params = std::move(params);
  return {std::move(group)};
}

constinit core::DispatchStub<MultiTensorCopyKernel> multi_tensor_copy_stub("multi_tensor_copy");

void multi_tensor_copy(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  COLOSSAL_CHECK(dst.size() == src.size(), "multi_tensor_copy: {} destinations for {} sources", dst.size(), src.size());
  if (dst.empty()) return;
  const Device device = dst.front().device();
  for (size_t i = 0; i < dst.size(); ++i) {
    COLOSSAL_CHECK(dst[i].defined() && src[i].defined(), "multi_tensor_copy: tensor {} is undefined", i);
    COLOSSAL_CHECK(dst[i].device() == device && src[i].device() == device,
                   "multi_tensor_copy: tensor {} is on {} (destination) and {} (source), expected both on {}", i,
                   dst[i].device(), src[i].device(), device);
    COLOSSAL_CHECK(dst[i].shape() == src[i].shape(),
                   "multi_tensor_copy: tensor {}: destination {} and source {} differ", i, dst[i].shape(),
                   src[i].shape());
  }
  std::vector<Tensor> fused_dst, fused_src;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].numel() == 0) continue;
    if (multi_tensor_copy_stub.supports(device.type) && dst[i].is_contiguous() && src[i].is_contiguous()) {
      fused_dst.push_back(dst[i]);
      fused_src.push_back(src[i]);
    } else {
      core::copy_stub(device, dst[i], src[i]);  // any strides
    }
  }
  if (!fused_dst.empty()) multi_tensor_copy_stub(device, fused_dst, fused_src);
}

}  // namespace colossal::optim
