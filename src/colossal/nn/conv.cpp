// Conv2d: parameter setup and the ops::conv2d call.
#include "colossal/nn/conv.h"

#include <fmt/format.h>

#include "colossal/nn/init.h"

namespace colossal::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, ops::Pair kernel_size, const Conv2dOptions& options,
               core::Generator* generator)
    : Module("Conv2d"),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      options_(options) {
  COLOSSAL_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: channels must be positive, got in {} and out {}",
                 in_channels, out_channels);
  COLOSSAL_CHECK(kernel_size[0] > 0 && kernel_size[1] > 0, "Conv2d: kernel_size must be positive, got {}", kernel_size);
  COLOSSAL_CHECK(options.groups > 0 && in_channels % options.groups == 0 && out_channels % options.groups == 0,
                 "Conv2d: groups {} must divide both in_channels {} and out_channels {}", options.groups, in_channels,
                 out_channels);
  weight_ = &register_parameter(
      "weight", core::empty({out_channels, in_channels / options.groups, kernel_size[0], kernel_size[1]}));
  bias_ = &register_parameter("bias", options.bias ? core::empty({out_channels}) : Tensor());
  init::default_linear_init_(*weight_, *bias_, generator);
}

Tensor Conv2d::forward(const Tensor& x) {
  return ops::conv2d(x, *weight_, *bias_, options_.stride, options_.padding, options_.dilation, options_.groups,
                     options_.layout);
}

std::string Conv2d::extra_repr() const {
  std::string out =
      fmt::format("{}, {}, kernel_size={}, stride={}", in_channels_, out_channels_, kernel_size_, options_.stride);
  if (options_.padding != ops::Pair{0, 0}) out += fmt::format(", padding={}", options_.padding);
  if (options_.dilation != ops::Pair{1, 1}) out += fmt::format(", dilation={}", options_.dilation);
  if (options_.groups != 1) out += fmt::format(", groups={}", options_.groups);
  if (!options_.bias) out += ", bias=false";
  if (options_.layout == ops::ImageLayout::nhwc) out += ", layout=nhwc";
  return out;
}

}  // namespace colossal::nn
