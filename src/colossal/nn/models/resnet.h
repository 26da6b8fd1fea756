// ResNet-18/34/50 (torchvision's ResNet, v1.5: the bottleneck's stride sits on its 3x3 conv)
// under torchvision's names (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0/1, fc), so
// torchvision checkpoints load through load_state_dict as they are; with a CIFAR stem option (a
// 3x3 stride-1 conv1 and no max pool, for 32x32 images) and torchvision's zero_init_residual.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "colossal/core/random.h"
#include "colossal/nn/batch_norm.h"
#include "colossal/nn/conv.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/layer_view.h"

namespace colossal::nn::models {

enum class ResNetBlockKind {
  basic,       ///< two 3x3 convs (ResNet-18/34), expansion 1
  bottleneck,  ///< 1x1, 3x3, 1x1 convs (ResNet-50 and deeper), expansion 4
};

struct ResNetConfig {
  ResNetBlockKind block = ResNetBlockKind::bottleneck;
  /// Blocks in layer1..layer4.
  std::array<int64_t, 4> layers{3, 4, 6, 3};
  int64_t num_classes = 1000;
  int64_t in_chans = 3;
  /// conv1 a 3x3 stride-1 convolution and no max pool, keeping 32x32 images (CIFAR) at full
  /// resolution into layer1; off is ImageNet's 7x7 stride-2 conv1 and 3x3 stride-2 max pool.
  bool cifar_stem = false;
  /// Start the last BatchNorm of every residual branch (bn2 of a basic block, bn3 of a
  /// bottleneck) with gamma 0, so each block begins as the identity (torchvision's
  /// zero_init_residual; Goyal et al., "Accurate, Large Minibatch SGD").
  bool zero_init_residual = false;
  /// Channels of conv1 and layer1; layer2..4 double it each (torchvision: 64). Smaller widths give
  /// the narrow ResNets that train quickly on small images.
  int64_t width = 64;
  /// Run the convolutions, BatchNorms and the max pool on [N, H, W, C] activations (the model still
  /// takes [B, C, H, W] images and returns [B, classes]; parameters and checkpoints are unchanged):
  /// PyTorch's channels_last memory format, the fast layout on the GPU (Note [image layouts] in
  /// ops/conv.h). On the CPU it only adds transposes.
  bool channels_last = false;
  /// Recompute each residual block (layer<k>.<i>) in backward while training instead of keeping
  /// its activations (torchvision's memory_efficient idea; model.options.checkpoint_activations):
  /// only the blocks' inputs stay alive. The recompute normalises by the same batch statistics and
  /// leaves the running statistics as the forward updated them (BatchNorm2d asks
  /// autograd::is_recomputing()), so losses, gradients and buffers are unchanged.
  bool checkpoint_activations = false;

  ops::ImageLayout layout() const { return channels_last ? ops::ImageLayout::nhwc : ops::ImageLayout::nchw; }
  void validate() const;
  /// The parameter count of each piece of ResNet::layers() (the stem, every residual block in order,
  /// the head), computed without building the model: a pipeline cut by parameters weighs the pieces
  /// with these before any rank builds one (Note [Stage pieces built alone] in
  /// initialize/pipeline_stage.h). Unlike GPT-2's and ViT's blocks, a ResNet's differ from stage to
  /// stage (the widths double, the first block of each stage may downsample), so each is counted.
  std::vector<int64_t> piece_parameters() const;
  /// The model's parameter count (the sum of piece_parameters()).
  int64_t num_parameters() const;

  static ResNetConfig resnet18(int64_t num_classes = 1000);
  static ResNetConfig resnet34(int64_t num_classes = 1000);
  static ResNetConfig resnet50(int64_t num_classes = 1000);
};

/// torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + downsample(x)).
class BasicBlock : public Module {
 public:
  static constexpr int64_t kExpansion = 1;
  /// downsample (conv 1x1 with stride, then BatchNorm) is added when the stride or the width changes.
  /// stand_in: the block's stand-in (Note [Pieces built]): every conv 1x1 from one channel to one,
  /// every BatchNorm one wide, the downsample there when the full block's would be; it draws from
  /// `generator` as the full block does, and is never run.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, core::Generator* generator,
             ops::ImageLayout layout = ops::ImageLayout::nchw, bool stand_in = false);
  Tensor forward(const Tensor& x) override;
  /// The branch's last BatchNorm (zero_init_residual sets its gamma to 0).
  const std::shared_ptr<BatchNorm2d>& last_bn() const { return bn2_; }
  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<Conv2d> conv2_;
  std::shared_ptr<BatchNorm2d> bn2_;
  std::shared_ptr<Sequential> downsample_;
  bool checkpoint_activations_ = false;

  Tensor forward_block(const Tensor& x);
};

/// torchvision's Bottleneck: relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + downsample(x)),
/// conv2 carrying the stride; the output has 4 * planes channels.
class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  /// stand_in: as BasicBlock's (conv3 and bn3 one wide too).
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, core::Generator* generator,
             ops::ImageLayout layout = ops::ImageLayout::nchw, bool stand_in = false);
  Tensor forward(const Tensor& x) override;
  const std::shared_ptr<BatchNorm2d>& last_bn() const { return bn3_; }
  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<Conv2d> conv2_;
  std::shared_ptr<BatchNorm2d> bn2_;
  std::shared_ptr<Conv2d> conv3_;
  std::shared_ptr<BatchNorm2d> bn3_;
  std::shared_ptr<Sequential> downsample_;
  bool checkpoint_activations_ = false;

  Tensor forward_block(const Tensor& x);
};

class ResNet : public Module {
 public:
  /// generator draws the initial weights, as torchvision's: every conv kaiming_normal(fan_out,
  /// relu), BatchNorms one and zero, fc PyTorch's Linear default. build: the pieces of layers()
  /// built at full size, the others as stand-ins (Note [Pieces built]; empty: all). A model with
  /// stand-ins is for a pipeline stage's pieces, not for forward().
  explicit ResNet(const ResNetConfig& config, core::Generator* generator = nullptr, const PieceFilter& build = {});

  /// images [B, in_chans, H, W] -> logits [B, num_classes].
  Tensor forward(const Tensor& images) override;
  /// The model as pieces for pipeline parallelism (Note [Pipeline layers]): "stem" (conv1, bn1,
  /// relu, max pool), one piece per residual block layer<k>.<i>, and "head" (global average pool,
  /// fc).
  std::vector<std::shared_ptr<Module>> layers();
  /// Every residual block's activation checkpointing on or off (and config().checkpoint_activations).
  void set_checkpoint_activations(bool on);

  const ResNetConfig& config() const { return config_; }
  /// layer1..layer4 (index 0..3).
  const std::shared_ptr<Sequential>& stage(size_t index) const { return stages_.at(index); }
  const std::shared_ptr<Linear>& fc() const { return fc_; }

 private:
  ResNetConfig config_;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::array<std::shared_ptr<Sequential>, 4> stages_;
  std::shared_ptr<Linear> fc_;
};

}  // namespace colossal::nn::models
