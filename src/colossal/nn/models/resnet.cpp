// ResNet: the two residual block kinds, the stages built from them, torchvision's initialisation
// and the pipeline pieces.
#include "colossal/nn/models/resnet.h"

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/nn/init.h"              // kaiming_normal_, zeros_
#include "colossal/ops/conv.h"             // max_pool2d, adaptive_avg_pool2d

namespace colossal::nn::models {

void ResNetConfig::validate() const {
  for (int64_t blocks : layers) {
    COLOSSAL_CHECK(blocks > 0, "ResNetConfig: every stage needs at least one block, got layers [{}, {}, {}, {}]",
                   layers[0], layers[1], layers[2], layers[3]);
  }
  COLOSSAL_CHECK(width > 0 && width <= (int64_t{1} << 20), "ResNetConfig: width must be in [1, 2^20], got {}", width);
  COLOSSAL_CHECK(num_classes > 0 && in_chans > 0, "ResNetConfig: num_classes ({}) and in_chans ({}) must be positive",
                 num_classes, in_chans);
}

ResNetConfig ResNetConfig::resnet18(int64_t num_classes) {
  return {.block = ResNetBlockKind::basic, .layers = {2, 2, 2, 2}, .num_classes = num_classes};
}
ResNetConfig ResNetConfig::resnet34(int64_t num_classes) {
  return {.block = ResNetBlockKind::basic, .layers = {3, 4, 6, 3}, .num_classes = num_classes};
}
ResNetConfig ResNetConfig::resnet50(int64_t num_classes) {
  return {.block = ResNetBlockKind::bottleneck, .layers = {3, 4, 6, 3}, .num_classes = num_classes};
}

namespace {

int64_t expansion_of(const ResNetConfig& config) {
  return config.block == ResNetBlockKind::bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
}

/// Calls fn(stage, block, in_planes, planes, stride) for every residual block in layers()' order:
/// torchvision's _make_layer, each stage twice as wide as the last, its first block striding by 2
/// (but layer1's).
template <class Fn>
void for_each_block(const ResNetConfig& config, Fn&& fn) {
  int64_t in_planes = config.width;
  for (size_t s = 0; s < 4; ++s) {
    const int64_t planes = config.width << s;
    for (int64_t b = 0; b < config.layers[s]; ++b) {
      fn(s, b, in_planes, planes, (s > 0 && b == 0) ? int64_t{2} : int64_t{1});
      in_planes = planes * expansion_of(config);
    }
  }
}

/// torchvision adds a block's downsample when the stride or the width changes.
bool has_downsample(int64_t in_planes, int64_t out_planes, int64_t stride) {
  return stride != 1 || in_planes != out_planes;
}

/// A bias-free conv's weight.
int64_t conv_parameters(int64_t in, int64_t out, int64_t kernel) {
  return in * out * kernel * kernel;
}

/// gamma and beta (the running statistics are buffers, not parameters).
int64_t batch_norm_parameters(int64_t features) {
  return 2 * features;
}

}  // namespace

std::vector<int64_t> ResNetConfig::piece_parameters() const {
  validate();
  const int64_t expansion = expansion_of(*this);
  std::vector<int64_t> counts{conv_parameters(in_chans, width, cifar_stem ? 3 : 7) + batch_norm_parameters(width)};
  for_each_block(*this, [&](size_t, int64_t, int64_t in_planes, int64_t planes, int64_t stride) {
    const int64_t out = planes * expansion;
    int64_t n = 0;
    if (block == ResNetBlockKind::bottleneck) {
      n = conv_parameters(in_planes, planes, 1) + batch_norm_parameters(planes) + conv_parameters(planes, planes, 3) +
          batch_norm_parameters(planes) + conv_parameters(planes, out, 1) + batch_norm_parameters(out);
    } else {
      n = conv_parameters(in_planes, planes, 3) + batch_norm_parameters(planes) + conv_parameters(planes, planes, 3) +
          batch_norm_parameters(planes);
    }
    if (has_downsample(in_planes, out, stride)) n += conv_parameters(in_planes, out, 1) + batch_norm_parameters(out);
    counts.push_back(n);
  });
  counts.push_back((width << 3) * expansion * num_classes + num_classes);  // fc's weight and bias
  return counts;
}

int64_t ResNetConfig::num_parameters() const {
  int64_t n = 0;
  for (int64_t count : piece_parameters()) n += count;
  return n;
}

namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride, core::Generator* generator,
                                ops::ImageLayout layout) {
  return std::make_shared<Conv2d>(
      in, out, 3, Conv2dOptions{.stride = {stride, stride}, .padding = {1, 1}, .bias = false, .layout = layout},
      generator);
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride, core::Generator* generator,
                                ops::ImageLayout layout) {
  return std::make_shared<Conv2d>(
      in, out, 1, Conv2dOptions{.stride = {stride, stride}, .bias = false, .layout = layout}, generator);
}

/// A block's kernel x kernel conv, or in a stand-in (Note [Pieces built]) a 1x1 conv from one channel
/// to one: the same module and weight's dimensions, one initialisation drawn as the full conv's.
std::shared_ptr<Conv2d> block_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, core::Generator* generator,
                                   ops::ImageLayout layout, bool stand_in) {
  if (stand_in) return conv1x1(1, 1, stride, generator, layout);
  return kernel == 3 ? conv3x3(in, out, stride, generator, layout) : conv1x1(in, out, stride, generator, layout);
}

std::shared_ptr<BatchNorm2d> batch_norm(int64_t features, ops::ImageLayout layout) {
  return std::make_shared<BatchNorm2d>(features, 1e-5, 0.1, true, true, layout);
}

/// torchvision's downsample: a strided 1x1 conv and a BatchNorm matching the branch's output, or
/// none when the shapes already agree. A stand-in block's is there when the full block's would be.
std::shared_ptr<Sequential> make_downsample(int64_t in_planes, int64_t out_planes, int64_t stride,
                                            core::Generator* generator, ops::ImageLayout layout, bool stand_in) {
  if (!has_downsample(in_planes, out_planes, stride)) return nullptr;
  return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      block_conv(in_planes, out_planes, 1, stride, generator, layout, stand_in),
      batch_norm(stand_in ? 1 : out_planes, layout)});
}

/// A block's end: relu(bn(branch) + identity), identity the block's input or its downsampled
/// projection, in one fused pass where the backend has it (ops::batch_norm_add_relu2d).
Tensor residual(BatchNorm2d& bn, const Tensor& branch, const std::shared_ptr<Sequential>& downsample, const Tensor& x) {
  return bn.forward_add_relu(branch, downsample ? downsample->forward(x) : x);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, core::Generator* generator,
                       ops::ImageLayout layout, bool stand_in)
    : Module("BasicBlock") {
  const int64_t width = stand_in ? 1 : planes;
  conv1_ = register_module("conv1", block_conv(in_planes, planes, 3, stride, generator, layout, stand_in));
  bn1_ = register_module("bn1", batch_norm(width, layout));
  conv2_ = register_module("conv2", block_conv(planes, planes, 3, 1, generator, layout, stand_in));
  bn2_ = register_module("bn2", batch_norm(width, layout));
  downsample_ = make_downsample(in_planes, planes * kExpansion, stride, generator, layout, stand_in);
  if (downsample_) register_module("downsample", downsample_);
}

Tensor BasicBlock::forward(const Tensor& x) {
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x);
}

Tensor BasicBlock::forward_block(const Tensor& x) {
  const Tensor out = bn1_->forward_relu(conv1_->forward(x));
  return residual(*bn2_, conv2_->forward(out), downsample_, x);
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, core::Generator* generator,
                       ops::ImageLayout layout, bool stand_in)
    : Module("Bottleneck") {
  const int64_t width = stand_in ? 1 : planes, out = stand_in ? 1 : planes * kExpansion;
  conv1_ = register_module("conv1", block_conv(in_planes, planes, 1, 1, generator, layout, stand_in));
  bn1_ = register_module("bn1", batch_norm(width, layout));
  conv2_ = register_module("conv2", block_conv(planes, planes, 3, stride, generator, layout, stand_in));
  bn2_ = register_module("bn2", batch_norm(width, layout));
  conv3_ = register_module("conv3", block_conv(planes, planes * kExpansion, 1, 1, generator, layout, stand_in));
  bn3_ = register_module("bn3", batch_norm(out, layout));
  downsample_ = make_downsample(in_planes, planes * kExpansion, stride, generator, layout, stand_in);
  if (downsample_) register_module("downsample", downsample_);
}

Tensor Bottleneck::forward(const Tensor& x) {
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x);
}

Tensor Bottleneck::forward_block(const Tensor& x) {
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  out = bn2_->forward_relu(conv2_->forward(out));
  return residual(*bn3_, conv3_->forward(out), downsample_, x);
}

namespace {

/// images [B, C, H, W] -> layer1's input, in the model's layout.
Tensor stem(Conv2d& conv1, BatchNorm2d& bn1, bool cifar_stem, ops::ImageLayout layout, const Tensor& images) {
  const Tensor in = layout == ops::ImageLayout::nhwc ? ops::to_nhwc(images) : images;
  const Tensor x = bn1.forward_relu(conv1.forward(in));
  return cifar_stem ? x : ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, layout);
}

Tensor head(Linear& fc, ops::ImageLayout layout, const Tensor& features) {
  return fc.forward(ops::adaptive_avg_pool2d(features, {1, 1}, layout).flatten(1));
}

}  // namespace

ResNet::ResNet(const ResNetConfig& config, core::Generator* generator, const PieceFilter& build)
    : Module("ResNet"), config_(config) {
  config.validate();
  const bool bottleneck = config.block == ResNetBlockKind::bottleneck;
  const int64_t expansion = expansion_of(config);
  const ops::ImageLayout layout = config.layout();
  // Note [Pieces built]: a piece left out is a stand-in: the stem's conv 1x1 from one channel to one
  // and its BatchNorm one wide, a block's as BasicBlock's and Bottleneck's stand_in say, the head one
  // class from one feature. Every module is made in the full model's order and draws as it does.
  const auto built = [&build](size_t piece) { return !build || build(piece); };
  const bool stem = built(0);
  if (!stem) {
    conv1_ = register_module("conv1", conv1x1(1, 1, 1, generator, layout));
  } else if (config.cifar_stem) {
    conv1_ = register_module("conv1", conv3x3(config.in_chans, config.width, 1, generator, layout));
  } else {
    conv1_ = register_module(
        "conv1", std::make_shared<Conv2d>(
                     config.in_chans, config.width, 7,
                     Conv2dOptions{.stride = {2, 2}, .padding = {3, 3}, .bias = false, .layout = layout}, generator));
  }
  bn1_ = register_module("bn1", batch_norm(stem ? config.width : 1, layout));
  for (auto& stage : stages_) stage = std::make_shared<Sequential>();
  size_t piece = 1;  // layers()' index of the next block
  for_each_block(config, [&](size_t s, int64_t, int64_t in_planes, int64_t planes, int64_t stride) {
    const bool stand_in = !built(piece++);
    if (bottleneck) {
      stages_[s]->push_back(std::make_shared<Bottleneck>(in_planes, planes, stride, generator, layout, stand_in));
    } else {
      stages_[s]->push_back(std::make_shared<BasicBlock>(in_planes, planes, stride, generator, layout, stand_in));
    }
  });
  for (size_t s = 0; s < 4; ++s) register_module("layer" + std::to_string(s + 1), stages_[s]);
  const bool head = built(piece);
  fc_ = register_module(
      "fc", head ? std::make_shared<Linear>((config.width << 3) * expansion, config.num_classes, true, generator)
                 : std::make_shared<Linear>(1, 1, true, generator));

  set_checkpoint_activations(config.checkpoint_activations);

  // torchvision's init: convs kaiming_normal(fan_out, relu); BatchNorms are ones and zeros already.
  for (const auto& [name, module] : named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(module)) {
      init::kaiming_normal_(conv->weight(), 0.0, init::FanMode::fan_out, init::Nonlinearity::relu, generator);
    }
    if (!config.zero_init_residual) continue;
    if (auto* block = dynamic_cast<Bottleneck*>(module)) init::zeros_(block->last_bn()->weight());
    if (auto* block = dynamic_cast<BasicBlock*>(module)) init::zeros_(block->last_bn()->weight());
  }
}

void ResNet::set_checkpoint_activations(bool on) {
  config_.checkpoint_activations = on;
  for (const auto& stage : stages_) {
    for (size_t b = 0; b < stage->size(); ++b) {
      Module* block = (*stage)[b].get();
      if (auto* basic = dynamic_cast<BasicBlock*>(block)) basic->set_checkpoint_activations(on);
      if (auto* bottleneck = dynamic_cast<Bottleneck*>(block)) bottleneck->set_checkpoint_activations(on);
    }
  }
}

Tensor ResNet::forward(const Tensor& images) {
  COLOSSAL_CHECK(images.dim() == 4 && images.size(1) == config_.in_chans,
                 "ResNet: expected images [B, {}, H, W], got shape {}", config_.in_chans, images.shape());
  Tensor x = stem(*conv1_, *bn1_, config_.cifar_stem, config_.layout(), images);
  for (const auto& stage : stages_) x = stage->forward(x);
  return head(*fc_, config_.layout(), x);
}

std::vector<std::shared_ptr<Module>> ResNet::layers() {
  std::vector<std::shared_ptr<Module>> pieces;
  auto stem_view = std::make_shared<LayerView>(
      "ResNetStem", [conv1 = conv1_, bn1 = bn1_, cifar = config_.cifar_stem, layout = config_.layout()](
                        LayerView&, const Tensor& images) { return stem(*conv1, *bn1, cifar, layout, images); });
  stem_view->share_module("conv1", conv1_);
  stem_view->share_module("bn1", bn1_);
  pieces.push_back(stem_view);
  for (size_t s = 0; s < 4; ++s) {
    for (size_t b = 0; b < stages_[s]->size(); ++b) {
      auto block = (*stages_[s])[b];
      auto view = std::make_shared<LayerView>(block->type_name(),
                                              [block](LayerView&, const Tensor& x) { return block->forward(x); });
      view->share_module("layer" + std::to_string(s + 1) + "." + std::to_string(b), block);
      pieces.push_back(view);
    }
  }
  auto head_view = std::make_shared<LayerView>(
      "ResNetHead", [fc = fc_, layout = config_.layout()](LayerView&, const Tensor& features) {
        return head(*fc, layout, features);
      });
  head_view->share_module("fc", fc_);
  pieces.push_back(head_view);
  return pieces;
}

}  // namespace colossal::nn::models
