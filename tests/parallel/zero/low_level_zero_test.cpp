// parallel::zero::LowLevelZero in one process (a group of one rank): the optimizer is rebound to
// shards that cover whole parameters, training equals the plain optimizer's, and misuse is refused
// with messages that name what is wrong.
#include "colossal/parallel/zero/low_level_zero.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "colossal/autograd/engine.h"
#include "colossal/comm/single_process_group.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/reduction.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/lamb.h"
#include "colossal/optim/sgd.h"

namespace colossal::parallel::zero {
namespace {

std::shared_ptr<nn::Module> mlp() {
  core::Generator init(7);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 8, true, &init), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(8, 3, true, &init)});
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LowLevelZero, OneRankTrainsAsThePlainOptimizer) {
  auto zero_model = mlp(), plain_model = mlp();
  optim::AdamW zero_opt(zero_model->parameters()), plain_opt(plain_model->parameters());
  LowLevelZero zero(*zero_model, zero_opt, nullptr, comm::single_process_group(Device{}),
                    ZeroOptions{.stage = 2, .reduce_bucket_bytes = 64});
  EXPECT_GT(zero.partition().buckets().size(), 1u);
  EXPECT_TRUE(zero.parameters_in_buckets());  // Note [Parameters in their buckets]
  for (const Tensor& shard : zero.shards()) EXPECT_EQ(shard.dim(), 1);
  const Tensor x = core::from_vector<float>({0.1f, -0.4f, 0.7f, 0.2f, -0.3f, 0.5f, 0.9f, -0.8f}, {2, 4});
  const Tensor y = core::from_vector<int64_t>({2, 0}, {2});
  for (int step = 0; step < 3; ++step) {
    zero.set_sync(true);
    autograd::backward(ops::cross_entropy(zero_model->forward(x), y));
    zero.finish();
    zero_opt.step();
    zero.after_update(true);
    zero_opt.zero_grad();
    autograd::backward(ops::cross_entropy(plain_model->forward(x), y));
    plain_opt.step();
    plain_opt.zero_grad();
  }
  const auto a = zero_model->named_parameters(), b = plain_model->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
}

TEST(LowLevelZero, LambKeepsWholeTensors) {
  auto model = mlp();
  optim::Lamb lamb(model->parameters());
  EXPECT_TRUE(uses_tensor_norms(lamb));
  LowLevelZero zero(*model, lamb, nullptr, comm::single_process_group(Device{}), ZeroOptions{.stage = 1});
  EXPECT_EQ(zero.partition().granularity(), Granularity::tensor);
  optim::Sgd sgd(mlp()->parameters(), optim::SgdOptions{.lr = 0.1});
  EXPECT_FALSE(uses_tensor_norms(sgd));
}

TEST(LowLevelZero, RefusesMisuse) {
  auto model = mlp();
  const auto group = comm::single_process_group(Device{});
  {
    optim::Sgd sgd(model->parameters(), optim::SgdOptions{.lr = 0.1});
    EXPECT_NE(
        message_of([&] { LowLevelZero(*model, sgd, nullptr, group, ZeroOptions{.stage = 3}); }).find("zero.stage = 3"),
        std::string::npos);
  }
  {
    // The last layer's bias in no param group.
    std::vector<Tensor> params = model->parameters();
    params.pop_back();
    optim::Sgd sgd(params, optim::SgdOptions{.lr = 0.1});
    const std::string message = message_of([&] { LowLevelZero(*model, sgd, nullptr, group, ZeroOptions{}); });
    EXPECT_NE(message.find("parameter '2.bias' requires a gradient but is in no param group"), std::string::npos)
        << message;
  }
  {
    // An optimizer that has stepped: its state is for whole tensors.
    optim::AdamW adamw(model->parameters());
    autograd::backward(ops::sum(model->forward(core::ones({1, 4}))));
    adamw.step();
    const std::string message = message_of([&] { LowLevelZero(*model, adamw, nullptr, group, ZeroOptions{}); });
    EXPECT_NE(message.find("has state already"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace colossal::parallel::zero
