// The smallest real training: a two-layer MLP fitted with plain SGD on random data. Shows the ops,
// autograd and in-place updates work together, and that a fixed seed gives the same bits twice.
#include <gtest/gtest.h>

#include <cstring>

#include "gradcheck.h"

namespace colossal {
namespace {

struct TrainResult {
  std::vector<float> losses;
  std::vector<float> final_weights;
};

/// Labels come from a fixed random "teacher" (argmax of a random linear map), so the data is
/// learnable; the student is Linear(16, 32) -> ReLU -> Linear(32, 4) with cross-entropy.
TrainResult train_mlp(uint64_t seed, int steps) {
  core::Generator gen(seed);
  auto init = [&](const Shape& shape, double bound) {
    Tensor t = core::empty(shape, DType::f32);
    core::uniform_(t, -bound, bound, &gen);
    t.set_requires_grad(true);
    return t;
  };
  // PyTorch's Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  Tensor w1 = init({32, 16}, 0.25), b1 = init({32}, 0.25);
  Tensor w2 = init({4, 32}, 1.0 / std::sqrt(32.0)), b2 = init({4}, 1.0 / std::sqrt(32.0));
  Tensor teacher = core::randn({16, 4}, DType::f32, &gen);
  std::vector<Tensor> params{w1, b1, w2, b2};

  TrainResult result;
  const double lr = 0.2;
  for (int step = 0; step < steps; ++step) {
    Tensor x = core::randn({64, 16}, DType::f32, &gen);
    Tensor y = ops::argmax(ops::matmul(x, teacher), 1);
    Tensor hidden = ops::relu(ops::linear(x, w1, b1));
    Tensor loss = ops::cross_entropy(ops::linear(hidden, w2, b2), y);
    autograd::backward(loss);
    {
      autograd::NoGradGuard no_grad;
      for (Tensor& p : params) {
        ops::add_(p, p.grad(), -lr);
        p.set_grad(Tensor());
      }
    }
    result.losses.push_back(loss.item<float>());
  }
  for (const Tensor& p : params) {
    auto v = p.to_vector<float>();
    result.final_weights.insert(result.final_weights.end(), v.begin(), v.end());
  }
  return result;
}

float mean_of(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return static_cast<float>(s / static_cast<double>(end - begin));
}

TEST(MlpTraining, SgdDrivesLossDown) {
  const TrainResult r = train_mlp(42, 300);
  const float first = mean_of(r.losses, 0, 10);
  const float last = mean_of(r.losses, 290, 300);
  // Chance level for 4 classes is ln 4 = 1.386; a learnable teacher should be fitted well below
  // half of where training started.
  EXPECT_GT(first, 1.0f);
  EXPECT_LT(last, 0.5f * first) << "first 10 steps " << first << ", last 10 steps " << last;
}

TEST(MlpTraining, SameSeedSameBits) {
  const TrainResult a = train_mlp(7, 40);
  const TrainResult b = train_mlp(7, 40);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)), 0);
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size());
  EXPECT_EQ(std::memcmp(a.final_weights.data(), b.final_weights.data(), a.final_weights.size() * sizeof(float)), 0);
  const TrainResult c = train_mlp(8, 40);
  EXPECT_NE(std::memcmp(a.losses.data(), c.losses.data(), a.losses.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace colossal
