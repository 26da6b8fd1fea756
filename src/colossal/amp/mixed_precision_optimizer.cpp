// MixedPrecisionOptimizer: see mixed_precision_optimizer.h. The step follows Colossal-AI's
// FP16Optimizer.step (colossalai/amp/naive_amp/_fp16_optimizer.py): gradients to the fp32 masters,
// unscale, overflow check all-reduced (max) over the data- and model-parallel groups, scaler update,
// on overflow zero_grad and skip, else clip, step and copy the masters back into the fp16 model.
//
// Note [torch mode without autocast]
// torch.amp's "torch" mode is two things: autocast, which runs matmul / linear / conv in fp16 from
// fp32 parameters (and softmax, norms and losses in fp32) by casting at each op, and GradScaler. The
// autocast half is ops::AutocastGuard (ops/autocast.h), which the caller holds around the forward
// (the Engine does in torch mode); this class is the GradScaler half: the loss is scaled, the fp32
// gradients are unscaled in place, a step with inf/NaN gradients is skipped and the scale follows
// torch's rule. Without a guard around the forward, torch mode trains exactly as fp32 does (with a
// power-of-two scale, bit for bit, since scaling by 2^k commutes with rounding).
#include "colossal/amp/mixed_precision_optimizer.h"

#include <cmath>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "colossal/autograd/engine.h"     // backward
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/profiler.h"       // Scope
#include "colossal/ops/elementwise.h"     // mul, mul_, add
#include "colossal/ops/reduction.h"       // sum
#include "colossal/optim/clip_grad.h"     // sum_of_squares, total_grad_norm, clip_coefficient

namespace colossal::amp {
namespace {

constexpr const char* kScalerPrefix = "scaler.";
constexpr const char* kMasterPrefix = "master.";

std::string_view mode_name(AmpMode mode) {
  switch (mode) {
    case AmpMode::torch:
      return "torch";
    case AmpMode::naive:
      return "naive";
    case AmpMode::bf16:
      return "bf16";
  }
  return "?";
}

}  // namespace

AmpOptions AmpOptions::for_mode(AmpMode mode) {
  AmpOptions options;
  options.mode = mode;
  options.scaler = mode == AmpMode::torch ? GradScalerOptions::torch_defaults() : GradScalerOptions::naive_defaults();
  return options;
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::shared_ptr<nn::Module> model,
                                                 std::shared_ptr<optim::Optimizer> optimizer, AmpOptions options)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), options_(options) {
  COLOSSAL_CHECK(model_ != nullptr, "MixedPrecisionOptimizer needs a model");
  COLOSSAL_CHECK(optimizer_ != nullptr, "MixedPrecisionOptimizer needs an optimizer");
  if (options_.mode != AmpMode::bf16) scaler_.emplace(options_.scaler);

  std::unordered_map<const core::TensorImpl*, std::string> model_names;
  for (const auto& [name, param] : model_->named_parameters()) model_names.emplace(param.impl(), name);
  struct Slot {
    size_t group;
    size_t index;
  };
  std::vector<Slot> slots;
  std::vector<Tensor> old_params;
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& param = groups[g].params[i];
      const auto it = model_names.find(param.impl());
      COLOSSAL_CHECK(it != model_names.end(),
                     "MixedPrecisionOptimizer ({}): {} param group {}: parameter {} is not a parameter of the model; "
                     "build the optimizer over model.named_parameters() (after model.to(device)), then wrap it",
                     mode_name(options_.mode), optimizer_->name(), g, groups[g].param_label(i));
      COLOSSAL_CHECK(param.dtype() == DType::f32,
                     "MixedPrecisionOptimizer ({}): parameter '{}' is {}; build the model in f32 (the wrapper "
                     "converts it to {} and keeps f32 master weights)",
                     mode_name(options_.mode), it->second, param.dtype(), compute_dtype());
      names_.push_back(it->second);
      slots.push_back({g, i});
      old_params.push_back(param);
    }
  }

  if (options_.mode == AmpMode::torch) {
    model_params_ = old_params;
    master_params_ = old_params;
    return;
  }
  // Module::to puts converted tensors into the model's slots and leaves the f32 tensors the optimizer
  // holds alone; those become the masters (detached: no autograd history, hooks or stale gradient).
  model_->to(compute_dtype());
  for (size_t k = 0; k < names_.size(); ++k) {
    model_params_.push_back(model_->parameter(names_[k]));
    // Note [Masters on the host]
    // A 10B-parameter model is 40 GB in f32 and 20 GB in bf16: built on the GPU and converted, both
    // sit there until ZeRO-3 packs the 16-bit one into chunks, another 20 GB, which an 80 GB GPU does
    // not hold. With masters_on_host each master goes to host memory as it is made, and the device
    // f32 tensor is freed once the optimizer's slot below and old_params no longer hold it (at the
    // end of this constructor), so the GPU's peak is the f32 model and its 16-bit copy once.
    Tensor master = options_.masters_on_host ? old_params[k].detach().to(Device{}) : old_params[k].detach();
    master.autograd_meta().name = names_[k];
    master_params_.push_back(master);
    groups[slots[k].group].params[slots[k].index] = master;
  }
}

DType MixedPrecisionOptimizer::compute_dtype() const {
  switch (options_.mode) {
    case AmpMode::naive:
      return DType::f16;
    case AmpMode::bf16:
      return DType::bf16;
    case AmpMode::torch:
      break;
  }
  return DType::f32;
}

Tensor MixedPrecisionOptimizer::cast_input(const Tensor& input) const {
  if (options_.mode == AmpMode::torch || !input.defined() || !core::is_floating(input.dtype()) ||
      input.dtype() == compute_dtype()) {
    return input;
  }
  return input.to(compute_dtype());
}

Tensor MixedPrecisionOptimizer::cast_output(const Tensor& output) const {
  if (!options_.output_to_f32 || !output.defined() || !core::is_reduced_float(output.dtype())) return output;
  return output.to(DType::f32);
}

Tensor MixedPrecisionOptimizer::scale_loss(const Tensor& loss) const {
  COLOSSAL_CHECK(loss.defined(), "MixedPrecisionOptimizer::scale_loss: undefined loss");
  if (!scaler_) return loss;
  const Tensor wide = core::is_reduced_float(loss.dtype()) ? loss.to(DType::f32) : loss;
  return ops::mul(wide, scaler_->scale());
}

void MixedPrecisionOptimizer::backward(const Tensor& loss) {
  autograd::backward(scale_loss(loss));
}

Tensor MixedPrecisionOptimizer::unscale_and_sum_squares(double inv_scale) const {
  // The squares are taken in f64 (no square overflows), so the sum is inf or NaN exactly when some
  // element is: the overflow check, with the L2 norm's work done on the way (Note [Clipping in one
  // pass] in optim/clip_grad.cpp).
  std::vector<Tensor> grads;
  for (const Tensor& master : master_params_) {
    if (Tensor grad = master.grad(); grad.defined() && grad.numel() > 0) grads.push_back(grad);
  }
  return optim::sum_of_squares(grads, inv_scale);
}

// Note [Fused mixed-precision step]
// The three-pass step of naive and bf16 copies every 16-bit gradient into a new f32 gradient (2
// bytes read, 4 written per parameter), steps the f32 masters (AdamW reads g, p, m, v and writes p,
// m, v: 16 + 12) and copies them back into the 16-bit model (4 + 2): 40 bytes per parameter, and
// naive's in-place unscale of the f32 gradients 8 more. An optimizer that
// supports_mixed_precision_step() (Adam, AdamW) does it all in its one update pass: it reads the
// 16-bit gradient, converting it as it reads it, and writes each updated master into its model
// parameter as well ("write-through"): 2 + 12 read, 12 + 2 written, 28 bytes per parameter (AMSGrad
// adds 8 to both), naive's overflow check 2 more, and no f32 gradient is allocated. The masters'
// .grad are then the model's 16-bit gradients themselves (moved, not copied), which the overflow
// check and clipping's norm read.
//
// The fused step gives the three-pass step's bits exactly:
// - a 16-bit number converts to f32 exactly, so the update reads the same gradient;
// - the fp16 unscale (1 / loss scale) is applied by the update as its first operation, rounded as
//   optim::sum_of_squares rounded it in place (Optimizer::unscale_gradients_in_next_step), and
//   clipping's factor after it as before;
// - the write-through rounds to nearest even as multi_tensor_copy does (the same instruction on
//   CUDA, the same copy on the CPU);
// - the overflow check and clipping's norm take their sums of squares from the 16-bit gradients:
//   the same values in f64, added in the same order (Note [Sums of squares in one order] in
//   optim/cuda/clip_grad_kernels.cu), so bf16's norm is the same bits. Under naive fp16 the
//   gradients carry the loss scale S: the norm of the scaled gradients times 1 / S is the norm of
//   the unscaled ones exactly when 1 / S is a power of two (the scaler's default factors keep it
//   one) and the norm is the 1-, 2- or inf-norm (every operation on the way — squares, sums, maxima,
//   square roots — commutes with a power of two; a general p-th power does not). A clipped naive
//   step with another scale or norm, like any step the fused path cannot take, takes the three
//   passes, step by step.
// The fused path is taken where the optimizer supports it, the masters are on the model's device
// (not masters_on_host) and the step is the inner optimizer's (not ZeRO's offloaded host step,
// set_optimizer_step); the 16-bit gradients must be contiguous, as the f32 copies were, for the
// sums above to run in the same order. Under ZeRO (shard_masters) the shard's gradient is made by
// the handler: f32 under naive fp16, unscaled in place as before, and under bf16 the reduced bf16
// shard as it is, which the update converts as it reads it (Note [Shard gradient dtype] in
// parallel/zero/state_pieces.cpp); the write-through into the model's slice (or ZeRO-3's target) is
// fused either way, which saves the copy out (6 bytes per element of the shard). A master that gets no gradient is
// neither stepped nor written: its model parameter holds its rounding already, as the three-pass copy would have
// rewritten it.

bool MixedPrecisionOptimizer::can_fuse_step(std::optional<double> max_norm, double norm_type) const {
  if (options_.mode == AmpMode::torch || options_.masters_on_host || optimizer_step_ ||
      !optimizer_->supports_mixed_precision_step()) {
    return false;
  }
  if (scaler_ && !sharded_ && max_norm) {
    int exponent = 0;
    const double inv_scale = scaler_->inv_scale();
    const bool power_of_two = std::frexp(inv_scale, &exponent) == 0.5 && exponent > -100 && exponent < 100;
    if (!power_of_two || !(norm_type == 1.0 || norm_type == 2.0 || std::isinf(norm_type))) return false;
  }
  const std::vector<Tensor> slices = sharded_ ? model_slices() : std::vector<Tensor>();
  const std::vector<Tensor>& targets = sharded_ ? slices : model_params_;
  for (size_t k = 0; k < master_params_.size(); ++k) {
    if (targets[k].device() != master_params_[k].device()) return false;
    if (sharded_) continue;
    const Tensor grad = model_params_[k].grad();
    if (grad.defined() && (!grad.is_contiguous() || grad.dtype() != model_params_[k].dtype())) return false;
  }
  return true;
}

AmpStepResult MixedPrecisionOptimizer::step(std::optional<double> max_norm, double norm_type) {
  autograd::NoGradGuard no_grad;
  AmpStepResult result;
  result.loss_scale = loss_scale();
  const Device device = master_params_.empty() ? Device{} : master_params_.front().device();
  const bool fused = can_fuse_step(max_norm, norm_type);  // Note [Fused mixed-precision step]
  // The fp16 gradients reach the update still scaled, and so do their sums of squares. The scale is
  // this step's, read before the scaler's update below changes it.
  const bool unscale_in_update = fused && scaler_ && !sharded_;
  const double inv_scale = scaler_ ? scaler_->inv_scale() : 1.0;

  if (sharded_) {
    // ZeRO left each shard's reduced f32 gradient in its master's .grad (shard_masters).
    for (Tensor& param : model_params_) {
      if (param.grad().defined()) param.set_grad(Tensor());
    }
  } else if (fused) {
    // The masters take the 16-bit gradients as they are; the update converts them.
    for (size_t k = 0; k < model_params_.size(); ++k) {
      master_params_[k].set_grad(model_params_[k].grad());
      model_params_[k].set_grad(Tensor());
    }
  } else if (options_.mode != AmpMode::torch) {
    core::profiler::Scope scope("update: gradients to f32 masters", device);
    // The masters' f32 gradients are new tensors each step (freed again by zero_grad, so they never
    // sit beside the activations), filled from the 16-bit gradients in one multi-tensor copy.
    std::vector<Tensor> master_grads, model_grads;
    for (size_t k = 0; k < model_params_.size(); ++k) {
      Tensor& param = model_params_[k];
      const Tensor grad = param.grad();
      if (!grad.defined()) {
        master_params_[k].set_grad(Tensor());
        continue;
      }
      Tensor master_grad = core::empty(grad.shape(), TensorOptions(DType::f32, grad.device()));
      master_grads.push_back(master_grad);
      model_grads.push_back(grad);
      master_params_[k].set_grad(master_grad);
      param.set_grad(Tensor());
    }
    optim::multi_tensor_copy(master_grads, model_grads);
  }

  Tensor sum_of_squares;  // of the gradients the norm reads (still scaled where unscale_in_update), from the overflow
                          // check
  if (scaler_) {
    core::profiler::Scope scope(unscale_in_update ? "update: overflow check" : "update: unscale and overflow check",
                                device);
    sum_of_squares = unscale_and_sum_squares(unscale_in_update ? 1.0 : inv_scale);
    const bool local_found_inf = !std::isfinite(sum_of_squares.item<double>());
    const bool found_inf = found_inf_sync_ ? found_inf_sync_(local_found_inf) : local_found_inf;
    scaler_->update(found_inf);
    if (found_inf) {
      zero_grad();
      return result;
    }
  }

  if (max_norm) {
    core::profiler::Scope scope("update: gradient norm", device);
    const Tensor reuse = norm_type == 2.0 ? sum_of_squares : Tensor();
    if (grad_norm_) {
      result.grad_norm = grad_norm_(master_params_, norm_type, reuse);
    } else {
      result.grad_norm = reuse.defined() ? ops::sqrt(reuse) : optim::total_grad_norm(master_params_, norm_type);
    }
    // The norm of the scaled gradients times 1 / scale, a power of two here: exactly the unscaled
    // gradients' norm (Note [Fused mixed-precision step]).
    if (unscale_in_update && inv_scale != 1.0) result.grad_norm = ops::mul(result.grad_norm, inv_scale);
    optimizer_->scale_gradients_in_next_step(optim::clip_coefficient(result.grad_norm, *max_norm));
  }
  if (optimizer_step_) {
    // ZeRO's optimizer offload: the host step, which writes the model's parameters itself.
    optimizer_step_();
    result.stepped = true;
    return result;
  }
  {
    core::profiler::Scope scope("update: optimizer step", device);
    if (fused) {
      if (unscale_in_update && inv_scale != 1.0) optimizer_->unscale_gradients_in_next_step(inv_scale);
      optimizer_->write_through_in_next_step(master_params_, sharded_ ? model_slices() : model_params_);
    }
    optimizer_->step();
  }
  if (options_.mode != AmpMode::torch && !fused) {
    core::profiler::Scope scope("update: masters to the model", device);
    optim::multi_tensor_copy(sharded_ ? model_slices() : model_params_, master_params_);
  }
  result.stepped = true;
  return result;
}

void MixedPrecisionOptimizer::shard_masters(std::vector<Tensor> shards, std::vector<int64_t> begins,
                                            std::vector<Tensor> targets) {
  COLOSSAL_CHECK(!sharded_, "MixedPrecisionOptimizer::shard_masters: the masters are sharded already");
  COLOSSAL_CHECK(shards.size() == master_params_.size() && begins.size() == master_params_.size(),
                 "MixedPrecisionOptimizer::shard_masters: {} shards and {} offsets for {} masters", shards.size(),
                 begins.size(), master_params_.size());
  std::unordered_map<const core::TensorImpl*, size_t> index;
  for (size_t k = 0; k < master_params_.size(); ++k) {
    const Tensor& shard = shards[k];
    COLOSSAL_CHECK(shard.defined() && shard.dim() == 1 && shard.dtype() == DType::f32 && begins[k] >= 0 &&
                       begins[k] + shard.numel() <= model_params_[k].numel(),
                   "MixedPrecisionOptimizer::shard_masters: the shard of '{}' must be 1-D f32 elements within the "
                   "parameter's {}, got {} {} from element {}",
                   names_[k], model_params_[k].numel(), shard.dtype(), shard.shape(), begins[k]);
    index.emplace(master_params_[k].impl(), k);
  }
  for (size_t g = 0; g < optimizer_->param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer_->param_groups()[g].params.size(); ++i) {
      COLOSSAL_CHECK(optimizer_->find_state(g, i) == nullptr || optimizer_->find_state(g, i)->buffers.empty(),
                     "MixedPrecisionOptimizer::shard_masters: the {} optimizer has state already; shard before the "
                     "first step or load",
                     optimizer_->name());
      Tensor& param = optimizer_->param_groups()[g].params[i];
      const auto it = index.find(param.impl());
      COLOSSAL_CHECK(it != index.end(),
                     "MixedPrecisionOptimizer::shard_masters: param group {} holds {} that is no master", g,
                     optimizer_->param_groups()[g].param_label(i));
      param = shards[it->second];
    }
  }
  COLOSSAL_CHECK(targets.empty() || targets.size() == shards.size(),
                 "MixedPrecisionOptimizer::shard_masters: {} write-back targets for {} shards", targets.size(),
                 shards.size());
  for (size_t k = 0; k < targets.size(); ++k) {
    COLOSSAL_CHECK(targets[k].numel() == shards[k].numel() && targets[k].dtype() == model_params_[k].dtype(),
                   "MixedPrecisionOptimizer::shard_masters: the write-back target of '{}' must hold {} {} elements, "
                   "got {} {}",
                   names_[k], shards[k].numel(), model_params_[k].dtype(), targets[k].numel(), targets[k].dtype());
  }
  for (size_t k = 0; k < shards.size(); ++k) shards[k].autograd_meta().name = names_[k];
  shard_targets_ = std::move(targets);
  master_params_ = std::move(shards);
  shard_begins_ = std::move(begins);
  sharded_ = true;
}

std::vector<Tensor> MixedPrecisionOptimizer::model_slices() const {
  if (!shard_targets_.empty()) return shard_targets_;
  std::vector<Tensor> slices;
  slices.reserve(model_params_.size());
  for (size_t k = 0; k < model_params_.size(); ++k) {
    slices.push_back(model_params_[k].detach().view({-1}).narrow(0, shard_begins_[k], master_params_[k].numel()));
  }
  return slices;
}

void MixedPrecisionOptimizer::zero_grad() {
  for (Tensor& param : model_params_) {
    if (param.grad().defined()) param.set_grad(Tensor());
  }
  for (Tensor& master : master_params_) {
    if (master.grad().defined()) master.set_grad(Tensor());
  }
}

optim::StateDict MixedPrecisionOptimizer::state_dict() const {
  optim::StateDict state;
  if (scaler_) {
    for (const auto& [key, value] : scaler_->state_dict()) state.emplace(kScalerPrefix + key, value);
  }
  if (options_.mode != AmpMode::torch) {
    for (size_t k = 0; k < names_.size(); ++k) state.emplace(kMasterPrefix + names_[k], master_params_[k].detach());
  }
  return state;
}

void MixedPrecisionOptimizer::load_state_dict(const optim::StateDict& state) {
  const std::string context = fmt::format("MixedPrecisionOptimizer ({})::load_state_dict", mode_name(options_.mode));
  optim::StateDict scaler_state;
  std::unordered_map<std::string, Tensor> masters;
  for (const auto& [key, value] : state) {
    if (scaler_ && key.starts_with(kScalerPrefix)) {
      scaler_state.emplace(key.substr(std::string_view(kScalerPrefix).size()), value);
    } else if (options_.mode != AmpMode::torch && key.starts_with(kMasterPrefix)) {
      masters.emplace(key.substr(std::string_view(kMasterPrefix).size()), value);
    } else {
      COLOSSAL_FAIL("{}: unexpected key '{}' (a {} wrapper stores {})", context, key, mode_name(options_.mode),
                    options_.mode == AmpMode::torch  ? "scaler.*"
                    : options_.mode == AmpMode::bf16 ? "master.*"
                                                     : "scaler.* and master.*");
    }
  }
  // Check everything before changing anything.
  if (options_.mode != AmpMode::torch) {
    for (const auto& [name, value] : masters) {
      bool known = false;
      for (const std::string& n : names_) known = known || n == name;
      COLOSSAL_CHECK(known, "{}: unexpected key '{}{}': the optimizer has no such parameter", context, kMasterPrefix,
                     name);
    }
    for (size_t k = 0; k < names_.size(); ++k) {
      const auto it = masters.find(names_[k]);
      COLOSSAL_CHECK(it != masters.end(), "{}: key '{}{}' is missing", context, kMasterPrefix, names_[k]);
      COLOSSAL_CHECK(it->second.defined() && it->second.shape() == master_params_[k].shape(),
                     "{}: '{}{}' has shape {} but the parameter has shape {}", context, kMasterPrefix, names_[k],
                     it->second.defined() ? it->second.shape() : Shape{}, master_params_[k].shape());
    }
  }
  if (scaler_) {
    const optim::StateDict expected = scaler_->state_dict();
    for (const auto& [key, value] : expected) {
      COLOSSAL_CHECK(scaler_state.contains(key), "{}: key '{}{}' is missing", context, kScalerPrefix, key);
    }
    for (const auto& [key, value] : scaler_state) {
      COLOSSAL_CHECK(expected.contains(key), "{}: unexpected key '{}{}'", context, kScalerPrefix, key);
    }
    DynamicGradScaler restored(scaler_->options());
    restored.load_state_dict(scaler_state);  // throws naming the scaler key, before anything changes
    *scaler_ = restored;
  }
  if (options_.mode != AmpMode::torch) {
    autograd::NoGradGuard no_grad;
    const std::vector<Tensor> targets = sharded_ ? model_slices() : model_params_;
    for (size_t k = 0; k < names_.size(); ++k) {
      master_params_[k].copy_(masters.at(names_[k]));
      targets[k].copy_(master_params_[k]);
    }
  }
}

}  // namespace colossal::amp
