// DynamicGradScaler: see grad_scaler.h.
//
// Note [Loss scale update rules]
// Both rules start at initial_scale and multiply by growth_factor after growth_interval clean steps in
// a row. They differ on overflow:
//  - torch (torch.amp.GradScaler.update -> _amp_update_scale_, aten/src/ATen/native/cuda/AmpKernels.cu):
//      found_inf:  scale *= backoff_factor; growth_tracker = 0
//      otherwise:  growth_tracker += 1; when it reaches growth_interval: scale *= growth_factor unless the
//                  result is not finite in f32, growth_tracker = 0
//    torch has no floor and no cap; min_scale / max_scale apply here only when set (torch_defaults()
//    leaves both off).
//  - hysteresis (Colossal-AI, colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py, update()):
//      found_inf:  hysteresis_step += 1; growth_step = 0; if hysteresis_step >= hysteresis: backoff
//      otherwise:  growth_step += 1; when it reaches growth_interval: growth_step = 0,
//                  hysteresis_step = 0, grow
//    with backoff = max(scale * backoff_factor, min_scale) and grow = min(scale * growth_factor,
//    max_scale). The overflow count is not reset by clean steps, only by growth: with hysteresis 2, the
//    first overflow after a growth keeps the scale, and every later one (clean steps in between or not)
//    halves it until growth_interval clean steps in a row grow it again.
// The scale lives in f32 as in both references (a float32 tensor); a product is taken in f64 and
// rounded to f32 once. Growth that would leave the f32 range is skipped under either rule (torch's
// isfinite check; under the hysteresis rule it can only happen with max_scale off).
#include "colossal/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "colossal/core/error.h"  // COLOSSAL_CHECK

namespace colossal::amp {
namespace {

constexpr const char* kScaleKey = "scale";
constexpr const char* kGrowthKey = "growth_tracker";
constexpr const char* kHysteresisKey = "hysteresis_tracker";

void check_options(const GradScalerOptions& o) {
  COLOSSAL_CHECK(
      std::isfinite(o.initial_scale) && o.initial_scale > 0.0 && o.initial_scale <= std::numeric_limits<float>::max(),
      "DynamicGradScaler: initial_scale must be positive and finite in f32, got {}", o.initial_scale);
  COLOSSAL_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1.0,
                 "DynamicGradScaler: growth_factor must be > 1, got {}", o.growth_factor);
  COLOSSAL_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0,
                 "DynamicGradScaler: backoff_factor must be > 0 and < 1, got {}", o.backoff_factor);
  COLOSSAL_CHECK(o.growth_interval >= 1, "DynamicGradScaler: growth_interval must be >= 1, got {}", o.growth_interval);
  COLOSSAL_CHECK(o.hysteresis >= 1, "DynamicGradScaler: hysteresis must be >= 1, got {}", o.hysteresis);
  COLOSSAL_CHECK(o.min_scale >= 0.0 && std::isfinite(o.min_scale),
                 "DynamicGradScaler: min_scale must be >= 0 (0: no floor), got {}", o.min_scale);
  COLOSSAL_CHECK(o.max_scale >= 0.0 && !std::isnan(o.max_scale),
                 "DynamicGradScaler: max_scale must be >= 0 (0: no cap), got {}", o.max_scale);
  COLOSSAL_CHECK(o.min_scale <= o.initial_scale, "DynamicGradScaler: min_scale = {} is above initial_scale = {}",
                 o.min_scale, o.initial_scale);
  COLOSSAL_CHECK(o.max_scale == 0.0 || o.max_scale >= o.initial_scale,
                 "DynamicGradScaler: max_scale = {} is below initial_scale = {}", o.max_scale, o.initial_scale);
}

/// `key` of `state` as a one-element tensor; throws naming the key.
const Tensor& scalar_entry(const optim::StateDict& state, const char* key) {
  const auto it = state.find(key);
  COLOSSAL_CHECK(it != state.end(), "DynamicGradScaler::load_state_dict: key '{}' is missing", key);
  COLOSSAL_CHECK(it->second.defined() && it->second.dim() == 0,
                 "DynamicGradScaler::load_state_dict: '{}' must be a 0-d tensor, got shape {}", key,
                 it->second.defined() ? it->second.shape() : Shape{});
  return it->second;
}

}  // namespace

GradScalerOptions GradScalerOptions::torch_defaults() {
  GradScalerOptions o;
  o.rule = ScaleRule::torch;
  o.initial_scale = 65536.0;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  o.growth_interval = 2000;
  o.hysteresis = 1;  // unused by the torch rule
  o.min_scale = 0.0;
  o.max_scale = 0.0;
  return o;
}

GradScalerOptions GradScalerOptions::naive_defaults() {
  GradScalerOptions o;
  o.rule = ScaleRule::hysteresis;
  o.initial_scale = 65536.0;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  o.growth_interval = 1000;
  o.hysteresis = 2;
  o.min_scale = 1.0;
  o.max_scale = 4294967296.0;
  return o;
}

DynamicGradScaler::DynamicGradScaler(GradScalerOptions options) : options_(options) {
  check_options(options_);
  scale_ = static_cast<float>(options_.initial_scale);
}

double DynamicGradScaler::inv_scale() const {
  return static_cast<double>(static_cast<float>(1.0 / static_cast<double>(scale_)));
}

void DynamicGradScaler::update(bool found_inf) {
  const auto backoff = [this] {
    float next = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    if (options_.min_scale > 0.0) next = std::max(next, static_cast<float>(options_.min_scale));
    scale_ = next;
  };
  const auto grow = [this] {
    float next = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
    if (options_.max_scale > 0.0) next = std::min(next, static_cast<float>(options_.max_scale));
    if (std::isfinite(next)) scale_ = next;
  };

  if (options_.rule == ScaleRule::torch) {
    if (found_inf) {
      backoff();
      growth_tracker_ = 0;
    } else if (++growth_tracker_ >= options_.growth_interval) {
      grow();
      growth_tracker_ = 0;
    }
    return;
  }
  if (found_inf) {
    ++hysteresis_tracker_;
    growth_tracker_ = 0;
    if (hysteresis_tracker_ >= options_.hysteresis) backoff();
  } else if (++growth_tracker_ >= options_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = 0;
    grow();
  }
}

optim::StateDict DynamicGradScaler::state_dict() const {
  optim::StateDict state;
  state[kScaleKey] = core::scalar_tensor(static_cast<double>(scale_), DType::f32);
  state[kGrowthKey] = core::scalar_tensor(static_cast<double>(growth_tracker_), DType::i64);
  state[kHysteresisKey] = core::scalar_tensor(static_cast<double>(hysteresis_tracker_), DType::i64);
  return state;
}

void DynamicGradScaler::load_state_dict(const optim::StateDict& state) {
  for (const auto& [key, value] : state) {
    COLOSSAL_CHECK(key == kScaleKey || key == kGrowthKey || key == kHysteresisKey,
                   "DynamicGradScaler::load_state_dict: unexpected key '{}'; expected {}, {} and {}", key, kScaleKey,
                   kGrowthKey, kHysteresisKey);
  }
  const double scale = scalar_entry(state, kScaleKey).item<double>();
  const int64_t growth = scalar_entry(state, kGrowthKey).item<int64_t>();
  const int64_t hysteresis = scalar_entry(state, kHysteresisKey).item<int64_t>();
  COLOSSAL_CHECK(std::isfinite(scale) && scale > 0.0 && scale <= std::numeric_limits<float>::max(),
                 "DynamicGradScaler::load_state_dict: scale must be positive and finite in f32, got {}", scale);
  COLOSSAL_CHECK(growth >= 0 && hysteresis >= 0,
                 "DynamicGradScaler::load_state_dict: trackers must be >= 0, got growth_tracker {} and "
                 "hysteresis_tracker {}",
                 growth, hysteresis);
  scale_ = static_cast<float>(scale);
  growth_tracker_ = growth;
  hysteresis_tracker_ = hysteresis;
}

}  // namespace colossal::amp
