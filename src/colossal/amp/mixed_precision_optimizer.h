// MixedPrecisionOptimizer: Colossal-AI's mixed precision modes around any optim::Optimizer, for the
// Engine and hand-written loops: naive fp16 (fp16 model, fp32 master weights, loss scaling with
// hysteresis), bf16 (bf16 model, fp32 master weights) and torch (fp32 model, torch's GradScaler).
// It scales the loss, unscales the gradients into fp32, skips the steps whose gradients overflowed on
// any rank (through an injectable all-reduce of the overflow flag), clips, steps and writes the
// master weights back into the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/grad_scaler.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/optim/optimizer.h"

namespace colossal::amp {

/// The precision policy (config: fp16.mode = "torch" | "naive", bf16 = true).
enum class AmpMode {
  /// fp32 parameters stepped by the optimizer itself; the loss is scaled by a DynamicGradScaler
  /// (torch rule) and steps with inf/NaN gradients are skipped, as torch.amp.GradScaler. Autocast is
  /// the caller's ops::AutocastGuard(f16) around the forward (the Engine holds one); see Note [torch
  /// mode without autocast].
  torch,
  /// Colossal-AI's AMP_TYPE.NAIVE: the model is converted to fp16 (parameters and buffers, like
  /// model.half()), the optimizer steps fp32 master copies, and the loss is scaled by a
  /// DynamicGradScaler (hysteresis rule).
  naive,
  /// Colossal-AI's bf16 precision: the model in bf16, fp32 master weights, no loss scaling and no
  /// overflow check (bf16 has f32's exponent range; Colossal-AI's BF16MixedPrecisionMixin never skips).
  bf16,
};

struct AmpOptions {
  AmpMode mode = AmpMode::naive;
  /// The loss scale of the fp16 modes (ignored by bf16). for_mode() fills in the mode's defaults.
  GradScalerOptions scaler = GradScalerOptions::naive_defaults();
  /// naive and bf16: the model's 16-bit output reaches the criterion converted to f32
  /// (NaiveAMPModel's output_to_fp32). false hands it over as it is, for a criterion that computes
  /// in f32 from 16-bit inputs itself: ops::cross_entropy with class targets returns the same f32
  /// loss either way (the conversion is exact) and its 16-bit gradient gets one rounding either
  /// way, so this only drops the f32 copy of the logits and of their gradient (for GPT-2 at B16
  /// T1024: 3.3 GB each, ~1.7 ms each on an H100).
  bool output_to_f32 = true;
  /// naive and bf16: the f32 masters in host memory instead of beside the model. ZeRO-3 with the
  /// optimizer offloaded copies them to the host and never steps them on the device, so a model's
  /// whole f32 copy need not stay on the GPU beside its 16-bit one until ZeRO takes them (Note
  /// [Masters on the host] in mixed_precision_optimizer.cpp). The Engine sets it there.
  bool masters_on_host = false;

  /// `mode` with its reference's scaler defaults: torch_defaults() for torch, naive_defaults() otherwise.
  static AmpOptions for_mode(AmpMode mode);
};

/// What one step() did.
struct AmpStepResult {
  /// False when the step was skipped because some gradient (on this or, through the found-inf hook,
  /// another rank) was inf or NaN: parameters and optimizer state are unchanged, gradients dropped.
  bool stepped = false;
  /// The scale this step's gradients carried (the scale before the update that step() made); 1 for bf16.
  double loss_scale = 1.0;
  /// The total norm of the unscaled fp32 gradients before clipping, when step() was asked to clip and
  /// did not skip (else undefined): 0-d f64 on the gradients' device, so that clipping adds no host
  /// sync to the step; reading it is one.
  Tensor grad_norm;
};

/// Turns this rank's overflow flag into the flag every rank acts on. The distributed layer installs an
/// all-reduce(max) over every group that shares parameters or gradients (dp, tp, pp), so all ranks skip
/// the same steps and keep the same scale; step() calls it exactly once per call, on every rank, even
/// when the local flag is already true. The default (none installed) returns the local flag.
using FoundInfSync = std::function<bool(bool local_found_inf)>;
/// The total norm of the gradients of `params` as a 0-d f64 device tensor (optim::total_grad_norm by
/// default; the distributed layer replaces it with one that sums the norm over its groups:
/// parallel::GradientStatistics::grad_norm). `local_sum_of_squares`, when defined, is this rank's
/// sum of squares of those gradients, already taken by the overflow check (p = 2 only). Under naive
/// fp16's fused step those gradients are the 16-bit ones still carrying the loss scale (a power of
/// two then), and step() multiplies the norm returned by 1 / scale (Note [Fused mixed-precision step]).
using GradNormFn =
    std::function<Tensor(const std::vector<Tensor>& params, double norm_type, const Tensor& local_sum_of_squares)>;

class MixedPrecisionOptimizer {
 public:
  /// Takes over `model` and `optimizer`, which must be built over the model's f32 parameters (every
  /// parameter of every group must be one of model.named_parameters(); model.to(device) first, as
  /// the optimizer needs anyway). naive and bf16 convert the model to f16 / bf16 and rebind each
  /// group's parameters to f32 master tensors (the old f32 storage, detached, so nothing is copied),
  /// keeping groups, hyper-parameters and any optimizer state; `optimizer` stays the object an LR
  /// scheduler and a checkpoint see. Tensor handles to the model's parameters taken before this call
  /// go stale (see Note [Parameter slots] in nn/module.h). Throws naming the parameter when one is not
  /// the model's or not f32, or naming the scaler option that is out of range.
  MixedPrecisionOptimizer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
                          AmpOptions options);

  AmpMode mode() const { return options_.mode; }
  const AmpOptions& options() const { return options_; }
  /// The dtype the model's parameters and activations are in: f16 (naive), bf16 (bf16), f32 (torch).
  DType compute_dtype() const;

  /// A floating input converted to compute_dtype() (differentiable); integer inputs (token ids, labels)
  /// and torch mode's inputs unchanged. Colossal-AI's NaiveAMPModel does this to the model's inputs.
  Tensor cast_input(const Tensor& input) const;
  /// An f16 / bf16 output converted to f32 (differentiable) so the loss is computed in f32, as
  /// NaiveAMPModel(output_to_fp32 = True) does on the last pipeline stage; other outputs, and every
  /// output with options.output_to_f32 false, unchanged.
  Tensor cast_output(const Tensor& output) const;

  /// loss * loss_scale(), in f32 (an f16 / bf16 loss is converted first: the scaled value would
  /// overflow f16). bf16 returns the loss itself.
  Tensor scale_loss(const Tensor& loss) const;
  /// Backward of scale_loss(loss): gradients accumulate, scaled, in the model's parameters.
  void backward(const Tensor& loss);

  /// One update from the gradients accumulated since the last zero_grad():
  ///  1. naive / bf16: each model gradient is converted to f32 into its master's .grad and dropped
  ///     from the model; torch: the parameters' own f32 gradients are used in place;
  ///  2. fp16 modes: gradients are multiplied by inv_scale(), checked for inf/NaN (one host sync), the
  ///     flag goes through the found-inf hook and the scaler is updated with the result; on overflow
  ///     all gradients are dropped and the step returns with stepped = false;
  ///  3. when max_norm is set, the fp32 gradients are clipped through the clip hook;
  ///  4. the inner optimizer steps the f32 tensors, and naive / bf16 copy them (rounded to nearest even)
  ///     into the model's parameters.
  /// With an optimizer that supports_mixed_precision_step() (Adam, AdamW), naive and bf16 fold 1, the
  /// unscale of 2 and the copy of 4 into the update's own pass, with the same bits: the masters' .grad
  /// are then the 16-bit gradients themselves (Note [Fused mixed-precision step]).
  AmpStepResult step(std::optional<double> max_norm = std::nullopt, double norm_type = 2.0);
  /// Drops the gradients of the model's parameters and of the master weights.
  void zero_grad();

  /// The current loss scale (1 for bf16).
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  /// The loss scaler of the fp16 modes; null for bf16.
  DynamicGradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const DynamicGradScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  /// The wrapped optimizer, whose groups now hold master_params().
  optim::Optimizer& optimizer() { return *optimizer_; }
  nn::Module& model() { return *model_; }
  /// The model's parameters the optimizer updates, index-aligned with master_params() and
  /// param_names(). In torch mode the two lists hold the same tensors.
  const std::vector<Tensor>& model_params() const { return model_params_; }
  /// The f32 tensors the inner optimizer steps.
  const std::vector<Tensor>& master_params() const { return master_params_; }
  const std::vector<std::string>& param_names() const { return names_; }

  /// ZeRO's hand-over (parallel/zero/low_level_zero.h): master k becomes `shards[k]`, the 1-D f32
  /// tensor of elements [begins[k], begins[k] + shards[k].numel()) of model parameter k flattened
  /// (empty where this rank steps none of it), and the optimizer's groups are rebound to the shards
  /// (the full masters are released). From then on step() takes the masters' gradients as the
  /// gradient handler left them (it writes each shard's reduced f32 gradient into its .grad) and drops
  /// the model's, writes each shard back into its slice of the model's parameter (naive, bf16; the
  /// handler all-gathers the other slices), and state_dict() holds the shards. In torch mode the shards
  /// are views of the model's f32 parameters, stepped in place. Call it before the optimizer has state.
  /// `targets`, when given (ZeRO-3, whose model parameters are freed between uses), are where each
  /// shard is written back instead: 1-D tensors of the model's dtype and the shard's size.
  void shard_masters(std::vector<Tensor> shards, std::vector<int64_t> begins, std::vector<Tensor> targets = {});
  /// Whether shard_masters was called.
  bool masters_sharded() const { return sharded_; }

  /// Replaces step()'s inner optimizer.step() and its copy of the masters into the model with `step`
  /// (ZeRO's optimizer offload, parallel/zero/low_level_zero.h: the masters are on the host, stepped
  /// there, and the handler brings the model's parameters back); unscaling, the overflow check and
  /// clipping's factor (handed over through the optimizer's scale_gradients_in_next_step) stay as
  /// they are. An empty function restores the default.
  void set_optimizer_step(std::function<void()> step) { optimizer_step_ = std::move(step); }
  /// Installs the overflow-flag reduction (see FoundInfSync); an empty function restores the default.
  void set_found_inf_sync(FoundInfSync sync) { found_inf_sync_ = std::move(sync); }
  /// Installs the gradient-norm function clipping uses (see GradNormFn); an empty function restores
  /// the default.
  void set_grad_norm(GradNormFn norm) { grad_norm_ = std::move(norm); }

  /// What a checkpoint must add to the model's and the inner optimizer's state dicts to resume
  /// bit-exactly: "scaler.<key>" (DynamicGradScaler::state_dict, fp16 modes) and, for naive and bf16,
  /// "master.<parameter name>" (the f32 master weights, which the f16 / bf16 model only approximates;
  /// Colossal-AI's FP16Optimizer saves them as fp32_master_param_groups). The tensors alias the
  /// masters: save them before the next step() or copy them.
  optim::StateDict state_dict() const;
  /// Restores what state_dict() wrote (into a wrapper built the same way), then rewrites the model's
  /// parameters from the restored masters. Throws naming the first key that is missing, unexpected or
  /// of the wrong shape, and changes nothing when it does.
  void load_state_dict(const optim::StateDict& state);
  /// Whether a step with these clipping settings takes the fused path (Note [Fused mixed-precision
  /// step]), asked before the gradients move: the Engine splits an update in two only where it does.
  bool fuses_step(std::optional<double> max_norm, double norm_type) const { return can_fuse_step(max_norm, norm_type); }

 private:
  /// Multiplies every master gradient by inv_scale (skipped when it is 1) and returns the sum of
  /// squares of the results (0-d f64 on the device, non-finite exactly when some element is), in
  /// one pass (optim::sum_of_squares).
  Tensor unscale_and_sum_squares(double inv_scale) const;
  /// After shard_masters: the slice of each model parameter (flattened) its master shard covers.
  std::vector<Tensor> model_slices() const;
  /// Whether this step can take the fused path (Note [Fused mixed-precision step]); called before
  /// the gradients move.
  bool can_fuse_step(std::optional<double> max_norm, double norm_type) const;

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  AmpOptions options_;
  std::optional<DynamicGradScaler> scaler_;
  std::vector<std::string> names_;
  std::vector<Tensor> model_params_;
  std::vector<Tensor> master_params_;
  bool sharded_ = false;               // shard_masters was called
  std::vector<int64_t> shard_begins_;  // per master: its first element in the flattened model parameter
  std::vector<Tensor> shard_targets_;  // per master: where it is written back (empty: model_slices' default)
  FoundInfSync found_inf_sync_;
  GradNormFn grad_norm_;
  std::function<void()> optimizer_step_;  // set_optimizer_step's, replacing the inner step
};

}  // namespace colossal::amp
