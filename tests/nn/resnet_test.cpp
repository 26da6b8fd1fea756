// ResNet's structure: torchvision's parameter and buffer names, the parameter counts of
// ResNet-18/34/50 (built, and computed piece by piece from the config), the CIFAR stem,
// zero_init_residual, torchvision's initialisation, a CPU forward and backward reaching every
// parameter, the pipeline pieces composing to the model, the pieces left out of a build as stand-ins
// (Note [Pieces built]), and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
  // Computed from the config alone, as a pipeline weighs the pieces before building any.
  EXPECT_EQ(ResNetConfig::resnet18().num_parameters(), 11'689'512);
  EXPECT_EQ(ResNetConfig::resnet34().num_parameters(), 21'797'672);
  EXPECT_EQ(ResNetConfig::resnet50().num_parameters(), 25'557'032);
}

TEST(ResNet, PiecesParametersComputedAreThoseOfThePiecesBuilt) {
  // ResNetConfig::piece_parameters, piece by piece against the layers() of the model built: the
  // presets (ImageNet stem, 1000 classes), and narrow ones with a CIFAR stem, other channels and
  // classes, a downsample in layer1 (the bottleneck's first block widens) or none (the basic block's).
  std::vector<std::pair<std::string, ResNetConfig>> configs{{"resnet18", ResNetConfig::resnet18()},
                                                            {"resnet34", ResNetConfig::resnet34()},
                                                            {"resnet50", ResNetConfig::resnet50()}};
  // A preset with a CIFAR stem and other input channels, width and blocks per layer.
  const auto narrow = [](ResNetConfig config, int64_t in_chans, int64_t width, std::array<int64_t, 4> layers) {
    config.cifar_stem = true;
    config.in_chans = in_chans;
    config.width = width;
    config.layers = layers;
    return config;
  };
  configs.emplace_back("narrow basic", narrow(ResNetConfig::resnet18(7), 1, 6, {1, 3, 1, 2}));
  configs.emplace_back("narrow bottleneck", narrow(ResNetConfig::resnet50(3), 2, 5, {2, 1, 3, 1}));
  for (const auto& [name, config] : configs) {
    ResNet model(config);
    const auto pieces = model.layers();
    const std::vector<int64_t> counts = config.piece_parameters();
    ASSERT_EQ(counts.size(), pieces.size()) << name;
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(counts[i], pieces[i]->num_parameters())
          << name << " piece " << i << " (" << pieces[i]->type_name() << ")";
    }
    EXPECT_EQ(config.num_parameters(), model.num_parameters()) << name;
  }
}

/// Builds `config` whole, then with each set of `kept` pieces built and the others stand-ins, from the
/// same seed, and EXPECTs the pieces built to be the whole model's bit for bit and the generator to end
/// at the same offset (Note [Pieces built]).
void expect_pieces_built_alone_equal_the_whole(const ResNetConfig& config, const std::vector<std::set<size_t>>& kept) {
  core::Generator whole_gen(11);
  ResNet whole(config, &whole_gen);
  for (const std::set<size_t>& pieces : kept) {
    SCOPED_TRACE(::testing::Message() << pieces.size() << " pieces built, the first "
                                      << (pieces.empty() ? -1 : static_cast<int64_t>(*pieces.begin())));
    core::Generator gen(11);
    const auto built = [&pieces](size_t piece) { return pieces.contains(piece); };
    ResNet partial(config, &gen, built);
    EXPECT_EQ(gen.state().offset, whole_gen.state().offset) << "the stand-ins drew as many times";
    testing::expect_built_pieces_equal_the_full_model(whole, partial, whole.layers(), partial.layers(), built);
    EXPECT_LT(partial.num_parameters(), whole.num_parameters());
  }
}

TEST(ResNet, PiecesLeftOutAreStandInsAndTheOthersTheSerialWeights) {
  // Note [Pieces built]: basic blocks with the CIFAR stem and zero_init_residual (10 pieces: the stem,
  // 8 blocks, the head): the stem with a block, the blocks around layer2.0's downsample, the head
  // alone, two apart, none.
  ResNetConfig basic = ResNetConfig::resnet18(10);
  basic.cifar_stem = true;
  basic.width = 8;
  basic.zero_init_residual = true;
  expect_pieces_built_alone_equal_the_whole(basic, {{0, 1}, {2, 3, 4}, {9}, {3, 8}, {}});
  // Bottleneck blocks with the ImageNet stem, channels_last (7 pieces).
  ResNetConfig bottleneck = ResNetConfig::resnet50(6);
  bottleneck.in_chans = 1;
  bottleneck.width = 8;
  bottleneck.layers = {1, 1, 2, 1};
  bottleneck.channels_last = true;
  expect_pieces_built_alone_equal_the_whole(bottleneck, {{0}, {1, 2}, {3, 4, 5}, {6}});
  // A stand-in block keeps the full block's modules: its downsample where the full block has one.
  core::Generator gen(1);
  ResNet partial(bottleneck, &gen, [](size_t piece) { return piece == 0; });
  EXPECT_EQ(partial.parameter("layer1.0.downsample.0.weight").shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(partial.parameter("layer3.0.downsample.1.weight").shape(), (Shape{1}));
  EXPECT_ERROR_CONTAINS(partial.parameter("layer3.1.downsample.0.weight"), "no submodule 'layer3.1.downsample.0'");
  EXPECT_EQ(partial.parameter("fc.weight").shape(), (Shape{1, 1}));
  EXPECT_EQ(partial.parameter("conv1.weight").shape(), (Shape{8, 1, 7, 7}));
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
  EXPECT_EQ(config.num_parameters(), 701'178);
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
