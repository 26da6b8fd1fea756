// ResNet's structure: torchvision's parameter and buffer names, the parameter counts of
// ResNet-18/34/50, the CIFAR stem, zero_init_residual, torchvision's initialisation, a CPU forward
// and backward reaching every parameter, the pipeline pieces composing to the model, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/nn/models/resnet.h"
#include "colossal/ops.h"
#include "gradcheck.h"
#include "model_test_util.h"

namespace colossal {
namespace {

using nn::models::ResNet;
using nn::models::ResNetConfig;

TEST(ResNet, TorchvisionNames) {
  ResNet model(ResNetConfig::resnet50());
  const auto names = testing::parameter_names(model);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 5),
            (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                      "layer1.0.bn1.weight"}));
  EXPECT_EQ(std::vector<std::string>(names.end() - 2, names.end()), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(model.parameter("conv1.weight").shape(), (Shape{64, 3, 7, 7}));
  EXPECT_FALSE(model.parameter("conv1.bias").defined());  // convs have no bias
  EXPECT_EQ(model.parameter("layer1.0.conv3.weight").shape(), (Shape{256, 64, 1, 1}));
  // v1.5: the stride sits on the 3x3 conv; downsample is a strided 1x1 conv and a BatchNorm.
  EXPECT_EQ(model.parameter("layer2.0.conv2.weight").shape(), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(model.parameter("layer2.0.downsample.0.weight").shape(), (Shape{512, 256, 1, 1}));
  EXPECT_EQ(model.buffer("layer2.0.downsample.1.running_var").shape(), (Shape{512}));
  EXPECT_EQ(model.buffer("layer4.2.bn3.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(model.parameter("fc.weight").shape(), (Shape{1000, 2048}));
  EXPECT_ERROR_CONTAINS(model.parameter("layer2.1.downsample.0.weight"), "no submodule 'layer2.1.downsample.0'");
  // torchvision's state dict: 161 parameters and 3 buffers for each of the 53 BatchNorms.
  EXPECT_EQ(names.size(), 161u);
  EXPECT_EQ(model.state_dict().size(), 161u + 3 * 53);
}

TEST(ResNet, ParameterCountsMatchTorchvision) {
  EXPECT_EQ(ResNet(ResNetConfig::resnet18()).num_parameters(), 11'689'512);
  EXPECT_EQ(ResNet(ResNetConfig::resnet34()).num_parameters(), 21'797'672);
  EXPECT_EQ(ResNet(ResNetConfig::resnet50()).num_parameters(), 25'557'032);
}

// width scales every stage: ResNet-18 at width 16 on 1-channel images with 10 classes has
// 9*1*16 + 2*16 (stem) + 9,344 + 33,088 + 131,712 + 525,568 (layer1..4) + 128*10 + 10 (fc) = 701,178
// parameters, counted by hand per block (two 3x3 convs and two BatchNorms, plus a 1x1 downsample and
// its BatchNorm where the width or stride changes).
TEST(ResNet, WidthScalesEveryStage) {
  ResNetConfig config = ResNetConfig::resnet18(10);
  config.cifar_stem = true;
  config.in_chans = 1;
  config.width = 16;
  ResNet model(config);
  EXPECT_EQ(model.num_parameters(), 701'178);
  EXPECT_EQ(model.parameter("layer4.1.conv2.weight").shape(), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(model.parameter("fc.weight").shape(), (Shape{10, 128}));
  const Tensor images = testing::random_tensor({2, 1, 28, 28}, 3, -1.0, 1.0, DType::f32);
  EXPECT_EQ(model.forward(images).shape(), (Shape{2, 10}));
  config.width = 0;
  EXPECT_THROW(ResNet{config}, Error);
}

TEST(ResNet, CifarStemKeepsFullResolution) {
  ResNetConfig config = ResNetConfig::resnet18(10);
  config.cifar_stem = true;
  ResNet model(config);
  EXPECT_EQ(model.parameter("conv1.weight").shape(), (Shape{64, 3, 3, 3}));
  // 32x32 stays 32x32 through the stem, then halves in layer2..4 to 4x4 before pooling.
  auto layers = model.layers();
  const Tensor images = testing::random_tensor({2, 3, 32, 32}, 1, -1.0, 1.0, DType::f32);
  const Tensor after_stem = layers.front()->forward(images);
  EXPECT_EQ(after_stem.shape(), (Shape{2, 64, 32, 32}));
  EXPECT_EQ(model.forward(images).shape(), (Shape{2, 10}));
  ResNet imagenet(ResNetConfig::resnet18(10));
  EXPECT_EQ(imagenet.layers().front()->forward(images).shape(), (Shape{2, 64, 8, 8}));  // /2 conv, /2 pool
}

TEST(ResNet, InitialisationFollowsTorchvision) {
  core::Generator gen(4);
  ResNetConfig config = ResNetConfig::resnet18(10);
  ResNet model(config, &gen);
  // kaiming_normal(fan_out, relu): std sqrt(2 / (out * kh * kw)); for layer3.0.conv2, 256 * 9.
  // 590k draws: the sample std is within 1% of the true one.
  const double expected = std::sqrt(2.0 / (256 * 9));
  EXPECT_NEAR(testing::std_of(model.parameter("layer3.0.conv2.weight")), expected, expected * 0.01);
  testing::expect_values(model.parameter("layer3.0.bn2.weight"), std::vector<double>(256, 1.0));
  testing::expect_values(model.parameter("layer3.0.bn2.bias"), std::vector<double>(256, 0.0));

  config.zero_init_residual = true;
  ResNet zero_basic(config);
  testing::expect_values(zero_basic.parameter("layer3.0.bn2.weight"), std::vector<double>(256, 0.0));
  testing::expect_values(zero_basic.parameter("layer3.0.bn1.weight"), std::vector<double>(256, 1.0));
  ResNetConfig bottleneck = ResNetConfig::resnet50(10);
  bottleneck.zero_init_residual = true;
  ResNet zero_bottleneck(bottleneck);
  testing::expect_values(zero_bottleneck.parameter("layer1.2.bn3.weight"), std::vector<double>(256, 0.0));
  testing::expect_values(zero_bottleneck.parameter("layer1.2.bn2.weight"), std::vector<double>(64, 1.0));
  // The downsample BatchNorm is not the branch's last and keeps gamma 1.
  testing::expect_values(zero_bottleneck.parameter("layer1.0.downsample.1.weight"), std::vector<double>(256, 1.0));
}

TEST(ResNet, ForwardAndBackwardReachEveryParameter) {
  for (const ResNetConfig& base : {ResNetConfig::resnet18(10), ResNetConfig::resnet50(10)}) {
    ResNetConfig config = base;
    config.cifar_stem = true;
    ResNet model(config);
    // 16x16 keeps the smoke test fast: 2x2 at layer4 still has a spatial extent to pool.
    const Tensor images = testing::random_tensor({2, 3, 16, 16}, 2, -1.0, 1.0, DType::f32);
    const Tensor logits = model.forward(images);
    ASSERT_EQ(logits.shape(), (Shape{2, 10}));
    const Tensor loss = ops::cross_entropy(logits, core::from_vector<int64_t>({1, 8}, {2}));
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    autograd::backward(loss);
    testing::expect_finite_nonzero_grads(model);
    // Training updated the running statistics of every BatchNorm once.
    EXPECT_EQ(model.buffer("layer4.1.bn2.num_batches_tracked").item<int64_t>(), 1);
  }
}

TEST(ResNet, PipelineLayersComposeToTheModel) {
  ResNetConfig config = ResNetConfig::resnet18(10);
  config.cifar_stem = true;
  ResNet model(config);
  model.eval();  // running statistics, so both passes see the same normalisation
  const auto layers = model.layers();
  ASSERT_EQ(layers.size(), 1 + 8 + 1u);
  const Tensor images = testing::random_tensor({2, 3, 16, 16}, 3, -1.0, 1.0, DType::f32);
  Tensor x = images;
  for (const auto& layer : layers) x = layer->forward(x);
  testing::expect_close(x, model.forward(images), 0, 0, "composed pieces");
  EXPECT_EQ(testing::parameter_names(*layers[3]).front(), "layer2.0.conv1.weight");
  EXPECT_EQ(layers[3]->type_name(), "BasicBlock");
  testing::expect_pieces_cover_the_model(model, layers);
}

TEST(ResNet, BadConfigsAndInputs) {
  ResNetConfig config = ResNetConfig::resnet18();
  config.layers[2] = 0;
  EXPECT_ERROR_CONTAINS(ResNet{config}, "every stage needs at least one block, got layers [2, 2, 0, 2]");
  ResNet model(ResNetConfig::resnet18(10));
  EXPECT_ERROR_CONTAINS(model.forward(core::zeros({2, 1, 32, 32})),
                        "expected images [B, 3, H, W], got shape [2, 1, 32, 32]");
}

TEST(ResNet, ChannelsLastMatchesNchw) {
  // A narrow ResNet-18 on 16x16 images: the same weights in both layouts give the same logits and
  // parameter gradients (the nhwc ops are the nchw ones transposed on the CPU, except the global
  // pool's summation order).
  nn::models::ResNetConfig config = nn::models::ResNetConfig::resnet18(5);
  config.width = 4;
  config.cifar_stem = true;
  core::Generator g1(3), g2(3);
  nn::models::ResNet nchw(config, &g1);
  config.channels_last = true;
  nn::models::ResNet nhwc(config, &g2);
  const Tensor images = testing::random_tensor({3, 3, 16, 16}, 61, -1.0, 1.0, DType::f32);
  const Tensor a = nchw.forward(images), b = nhwc.forward(images);
  EXPECT_EQ(b.shape(), (Shape{3, 5}));
  testing::expect_close(b, a, 1e-5, 1e-5, "logits");
  autograd::backward(ops::sum(a));
  autograd::backward(ops::sum(b));
  const auto pa = nchw.named_parameters(), pb = nhwc.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].first, pb[i].first);
    testing::expect_close(pb[i].second.grad(), pa[i].second.grad(), 1e-4, 1e-4, pa[i].first);
  }
  // Same names and shapes: a checkpoint of one layout loads strictly into the other and gives its
  // outputs (here the NCHW model's, after its running statistics moved, into an nhwc model built
  // from another seed).
  config.channels_last = true;
  core::Generator other(99);
  nn::models::ResNet restored(config, &other);
  restored.load_state_dict(nchw.state_dict());
  nchw.eval();
  restored.eval();
  testing::expect_close(restored.forward(images), nchw.forward(images), 1e-5, 1e-5, "logits after loading");
}

}  // namespace
}  // namespace colossal
