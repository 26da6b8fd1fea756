// Optimizer: the base every optimizer (SGD, Adam, AdamW, LAMB, LARS) derives from. It holds the
// parameter groups and their hyper-parameters, the per-parameter state, zero_grad, and a flat
// state_dict the checkpoint code saves; make_param_groups builds the usual decay / no-decay split.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::optim {

/// Named tensors in a fixed (sorted) order: what state_dict() returns and a checkpoint stores.
using StateDict = std::map<std::string, Tensor>;
/// (name, parameter) pairs in model order, as a module's named_parameters() yields them.
using NamedParameters = std::vector<std::pair<std::string, Tensor>>;

/// Parameters that share hyper-parameters. `options` maps a hyper-parameter's name to its value
/// (booleans as 0 / 1): "lr", "weight_decay" and the optimizer's own keys ("momentum", "beta1",
/// ...). A key left out takes the optimizer's default when the group is handed to it, so a group
/// can override just what differs, as a dict in torch.optim's param_groups does. Schedulers write
/// "lr" here.
struct ParamGroup {
  std::vector<Tensor> params;
  /// Empty, or one name per parameter (used in error messages and nothing else).
  std::vector<std::string> names;
  std::map<std::string, double> options;

  /// The value of `key`; throws naming the key and the keys this group has.
  double get(const std::string& key) const;
  bool has(const std::string& key) const { return options.contains(key); }
  void set(const std::string& key, double value) { options[key] = value; }
  double lr() const { return get("lr"); }
  void set_lr(double lr) { set("lr", lr); }
  double weight_decay() const { return get("weight_decay"); }
  /// "'fc1.weight'" when the group carries names, else "#3" (the index within the group).
  std::string param_label(size_t index) const;
};

/// The state an optimizer keeps for one parameter: how many updates it has had and its buffers
/// (momentum, moment estimates) by name.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};

/// The tensors of one update on one device, index-aligned: params[i] is updated from grads[i] and
/// its state buffers state[k][i] (k in the optimizer's buffer order), after steps[i] updates
/// counting this one. Optimizers hand these to a multi-tensor kernel stub so a backend (the fused
/// CUDA path) can replace the per-tensor reference loop. See Note [Multi-tensor optimizer kernels].
struct MultiTensorLists {
  Device device;
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
  std::vector<std::vector<Tensor>> state;
  std::vector<int64_t> steps;
  /// 1 where this update created the parameter's buffers (they hold zeros): SGD and LARS start
  /// their momentum buffer from the gradient itself then, as torch.optim.SGD does.
  std::vector<uint8_t> buffers_created;
  /// Undefined, or a 0-d f64 tensor on `device` every gradient is multiplied by (optim::scale_for
  /// its dtype, the product rounded to it) before the update uses it, .grad itself left as it is (clipping's factor:
  /// see Optimizer::scale_gradients_in_next_step). Only optimizers whose kernels take it set it.
  Tensor grad_scale;
  /// Multiplies every gradient before grad_scale does, in the same way (the factor rounded to the
  /// accumulation type, the product to the parameter's dtype): the fp16 loss scale's unscale
  /// (Optimizer::unscale_gradients_in_next_step). 1: none. Only with supports_mixed_precision_step().
  double grad_unscale = 1.0;
  /// Empty, or one tensor per parameter, undefined where there is none: params[i] once updated is
  /// also written into write_through[i] (same shape and device), rounded to nearest even as
  /// multi_tensor_copy rounds: the 16-bit model parameter of an f32 master (see
  /// Optimizer::write_through_in_next_step). Only with supports_mixed_precision_step().
  std::vector<Tensor> write_through;
};

/// Runs one update of `lists` through `stub`'s kernel for their device when a backend registered
/// one, else through `reference` (the per-tensor loop built from in-place ops).
template <class Fn, class... Args>
void run_multi_tensor(const core::DispatchStub<Fn>& stub, Fn* reference, const MultiTensorLists& lists,
                      const Args&... args) {
  if (lists.params.empty()) return;
  if (stub.supports(lists.device.type)) {
    stub(lists.device, lists, args...);
  } else {
    reference(lists, args...);
  }
}

/// dst[i] <- src[i] for index-aligned lists of tensors of equal shapes on one device, converting
/// dtypes (round to nearest even): mixed precision's copies of 16-bit gradients into f32 and f32
/// master weights into the 16-bit model. On CUDA the contiguous pairs go in one multi-tensor launch
/// per dtype pair (a GPT-2-sized list: 148 tensors) instead of one copy per tensor; other pairs,
/// and every pair elsewhere, are copied one by one.
void multi_tensor_copy(const std::vector<Tensor>& dst, const std::vector<Tensor>& src);
using MultiTensorCopyKernel = void(const std::vector<Tensor>& dst, const std::vector<Tensor>& src);
extern core::DispatchStub<MultiTensorCopyKernel> multi_tensor_copy_stub;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient (the others are skipped and keep their
  /// step count). Runs without autograd recording. After step_next_in_parts, in those parts.
  void step();
  /// For the next step() only: the parameters are updated part by part, in the order of `parts`
  /// (each a list of this optimizer's parameters), and `after_part(i)` is called once part i's
  /// update is issued: the Engine records an event there, so that the next forward waits for each
  /// part just before it reads it (Note [Update under the next forward] in engine/engine.cpp). The
  /// numbers are those of one step, bit for bit: every update here is per element (Adam's, SGD's)
  /// or per tensor (LAMB's and LARS's trust ratios), and the pending hand-overs (the gradient
  /// scale, the unscale, the write-through) apply to every part. Throws, naming it, when a
  /// parameter is not this optimizer's or is in two parts, or when a parameter with a gradient is
  /// in none (at the step). zero_grad forgets the parts.
  void step_next_in_parts(std::vector<std::vector<Tensor>> parts, std::function<void(size_t part)> after_part);
  /// Drops every gradient (set_to_none) or fills it with zeros, and forgets a pending gradient scale.
  void zero_grad(bool set_to_none = true);

  /// The next step() uses every gradient multiplied by `scale`, a 0-d tensor on the gradients'
  /// device (gradient clipping's min(1, max_norm / norm), which stays on the device: no host sync).
  /// Adam and AdamW multiply inside their fused update, so this costs no pass over the gradients
  /// and leaves .grad unchanged; the other optimizers scale the gradients in place first (one
  /// multi-tensor pass). The scale applies to one step only.
  void scale_gradients_in_next_step(Tensor scale);
  /// The scale scale_gradients_in_next_step set and no step has used (undefined when none), which the
  /// optimizer then forgets: for an update made outside step() (optim/host_optimizer.h's host step
  /// under ZeRO's optimizer offload), which applies it itself.
  Tensor release_grad_scale();

  /// Whether step() takes mixed precision's work into its own pass (Note [Fused mixed-precision
  /// step] in amp/mixed_precision_optimizer.cpp): a bf16 or f16 gradient of an f32 parameter, read
  /// and converted (exactly) by the update itself instead of copied into an f32 gradient first, and
  /// the hand-overs unscale_gradients_in_next_step and write_through_in_next_step. Adam and AdamW
  /// do; SGD, LAMB and LARS do not (amp copies for them, and the hand-overs throw).
  virtual bool supports_mixed_precision_step() const { return false; }
  /// The next step() multiplies every gradient by `factor` before it uses it (rounded as
  /// MultiTensorLists::grad_unscale says), and before the scale of scale_gradients_in_next_step:
  /// the fp16 loss scale's unscale (1 / loss scale), which then needs no pass of its own. .grad is
  /// left as it is. One step only; zero_grad forgets it. Throws unless
  /// supports_mixed_precision_step() and `factor` is finite and positive.
  void unscale_gradients_in_next_step(double factor);
  /// For the next step() only: each of `params` (parameters of this optimizer) that the step
  /// updates is also written into the tensor of `copies` at its index, converted to that tensor's
  /// dtype and rounded to nearest even exactly as multi_tensor_copy would: amp's f32 master into
  /// its 16-bit model parameter (or ZeRO's slice of it), in the update's own pass. A parameter
  /// without a gradient is neither updated nor written. zero_grad forgets the hand-over. Throws
  /// naming the parameter when it is not this optimizer's or its copy differs in shape or device
  /// or is not f32, bf16 or f16, and unless supports_mixed_precision_step().
  void write_through_in_next_step(const std::vector<Tensor>& params, const std::vector<Tensor>& copies);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  /// Appends a group (defaults filled in and validated like the constructor's).
  void add_param_group(ParamGroup group);
  /// "SGD", "Adam", ...: names the optimizer in error messages.
  const std::string& name() const { return name_; }
  /// The defaults a group's missing options take.
  const std::map<std::string, double>& defaults() const { return defaults_; }

  /// State of parameter `param` of group `group` (created empty on first use).
  ParamState& state(size_t group, size_t param);
  const ParamState* find_state(size_t group, size_t param) const;

  /// Flat state: "state.<i>.step" (i64 0-d) and "state.<i>.<buffer>" for every parameter with
  /// state, where i counts parameters across groups in order (as torch's state_dict does);
  /// "param_groups.<g>.params" (i64, the i of each parameter of group g) and
  /// "param_groups.<g>.<option>" (f64 0-d) for every hyper-parameter. The tensors alias the
  /// optimizer's buffers: save them before the next step() or copy them.
  StateDict state_dict() const;
  /// Restores hyper-parameters and state saved by state_dict() of an optimizer of the same kind
  /// over parameters of the same shapes and grouping. Buffers are copied (to each parameter's device
  /// and dtype). Throws naming the first key that is missing, unexpected or of the wrong shape, and
  /// leaves the optimizer unchanged when it does.
  void load_state_dict(const StateDict& state_dict);

 protected:
  /// `defaults` lists every option the optimizer knows, with its default value; a group option
  /// not among them is an error (it is most likely a misspelling). The derived constructor must
  /// call validate_all_groups() once it is fully built.
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults);

  /// One update of every parameter of every group that has a gradient (the optimizer's own kernel);
  /// step() calls it, once or once per part.
  virtual void update_parameters() = 0;

  /// Throws naming the group and the option when a hyper-parameter is out of its valid range.
  /// Called for every group at construction, on add_param_group and load_state_dict, and by
  /// step() implementations before updating (a scheduler or the user may have changed it).
  virtual void validate_group(const ParamGroup& group, size_t group_index) const = 0;
  /// Checks that every param group passes validate_group.
  void validate_all_groups() const;

  /// The parameters of group `group_index` that have a gradient, one bucket per device, with
  /// their state buffers `buffer_names` (created as zeros like the parameter when missing) and
  /// their step counts advanced by one, and the pending hand-overs (grad_scale, grad_unscale,
  /// write_through). Throws naming the parameter if its gradient's shape or device differs from
  /// it, or, where the optimizer supports_mixed_precision_step(), if the gradient of an f32
  /// parameter has a dtype other than f32, bf16 or f16.
  std::vector<MultiTensorLists> gather_for_update(size_t group_index, const std::vector<std::string>& buffer_names);

  /// The scale set by scale_gradients_in_next_step and not yet used (undefined when none). An
  /// optimizer whose kernels take it puts it into its lists' grad_scale and calls
  /// take_grad_scale() when done; the others call apply_grad_scale_in_place() at the start of step().
  const Tensor& pending_grad_scale() const { return grad_scale_; }
  /// Forgets the pending scale and the mixed-precision hand-overs, which the lists carried.
  void take_grad_scale();
  /// Multiplies every gradient in place by the pending scale, if any, and forgets it.
  void apply_grad_scale_in_place();

  /// "SGD: param group 1: " - the prefix of a hyper-parameter error.
  std::string group_context(size_t group_index) const;
  /// Option `key` of `group`, checked: throws "<name>: param group <g>: <key> must be <range>, got
  /// <value>" unless valid(value).
  double checked_option(const ParamGroup& group, size_t group_index, const std::string& key, bool (*valid)(double),
                        const char* range) const;

 private:
  void check_and_fill_group(ParamGroup& group, size_t group_index) const;
  void check_no_duplicate_params() const;

  std::string name_;
  std::map<std::string, double> defaults_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // [group][param], grown on demand
  Tensor grad_scale_;                           // scale_gradients_in_next_step's, until used
  double grad_unscale_ = 1.0;                   // unscale_gradients_in_next_step's, until used
  /// write_through_in_next_step's: parameter -> its copy, until used.
  std::unordered_map<const core::TensorImpl*, Tensor> write_through_;
  /// step_next_in_parts': each parameter's part, and the callback, until the next step().
  std::unordered_map<const core::TensorImpl*, size_t> part_of_;
  size_t num_parts_ = 0;
  std::function<void(size_t)> after_part_;
};

/// The default rule for which parameters skip weight decay (timm's and Colossal-AI's): 0-d and 1-D
/// parameters (biases, norm scales), names ending in "bias", and names with a dotted component
/// that contains "norm" (any case) or starts with "ln" (GPT-2's ln_1, ln_f).
bool default_no_weight_decay(const std::string& name, const Tensor& param);

/// Splits named parameters into a decay group (weight_decay = `weight_decay`) followed by a
/// no-decay group (weight_decay = 0), leaving out an empty group; parameters that do not require
/// grad (frozen) are left out entirely. Other options ("lr", ...) are not set, so they take the
/// optimizer's defaults.
std::vector<ParamGroup> make_param_groups(
    const NamedParameters& params, double weight_decay,
    const std::function<bool(const std::string&, const Tensor&)>& no_weight_decay = default_no_weight_decay);

/// One group holding `params` with no options set (all take the optimizer's defaults).
std::vector<ParamGroup> single_group(std::vector<Tensor> params);

}  // namespace colossal::optim
