// PatchEmbedding: the patch convolution and the [B, C, H', W'] -> [B, H' W', C] flatten.
#include "colossal/nn/patch_embedding.h"

#include <fmt/format.h>

namespace colossal::nn {

PatchEmbedding::PatchEmbedding(int64_t img_size, int64_t patch_size, int64_t in_channels, int64_t embed_dim, bool bias,
                               core::Generator* generator)
    : Module("PatchEmbedding"), img_size_(img_size), patch_size_(patch_size), in_channels_(in_channels) {
  COLOSSAL_CHECK(patch_size > 0 && img_size > 0 && img_size % patch_size == 0,
                 "PatchEmbedding: img_size {} must be a positive multiple of patch_size {}", img_size, patch_size);
  grid_size_ = img_size / patch_size;
  proj_ = register_module(
      "proj", std::make_shared<Conv2d>(in_channels, embed_dim, patch_size,
                                       Conv2dOptions{.stride = {patch_size, patch_size}, .bias = bias}, generator));
}

Tensor PatchEmbedding::forward(const Tensor& x) {
  COLOSSAL_CHECK(x.dim() == 4 && x.size(1) == in_channels_ && x.size(2) == img_size_ && x.size(3) == img_size_,
                 "PatchEmbedding: expected images [B, {}, {}, {}], got shape {}", in_channels_, img_size_, img_size_,
                 x.shape());
  return proj_->forward(x).flatten(2).transpose(1, 2);
}

std::string PatchEmbedding::extra_repr() const {
  return fmt::format("img_size={}, patch_size={}, num_patches={}", img_size_, patch_size_, num_patches());
}

}  // namespace colossal::nn
