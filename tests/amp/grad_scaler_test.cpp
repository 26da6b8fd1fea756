// DynamicGradScaler step by step against the update formulas of torch.amp.GradScaler and of
// Colossal-AI's DynamicGradScaler (hysteresis), their floors and caps, the defaults of each, and the
// state_dict round trip.
#include "colossal/amp/grad_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "colossal/core/error.h"

namespace colossal::amp {
namespace {

GradScalerOptions hysteresis_options(double initial, int64_t interval, int64_t hysteresis) {
  GradScalerOptions o = GradScalerOptions::naive_defaults();
  o.initial_scale = initial;
  o.growth_interval = interval;
  o.hysteresis = hysteresis;
  return o;
}

GradScalerOptions torch_options(double initial, int64_t interval) {
  GradScalerOptions o = GradScalerOptions::torch_defaults();
  o.initial_scale = initial;
  o.growth_interval = interval;
  return o;
}

/// The update of Colossal-AI's DynamicGradScaler.update, transcribed literally (doubles are exact here:
/// every factor is a power of two).
struct HysteresisReference {
  double scale, growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval, hysteresis, growth_step = 0, hysteresis_step = 0;
  void update(bool overflow) {
    if (overflow) {
      hysteresis_step += 1;
      growth_step = 0;
      if (hysteresis_step >= hysteresis) scale = std::max(scale * backoff_factor, min_scale);
    } else {
      growth_step += 1;
      if (growth_step == growth_interval) {
        growth_step = 0;
        hysteresis_step = 0;
        scale = std::min(scale * growth_factor, max_scale);
      }
    }
  }
};

/// torch's _amp_update_scale_ (AmpKernels.cu), transcribed literally.
struct TorchReference {
  double scale, growth_factor, backoff_factor;
  int64_t growth_interval, growth_tracker = 0;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff_factor;
      growth_tracker = 0;
    } else {
      const int64_t successful = growth_tracker + 1;
      if (successful == growth_interval) {
        const float next = static_cast<float>(scale * growth_factor);
        if (std::isfinite(next)) scale = next;
        growth_tracker = 0;
      } else {
        growth_tracker = successful;
      }
    }
  }
};

TEST(GradScalerDefaults, MatchTheReferences) {
  // torch.amp.GradScaler(init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000).
  const GradScalerOptions t = GradScalerOptions::torch_defaults();
  EXPECT_EQ(t.rule, ScaleRule::torch);
  EXPECT_EQ(t.initial_scale, 65536.0);
  EXPECT_EQ(t.growth_factor, 2.0);
  EXPECT_EQ(t.backoff_factor, 0.5);
  EXPECT_EQ(t.growth_interval, 2000);
  EXPECT_EQ(t.min_scale, 0.0);
  EXPECT_EQ(t.max_scale, 0.0);
  // Colossal-AI's FP16MixedPrecisionMixin(initial_scale=2**16, min_scale=1, growth_factor=2,
  // backoff_factor=0.5, growth_interval=1000, hysteresis=2, max_scale=2**32).
  const GradScalerOptions n = GradScalerOptions::naive_defaults();
  EXPECT_EQ(n.rule, ScaleRule::hysteresis);
  EXPECT_EQ(n.initial_scale, 65536.0);
  EXPECT_EQ(n.growth_factor, 2.0);
  EXPECT_EQ(n.backoff_factor, 0.5);
  EXPECT_EQ(n.growth_interval, 1000);
  EXPECT_EQ(n.hysteresis, 2);
  EXPECT_EQ(n.min_scale, 1.0);
  EXPECT_EQ(n.max_scale, 4294967296.0);
  EXPECT_EQ(DynamicGradScaler().scale(), 65536.0);
}

TEST(HysteresisRule, GrowsAfterGrowthIntervalCleanSteps) {
  DynamicGradScaler scaler(hysteresis_options(1024, 3, 2));
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  scaler.update(false);  // the third clean step in a row
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 4096.0);
}

TEST(HysteresisRule, BacksOffOnceHysteresisOverflowsAccumulate) {
  DynamicGradScaler scaler(hysteresis_options(1024, 3, 2));
  scaler.update(true);  // first overflow: tolerated
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
  scaler.update(false);  // clean steps do not forgive overflows (only growth does)
  scaler.update(false);
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
  scaler.update(true);  // second overflow since the last growth: back off
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);
  scaler.update(true);  // every further overflow backs off until the scale grows again
  EXPECT_EQ(scaler.scale(), 256.0);
  for (int i = 0; i < 3; ++i) scaler.update(false);  // growth resets the overflow count
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.hysteresis_tracker(), 0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
}

TEST(HysteresisRule, OverflowRestartsTheCleanStepCount) {
  DynamicGradScaler scaler(hysteresis_options(1024, 3, 5));
  scaler.update(false);
  scaler.update(false);
  scaler.update(true);  // tolerated (hysteresis 5), but the two clean steps no longer count
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 2048.0);
}

TEST(HysteresisRule, HysteresisOneBacksOffAtEveryOverflowDownToMinScale) {
  GradScalerOptions o = hysteresis_options(4, 10, 1);
  o.min_scale = 1;
  DynamicGradScaler scaler(o);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1.0);
  scaler.update(true);  // max(0.5, min_scale)
  EXPECT_EQ(scaler.scale(), 1.0);
}

TEST(HysteresisRule, GrowthStopsAtMaxScale) {
  GradScalerOptions o = hysteresis_options(4, 1, 2);
  o.max_scale = 6;  // not a power-of-two multiple of the scale: min(8, 6)
  DynamicGradScaler scaler(o);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 6.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 6.0);
}

TEST(HysteresisRule, MatchesColossalAiOnALongRandomSequence) {
  GradScalerOptions o = hysteresis_options(1 << 10, 4, 3);
  o.min_scale = 1;
  o.max_scale = 1 << 14;
  DynamicGradScaler scaler(o);
  HysteresisReference reference{1 << 10, 2.0, 0.5, 1, 1 << 14, 4, 3};
  std::mt19937 rng(7);
  std::bernoulli_distribution overflow(0.2);
  for (int step = 0; step < 2000; ++step) {
    const bool found_inf = overflow(rng);
    scaler.update(found_inf);
    reference.update(found_inf);
    ASSERT_EQ(scaler.scale(), reference.scale) << "step " << step;
    ASSERT_EQ(scaler.growth_tracker(), reference.growth_step) << "step " << step;
    ASSERT_EQ(scaler.hysteresis_tracker(), reference.hysteresis_step) << "step " << step;
  }
}

TEST(TorchRule, BacksOffAtEveryOverflowAndIgnoresHysteresis) {
  GradScalerOptions o = torch_options(1024, 3);
  o.hysteresis = 4;  // not part of torch's rule
  DynamicGradScaler scaler(o);
  scaler.update(false);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.hysteresis_tracker(), 0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 256.0);
  for (int i = 0; i < 2; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 256.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512.0);
}

TEST(TorchRule, HasNoFloorByDefault) {
  DynamicGradScaler scaler(torch_options(2, 2000));
  for (int i = 0; i < 4; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 0.125);
}

TEST(TorchRule, SkipsGrowthThatWouldOverflowF32) {
  const double largest_power = std::ldexp(1.0, 127);  // 2^128 is past FLT_MAX
  DynamicGradScaler scaler(torch_options(largest_power, 1));
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), largest_power);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(TorchRule, MatchesTorchOnALongRandomSequence) {
  DynamicGradScaler scaler(torch_options(65536, 5));
  TorchReference reference{65536, 2.0, 0.5, 5};
  std::mt19937 rng(11);
  std::bernoulli_distribution overflow(0.1);
  for (int step = 0; step < 2000; ++step) {
    const bool found_inf = overflow(rng);
    scaler.update(found_inf);
    reference.update(found_inf);
    ASSERT_EQ(scaler.scale(), reference.scale) << "step " << step;
    ASSERT_EQ(scaler.growth_tracker(), reference.growth_tracker) << "step " << step;
  }
}

TEST(GradScaler, ScaleIsKeptInF32) {
  // Both references hold the scale in a float32 tensor: 1 * 0.3 becomes the float nearest 0.3.
  GradScalerOptions o = torch_options(1, 10);
  o.backoff_factor = 0.3;
  DynamicGradScaler scaler(o);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), static_cast<double>(0.3f));
  EXPECT_NE(scaler.scale(), 0.3);
  EXPECT_EQ(DynamicGradScaler(torch_options(65536, 1)).inv_scale(), 1.0 / 65536);
}

TEST(GradScaler, RejectsOptionsOutOfRange) {
  const auto expect_error = [](GradScalerOptions o, const char* text) {
    try {
      DynamicGradScaler scaler(o);
      FAIL() << "expected an error mentioning " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  GradScalerOptions o = GradScalerOptions::naive_defaults();
  o.growth_factor = 1;
  expect_error(o, "growth_factor must be > 1");
  o = GradScalerOptions::naive_defaults();
  o.backoff_factor = 1;
  expect_error(o, "backoff_factor must be > 0 and < 1");
  o = GradScalerOptions::naive_defaults();
  o.growth_interval = 0;
  expect_error(o, "growth_interval must be >= 1");
  o = GradScalerOptions::naive_defaults();
  o.initial_scale = 0;
  expect_error(o, "initial_scale must be positive");
  o = GradScalerOptions::naive_defaults();
  o.min_scale = 1e6;
  expect_error(o, "min_scale = 1000000 is above initial_scale = 65536");
  o = GradScalerOptions::naive_defaults();
  o.max_scale = 1024;
  expect_error(o, "max_scale = 1024 is below initial_scale = 65536");
}

TEST(GradScaler, StateRoundTripContinuesIdentically) {
  DynamicGradScaler scaler(hysteresis_options(1 << 12, 3, 2));
  for (bool found_inf : {false, true, true, false, false}) scaler.update(found_inf);
  const optim::StateDict state = scaler.state_dict();
  EXPECT_EQ(state.size(), 3u);
  EXPECT_EQ(state.at("scale").dtype(), DType::f32);
  EXPECT_EQ(state.at("growth_tracker").dtype(), DType::i64);

  DynamicGradScaler restored(hysteresis_options(1 << 12, 3, 2));
  restored.load_state_dict(state);
  EXPECT_EQ(restored.scale(), scaler.scale());
  EXPECT_EQ(restored.growth_tracker(), 2);
  EXPECT_EQ(restored.hysteresis_tracker(), 2);
  for (bool found_inf : {false, true, false, false, false, true}) {
    scaler.update(found_inf);
    restored.update(found_inf);
    EXPECT_EQ(restored.scale(), scaler.scale());
    EXPECT_EQ(restored.growth_tracker(), scaler.growth_tracker());
    EXPECT_EQ(restored.hysteresis_tracker(), scaler.hysteresis_tracker());
  }
}

TEST(GradScaler, LoadStateDictRejectsBadStateAndKeepsItsOwn) {
  DynamicGradScaler scaler(hysteresis_options(1 << 12, 3, 2));
  optim::StateDict missing = scaler.state_dict();
  missing.erase("hysteresis_tracker");
  EXPECT_THROW(
      {
        try {
          scaler.load_state_dict(missing);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'hysteresis_tracker' is missing"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  optim::StateDict extra = scaler.state_dict();
  extra["scale_"] = core::scalar_tensor(1.0);
  EXPECT_THROW(scaler.load_state_dict(extra), Error);
  optim::StateDict bad_scale = scaler.state_dict();
  bad_scale["scale"] = core::scalar_tensor(std::numeric_limits<double>::infinity());
  EXPECT_THROW(scaler.load_state_dict(bad_scale), Error);
  EXPECT_EQ(scaler.scale(), 4096.0);
}

}  // namespace
}  // namespace colossal::amp
