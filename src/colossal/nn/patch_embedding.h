// PatchEmbedding: ViT's image-to-token step (timm's PatchEmbed): a Conv2d named `proj` with
// kernel = stride = patch size, flattened to [B, num_patches, embed_dim].
#pragma once

#include <memory>

#include "colossal/nn/conv.h"

namespace colossal::nn {

class PatchEmbedding : public Module {
 public:
  /// Images must be img_size x img_size with img_size divisible by patch_size (timm's
  /// strict_img_size). generator initialises proj (PyTorch's Conv2d default).
  PatchEmbedding(int64_t img_size, int64_t patch_size, int64_t in_channels, int64_t embed_dim, bool bias = true,
                 core::Generator* generator = nullptr);
  /// x [B, in_channels, img_size, img_size] -> [B, (img_size / patch_size)^2, embed_dim], patches
  /// in row-major order.
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const std::shared_ptr<Conv2d>& proj() const { return proj_; }
  int64_t num_patches() const { return grid_size_ * grid_size_; }
  int64_t grid_size() const { return grid_size_; }

 private:
  int64_t img_size_;
  int64_t patch_size_;
  int64_t in_channels_;
  int64_t grid_size_;
  std::shared_ptr<Conv2d> proj_;
};

}  // namespace colossal::nn
