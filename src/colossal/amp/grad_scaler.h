// DynamicGradScaler: the loss scale of fp16 training and how it moves after each step, with the two
// rules in use: torch.amp.GradScaler's (back off on every overflow) and Colossal-AI's
// DynamicGradScaler (back off only after `hysteresis` overflows). MixedPrecisionOptimizer owns one;
// a checkpoint stores its state_dict().
#pragma once

#include <cstdint>

#include "colossal/optim/optimizer.h"  // StateDict

namespace colossal::amp {

/// How update() moves the scale. See Note [Loss scale update rules] in grad_scaler.cpp.
enum class ScaleRule {
  /// torch.amp.GradScaler (_amp_update_scale_): every overflow multiplies the scale by backoff_factor
  /// and restarts the clean-step count; growth_interval clean steps in a row multiply it by growth_factor.
  torch,
  /// Colossal-AI's DynamicGradScaler: overflows are counted and the scale backs off once the count
  /// reaches `hysteresis` (and on every overflow after that); the count restarts only when the scale grows.
  hysteresis,
};

struct GradScalerOptions {
  ScaleRule rule = ScaleRule::hysteresis;
  double initial_scale = 65536.0;   ///< scale at the first step (2^16 in both references), > 0
  double growth_factor = 2.0;       ///< scale *= this after growth_interval clean steps, > 1
  double backoff_factor = 0.5;      ///< scale *= this on a backoff, in (0, 1)
  int64_t growth_interval = 1000;   ///< clean steps in a row before the scale grows, >= 1
  int64_t hysteresis = 2;           ///< hysteresis rule: overflows before the scale backs off, >= 1
  double min_scale = 1.0;           ///< the scale never backs off below this; 0: no floor
  double max_scale = 4294967296.0;  ///< the scale never grows past this (2^32); 0: no cap

  /// torch.amp.GradScaler's defaults: init_scale 2^16, growth 2 every 2000 clean steps, backoff 0.5,
  /// no floor and no cap (growth stops only where the scale would overflow f32).
  static GradScalerOptions torch_defaults();
  /// Colossal-AI's naive AMP defaults (FP16MixedPrecisionMixin / MixedPrecisionOptimizer): 2^16,
  /// growth 2 every 1000 clean steps, backoff 0.5, hysteresis 2, min_scale 1, max_scale 2^32.
  static GradScalerOptions naive_defaults();
};

class DynamicGradScaler {
 public:
  /// Throws naming the option when one is out of its range (or min_scale > initial_scale >
  /// max_scale, the checks of Colossal-AI's _sanity_checks).
  explicit DynamicGradScaler(GradScalerOptions options = GradScalerOptions::naive_defaults());

  /// The current loss scale. Kept in f32, as both references keep it in a float32 tensor, so a
  /// factor that is not a power of two rounds the same way.
  double scale() const { return scale_; }
  /// 1 / scale, taken in f64 and rounded to f32 (torch's unscale_ does the same).
  double inv_scale() const;
  /// Clean steps since the last growth or overflow.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// hysteresis rule: overflows since the last growth (always 0 under the torch rule).
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  const GradScalerOptions& options() const { return options_; }

  /// Moves the scale after a step that did (found_inf) or did not overflow, by options().rule.
  void update(bool found_inf);

  /// "scale" (f32 0-d), "growth_tracker" and "hysteresis_tracker" (i64 0-d). Colossal-AI saves only
  /// the scale; the trackers are kept too so that a resumed run grows and backs off on the same
  /// steps as one that never stopped. The options are configuration, not state.
  optim::StateDict state_dict() const;
  /// Restores what state_dict() wrote. Throws naming the first key that is missing, unexpected or
  /// not a 0-d tensor, or a scale that is not positive and finite, and changes nothing when it does.
  void load_state_dict(const optim::StateDict& state);

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_ = 0;
};

}  // namespace colossal::amp
