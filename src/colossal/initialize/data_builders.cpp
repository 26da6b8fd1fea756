// make_datasets (builders.h): data.dataset with data.transforms wired into a training pipeline
// (every transform, augmentations included) and a test pipeline (the deterministic ones only), or
// random token windows for a language model.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>    // nearbyint
#include <cstdlib>  // getenv
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/error.h"
#include "colossal/data/auto_augment.h"       // AutoAugment
#include "colossal/data/cifar10.h"            // Cifar10Dataset
#include "colossal/data/dataset.h"            // TransformDataset
#include "colossal/data/image_batch_stage.h"  // ImageBatchStage
#include "colossal/data/mixup.h"              // Mixup
#include "colossal/data/mnist.h"              // MnistDataset, find_fashion_mnist
#include "colossal/data/synthetic.h"          // SyntheticImageDataset, SyntheticPixelStage
#include "colossal/data/token_file.h"         // TokenFileDataset
#include "colossal/data/transform.h"          // Compose
#include "colossal/data/transforms.h"  // ToTensor, RandomCrop, RandomHorizontalFlip, Resize, Normalize, crop, pad
#include "colossal/initialize/builders.h"

namespace colossal::initialize {
namespace {

using config::DatasetName;
using config::OptionTable;
using config::TrainConfig;
using TransformList = std::vector<std::shared_ptr<const data::Transform>>;

/// torchvision's CenterCrop on a CHW image of any dtype: the central size x size window, its
/// offset rounded half to even as Python's round(); an image smaller than the crop is first padded
/// with zeros on both sides, the odd pixel going right and bottom. (data/ has crop() but no
/// CenterCrop transform.)
class CenterCrop final : public data::Transform {
 public:
  explicit CenterCrop(int64_t size) : size_(size) {}

  Tensor apply(const Tensor& image, core::Generator&) const override {
    COLOSSAL_CHECK(image.defined() && image.dim() == 3, "CenterCrop: expected a CHW image [C, H, W], got shape {}",
                   image.defined() ? image.shape() : Shape{});
    Tensor padded = image;
    const int64_t short_h = std::max<int64_t>(0, size_ - image.size(1));
    const int64_t short_w = std::max<int64_t>(0, size_ - image.size(2));
    if (short_h > 0 || short_w > 0) {
      padded = data::pad(image, short_w / 2, short_h / 2, (short_w + 1) / 2, (short_h + 1) / 2);
    }
    const auto top = static_cast<int64_t>(std::nearbyint(static_cast<double>(padded.size(1) - size_) / 2.0));
    const auto left = static_cast<int64_t>(std::nearbyint(static_cast<double>(padded.size(2) - size_) / 2.0));
    return data::crop(padded, top, left, size_, size_);
  }
  std::string name() const override { return fmt::format("CenterCrop({})", size_); }

 private:
  int64_t size_;
};

/// `value` with each $NAME or ${NAME} replaced by that environment variable; throws naming `key`
/// when one is unset. A '$' not followed by a name stays as it is.
std::string expand_env(const std::string& value, std::string_view key) {
  std::string out;
  for (size_t i = 0; i < value.size();) {
    if (value[i] != '$') {
      out += value[i++];
      continue;
    }
    std::string name;
    size_t next = i + 1;
    if (next < value.size() && value[next] == '{') {
      const size_t close = value.find('}', next);
      if (close == std::string::npos) unsupported(fmt::format("{} = \"{}\": \"${{\" without its \"}}\"", key, value));
      name = value.substr(next + 1, close - next - 1);
      next = close + 1;
    } else {
      while (next < value.size() && (std::isalnum(static_cast<unsigned char>(value[next])) || value[next] == '_')) {
        name += value[next++];
      }
    }
    if (name.empty()) {
      out += value[i++];
      continue;
    }
    const char* env = std::getenv(name.c_str());
    if (env == nullptr) {
      unsupported(
          fmt::format("{} = \"{}\": the environment variable {} is not set (export {}=<folder>, or write the "
                      "path into {})",
                      key, value, name, name, key));
    }
    out += env;
    i = next;
  }
  return out;
}

/// A number or an array of numbers at `key`, as doubles; nullopt when absent.
std::optional<std::vector<double>> get_number_list(const OptionTable& o, std::string_view key) {
  const auto it = o.values().find(key);
  if (it == o.values().end()) return std::nullopt;
  const config::OptionValue& value = it->second;
  if (!std::holds_alternative<config::OptionValue::Array>(value.value))
    return std::vector<double>{o.get_double(key, 0)};
  std::vector<double> numbers;
  for (const config::OptionValue& element : std::get<config::OptionValue::Array>(value.value)) {
    if (const int64_t* i = std::get_if<int64_t>(&element.value)) {
      numbers.push_back(static_cast<double>(*i));
    } else if (const double* d = std::get_if<double>(&element.value)) {
      numbers.push_back(*d);
    } else {
      unsupported(
          fmt::format("{}.{} = {}: expected a number or an array of numbers", o.prefix(), key, config::to_toml(value)));
    }
  }
  return numbers;
}

// ---- images

/// data.options keys that belong to one transform: set without it in data.transforms, they would
/// silently do nothing, so they are refused.
struct TransformOption {
  std::string_view key;
  std::string_view transform;
};
constexpr TransformOption kTransformOptions[] = {
    {"crop_size", "random_crop"},
    {"crop_padding", "random_crop"},
    {"crop_padding_mode", "random_crop"},
    {"flip_p", "random_flip"},
    {"resize", "resize"},
    {"resize_antialias", "resize"},
    {"center_crop", "center_crop"},
    {"normalize_mean", "normalize"},
    {"normalize_std", "normalize"},
    {"mixup_alpha", "mixup"},
};
constexpr std::string_view kSyntheticOptions[] = {"size",     "test_size",   "image_size",
                                                  "channels", "num_classes", "dtype"};

/// The untransformed images of data.dataset and what normalize uses by default.
struct ImageSource {
  std::shared_ptr<data::Dataset> train, test;
  /// Synthetic images only: the same samples as pixel keys (SyntheticPixelStage expands them).
  std::shared_ptr<data::Dataset> train_keys, test_keys;
  int64_t channels = 0, size = 0, num_classes = 0;
  bool u8 = true;                 ///< uint8 pixels (ToTensor still to come); false: f32
  std::vector<double> mean, std;  ///< the dataset's normalize statistics; empty: none known
};

void check_image_options(const TrainConfig& c) {
  const OptionTable& o = c.data.options;
  o.reject_unknown({"size", "test_size", "image_size", "channels", "num_classes", "dtype", "crop_size", "crop_padding",
                    "crop_padding_mode", "flip_p", "resize", "resize_antialias", "center_crop", "normalize_mean",
                    "normalize_std", "mixup_alpha"});
  const auto& transforms = c.data.transforms;
  for (const auto& [key, value] : o.values()) {
    if (c.data.dataset != DatasetName::kSynthetic &&
        std::find(std::begin(kSyntheticOptions), std::end(kSyntheticOptions), key) != std::end(kSyntheticOptions)) {
      unsupported(fmt::format("{}.{} applies to data.dataset = \"synthetic\" only, not \"{}\"", o.prefix(), key,
                              config::to_string(c.data.dataset)));
    }
    for (const TransformOption& option : kTransformOptions) {
      if (option.key == key && std::find(transforms.begin(), transforms.end(), option.transform) == transforms.end()) {
        unsupported(fmt::format("{}.{} is set but data.transforms has no \"{}\"", o.prefix(), key, option.transform));
      }
    }
  }
  for (size_t i = 0; i < transforms.size(); ++i) {
    if (std::find(transforms.begin(), transforms.begin() + static_cast<std::ptrdiff_t>(i), transforms[i]) !=
        transforms.begin() + static_cast<std::ptrdiff_t>(i)) {
      unsupported(fmt::format("data.transforms lists \"{}\" twice", transforms[i]));
    }
  }
}

ImageSource load_images(const TrainConfig& c) {
  const OptionTable& opt = c.data.options;
  ImageSource s;
  switch (c.data.dataset) {
    case DatasetName::kSynthetic: {
      data::SyntheticImageOptions so;
      so.size = opt.get_int("size", 1024, 1);
      s.size = opt.get_int("image_size", 28, 1);
      s.channels = opt.get_int("channels", 1, 1);
      s.num_classes = opt.get_int("num_classes", 10, 2);
      const std::string dtype = opt.get_string("dtype", "f32");
      if (dtype != "f32" && dtype != "u8") {
        unsupported(
            fmt::format("data.options.dtype = \"{}\" must be \"f32\" (normal pixels) or \"u8\" (0..255 pixels, "
                        "for ToTensor and auto_augment)",
                        dtype));
      }
      so.dtype = dtype == "u8" ? DType::u8 : DType::f32;
      s.u8 = dtype == "u8";
      so.image_shape = {s.channels, s.size, s.size};
      so.num_classes = s.num_classes;
      so.seed = static_cast<uint64_t>(c.train.seed);
      s.train = std::make_shared<data::SyntheticImageDataset>(so);
      data::SyntheticImageOptions keys = so;
      keys.pixel_keys = true;
      s.train_keys = std::make_shared<data::SyntheticImageDataset>(keys);
      so.size = keys.size = opt.get_int("test_size", 256, 0);
      so.seed = keys.seed = so.seed + 1;
      if (so.size > 0) {
        s.test = std::make_shared<data::SyntheticImageDataset>(so);
        s.test_keys = std::make_shared<data::SyntheticImageDataset>(keys);
      }
      break;
    }
    case DatasetName::kMnist:
    case DatasetName::kFashionMnist: {
      const bool fashion = c.data.dataset == DatasetName::kFashionMnist;
      std::string dir = expand_env(c.data.path, "data.path");
      if (dir.empty() && fashion) {
        if (auto found = data::find_fashion_mnist()) dir = *found;
      }
      if (dir.empty()) {
        unsupported(
            fmt::format("data.path is empty and data.dataset = \"{}\" has no default location (fashion_mnist: set "
                        "$COLOSSAL_FASHION_MNIST_DIR or install Debian's dataset-fashion-mnist)",
                        config::to_string(c.data.dataset)));
      }
      const std::string test_dir = c.data.test_path.empty() ? dir : expand_env(c.data.test_path, "data.test_path");
      s.train = std::make_shared<data::MnistDataset>(dir, data::Split::train);
      s.test = std::make_shared<data::MnistDataset>(test_dir, data::Split::test);
      s.channels = 1;
      s.size = 28;
      s.num_classes = data::MnistDataset::kNumClasses;
      s.mean = {fashion ? 0.2860 : 0.1307};
      s.std = {fashion ? 0.3530 : 0.3081};
      break;
    }
    case DatasetName::kCifar10: {
      const std::string dir = expand_env(c.data.path, "data.path");
      if (dir.empty()) unsupported("data.path must name the CIFAR-10 binary folder for data.dataset = \"cifar10\"");
      const std::string test_dir = c.data.test_path.empty() ? dir : expand_env(c.data.test_path, "data.test_path");
      s.train = std::make_shared<data::Cifar10Dataset>(dir, data::Split::train);
      s.test = std::make_shared<data::Cifar10Dataset>(test_dir, data::Split::test);
      s.channels = 3;
      s.size = 32;
      s.num_classes = data::Cifar10Dataset::kNumClasses;
      s.mean = {0.4914, 0.4822, 0.4465};
      s.std = {0.2470, 0.2435, 0.2616};
      break;
    }
    case DatasetName::kTokens:
      break;  // make_token_datasets
  }
  return s;
}

data::PaddingMode padding_mode(const OptionTable& o) {
  const std::string mode = o.get_string("crop_padding_mode", "constant");
  if (mode == "constant") return data::PaddingMode::constant;
  if (mode == "edge") return data::PaddingMode::edge;
  if (mode == "reflect") return data::PaddingMode::reflect;
  if (mode == "symmetric") return data::PaddingMode::symmetric;
  unsupported(
      fmt::format("data.options.crop_padding_mode = \"{}\" must be one of \"constant\", \"edge\", \"reflect\", "
                  "\"symmetric\"",
                  mode));
}

/// A size option that its transform cannot do without.
int64_t required_size(const OptionTable& o, std::string_view key, std::string_view transform) {
  if (!o.contains(key)) {
    unsupported(fmt::format("data.transforms has \"{}\" but {}.{} (the output side in pixels) is not set", transform,
                            o.prefix(), key));
  }
  return o.get_int(key, 0, 1, 1 << 16);
}

std::vector<double> normalize_stats(const OptionTable& o, std::string_view key, const std::vector<double>& fallback,
                                    int64_t channels, std::string_view dataset) {
  std::optional<std::vector<double>> values = get_number_list(o, key);
  if (!values) {
    if (fallback.empty()) {
      unsupported(
          fmt::format("data.transforms \"normalize\" needs {}.{} for data.dataset = \"{}\" (it has no known "
                      "statistics)",
                      o.prefix(), key, dataset));
    }
    return fallback;
  }
  if (values->size() != 1 && static_cast<int64_t>(values->size()) != channels) {
    unsupported(fmt::format("{}.{} has {} values; it needs 1 or one per channel ({})", o.prefix(), key, values->size(),
                            channels));
  }
  return *values;
}

/// data.transforms as the training pipeline (all of them) and the test pipeline (resize,
/// center_crop, normalize), with ToTensor where float pixels are first needed; the geometry each
/// produces; and mixup, which acts on batches. Beside them the staged split (Note [Batch stages]):
/// when the list ends in [resize][normalize] (mixup anywhere) with neither earlier, the transforms
/// before that tail per sample (no ToTensor: images stay as the dataset makes them), the tail and
/// mixup as one ImageBatchStage.
struct Pipelines {
  TransformList train, test;
  int64_t train_size = 0, test_size = 0;
  std::optional<double> mixup_alpha;
  bool stageable = false;
  TransformList staged_train, staged_test;  ///< the per-sample part of the staged split
  data::ImageBatchStageOptions stage;       ///< the tail (mixup added by make_image_datasets)
};

/// How many entries at the end of `per_sample` (data.transforms less mixup) an ImageBatchStage can
/// take: "resize" and/or "normalize", in that order; nullopt when one of them comes earlier too (a
/// float transform after it would have to run per sample).
std::optional<size_t> stage_tail(const std::vector<std::string>& per_sample) {
  size_t tail = per_sample.size();
  if (tail > 0 && per_sample[tail - 1] == "normalize") --tail;
  if (tail > 0 && per_sample[tail - 1] == "resize") --tail;
  for (size_t i = 0; i < tail; ++i) {
    if (per_sample[i] == "resize" || per_sample[i] == "normalize") return std::nullopt;
  }
  return per_sample.size() - tail;
}

Pipelines build_pipelines(const TrainConfig& c, const ImageSource& s) {
  const OptionTable& o = c.data.options;
  Pipelines p;
  p.train_size = p.test_size = s.size;
  std::vector<std::string> per_sample;
  for (const std::string& t : c.data.transforms) {
    if (t != "mixup") per_sample.push_back(t);
  }
  const std::optional<size_t> tail = stage_tail(per_sample);
  p.stageable = tail.has_value();
  const size_t first_staged = per_sample.size() - tail.value_or(0);
  size_t position = 0;  // of the current transform in per_sample
  // Adds a transform to the per-sample half of the staged split when it comes before the tail.
  const auto staged = [&](const std::shared_ptr<const data::Transform>& transform, bool test) {
    if (!p.stageable || position >= first_staged) return;
    p.staged_train.push_back(transform);
    if (test) p.staged_test.push_back(transform);
  };
  bool u8 = s.u8;
  std::string float_step;  // the transform that needed float pixels, for the auto_augment message
  const auto to_float = [&](const std::string& why) {
    if (!u8) return;
    const auto to_tensor = std::make_shared<data::ToTensor>();
    p.train.push_back(to_tensor);
    p.test.push_back(to_tensor);
    u8 = false;
    float_step = why;
  };
  for (const std::string& t : c.data.transforms) {
    if (t == "random_crop") {
      const int64_t padding = o.get_int("crop_padding", 4, 0, 1 << 16);
      const int64_t size = o.get_int("crop_size", p.train_size, 1, 1 << 16);
      if (size > p.train_size + 2 * padding) {
        unsupported(
            fmt::format("data.options.crop_size = {} is larger than the {} x {} images padded by "
                        "data.options.crop_padding = {} on each side",
                        size, p.train_size, p.train_size, padding));
      }
      data::RandomCropOptions ro;
      ro.height = ro.width = size;
      ro.pad_left = ro.pad_top = ro.pad_right = ro.pad_bottom = padding;
      ro.padding_mode = padding_mode(o);
      p.train.push_back(std::make_shared<data::RandomCrop>(ro));
      staged(p.train.back(), false);
      p.train_size = size;
    } else if (t == "random_flip") {
      p.train.push_back(std::make_shared<data::RandomHorizontalFlip>(o.get_double("flip_p", 0.5, 0, 1)));
      staged(p.train.back(), false);
    } else if (t == "auto_augment") {
      if (!u8) {
        unsupported(float_step.empty()
                        ? std::string("data.transforms \"auto_augment\" works on uint8 images; data.dataset = "
                                      "\"synthetic\" makes them with data.options.dtype = \"u8\"")
                        : fmt::format("data.transforms \"auto_augment\" works on uint8 images, so it must come before "
                                      "\"{}\" (which converts them to float)",
                                      float_step));
      }
      if (s.channels != 1 && s.channels != 3) {
        unsupported(
            fmt::format("data.transforms \"auto_augment\" needs 1 or 3 channels, the images have {}", s.channels));
      }
      p.train.push_back(std::make_shared<data::AutoAugment>(data::AutoAugmentPolicy::cifar10));
      staged(p.train.back(), false);
    } else if (t == "resize") {
      const int64_t size = required_size(o, "resize", "resize");
      to_float("resize");
      const auto resize = std::make_shared<data::Resize>(size, size, o.get_bool("resize_antialias", true));
      p.train.push_back(resize);
      p.test.push_back(resize);
      p.train_size = p.test_size = size;
      p.stage.height = p.stage.width = size;
      p.stage.antialias = o.get_bool("resize_antialias", true);
    } else if (t == "center_crop") {
      const int64_t size = required_size(o, "center_crop", "center_crop");
      const auto center_crop = std::make_shared<CenterCrop>(size);
      p.train.push_back(center_crop);
      p.test.push_back(center_crop);
      staged(center_crop, true);
      p.train_size = p.test_size = size;
    } else if (t == "normalize") {
      const std::string_view dataset = config::to_string(c.data.dataset);
      std::vector<double> mean = normalize_stats(o, "normalize_mean", s.mean, s.channels, dataset);
      std::vector<double> std = normalize_stats(o, "normalize_std", s.std, s.channels, dataset);
      for (double v : std) {
        if (!(v > 0)) unsupported(fmt::format("data.options.normalize_std must be positive, got {}", v));
      }
      to_float("normalize");
      p.stage.mean = mean;
      p.stage.std = std;
      const auto normalize = std::make_shared<data::Normalize>(std::move(mean), std::move(std));
      p.train.push_back(normalize);
      p.test.push_back(normalize);
    } else if (t == "mixup") {
      const double alpha = o.get_double("mixup_alpha", 0.2);
      if (!(alpha > 0) || !std::isfinite(alpha)) {
        unsupported(fmt::format("data.options.mixup_alpha = {} must be a positive number (Beta(alpha, alpha))", alpha));
      }
      p.mixup_alpha = alpha;
    } else {
      unsupported(fmt::format("data.transforms entry \"{}\" is not supported by train --config", t));
    }
    if (t != "mixup") ++position;
  }
  to_float("");
  if (p.train_size != p.test_size) {
    unsupported(
        fmt::format("data.transforms: training images come out {0} x {0} but test images {1} x {1}; set "
                    "data.options.crop_size to {1} or end with \"center_crop\"",
                    p.train_size, p.test_size));
  }
  return p;
}

std::string describe(const TransformList& transforms) {
  if (transforms.empty()) return "none";
  std::string text;
  for (const auto& t : transforms) text += (text.empty() ? "" : " -> ") + t->name();
  return text;
}

/// The staged form of the datasets (Datasets::staged), or nullopt when the pipeline has no tail a
/// batch stage can take or the stage would have nothing to do.
std::optional<Datasets::Staged> make_staged(const TrainConfig& c, const ImageSource& s, const Pipelines& p,
                                            const std::optional<data::MixupOptions>& mixup) {
  Datasets::Staged st;
  if (s.train_keys && !s.u8 && c.data.transforms.empty()) {
    // Synthetic f32 images as they are: only their keys travel, the pixels are drawn in the stage.
    const auto stage = std::make_shared<data::SyntheticPixelStage>(Shape{s.channels, s.size, s.size}, DType::f32);
    st.train = s.train_keys;
    st.test = s.test_keys;
    st.train_stage = st.test_stage = stage;
    return st;
  }
  if (!p.stageable) return std::nullopt;
  const bool test_work = s.u8 || p.stage.height > 0 || !p.stage.mean.empty();
  if (!test_work && !mixup) return std::nullopt;
  const auto seed = static_cast<uint64_t>(c.train.seed);
  // The per-sample halves draw from the generators of the full pipelines (same seeds), and the
  // transforms left to the stage draw nothing, so the samples are those of the full pipelines up
  // to their last uint8 step.
  st.train = p.staged_train.empty() ? s.train
                                    : std::make_shared<data::TransformDataset>(
                                          s.train, std::make_shared<data::Compose>(p.staged_train), seed);
  if (s.test) {
    st.test = p.staged_test.empty() ? s.test
                                    : std::make_shared<data::TransformDataset>(
                                          s.test, std::make_shared<data::Compose>(p.staged_test), seed + 1);
  }
  data::ImageBatchStageOptions train_options = p.stage;
  train_options.mixup = mixup;
  st.train_stage = std::make_shared<data::ImageBatchStage>(train_options);
  if (test_work) st.test_stage = std::make_shared<data::ImageBatchStage>(p.stage);
  return st;
}

Datasets make_image_datasets(const TrainConfig& c) {
  check_image_options(c);
  const ImageSource s = load_images(c);
  Pipelines p = build_pipelines(c, s);

  Datasets d;
  d.channels = s.channels;
  d.image_size = p.train_size;
  d.num_classes = s.num_classes;
  const auto seed = static_cast<uint64_t>(c.train.seed);
  d.train = s.train;
  d.test = s.test;
  if (!p.train.empty()) {
    auto train = std::make_shared<data::Compose>(p.train);
    d.train = std::make_shared<data::TransformDataset>(d.train, train, seed);
    d.train_transform = train;
  }
  if (!p.test.empty()) {
    auto test = std::make_shared<data::Compose>(p.test);
    if (d.test) d.test = std::make_shared<data::TransformDataset>(d.test, test, seed + 1);
    d.test_transform = test;
  }
  std::optional<data::MixupOptions> mixup;
  if (p.mixup_alpha) {
    mixup = data::MixupOptions{
        .alpha = *p.mixup_alpha, .num_classes = d.num_classes, .label_smoothing = c.train.label_smoothing};
    d.batch_transform = std::make_shared<data::Mixup>(*mixup);
  }
  d.staged = make_staged(c, s, p, mixup);
  fmt::print("data: {} ({} train, {} test images of {} x {} x {}, {} classes); train {}{}; test {}\n",
             config::to_string(c.data.dataset), d.train->size(), d.test ? d.test->size() : 0, d.channels, d.image_size,
             d.image_size, d.num_classes, describe(p.train),
             d.batch_transform ? " + " + d.batch_transform->name() : std::string(), describe(p.test));
  if (d.staged) {
    fmt::print("data: staged: train per sample {}, per batch {}\n", describe(p.staged_train),
               d.staged->train_stage->name());
  }
  return d;
}

// ---- tokens

Datasets make_token_datasets(const TrainConfig& c) {
  const OptionTable& o = c.data.options;
  if (!c.data.transforms.empty()) {
    unsupported("data.transforms apply to images; data.dataset = \"tokens\" takes none (make it an empty list)");
  }
  o.reject_unknown({"num_samples", "test_num_samples"});
  if (c.model.name != config::ModelName::kGpt2) {
    unsupported(
        fmt::format("data.dataset = \"tokens\" trains a language model: model.name must be \"gpt2\", not \"{}\"",
                    config::to_string(c.model.name)));
  }
  const nn::models::GPT2Config g = gpt2_config(c);
  const int64_t seq_len = c.data.seq_len > 0 ? c.data.seq_len : g.n_positions;
  if (seq_len > g.n_positions) {
    unsupported(
        fmt::format("data.seq_len = {} is longer than the model's context of {} positions (model.options "
                    "n_positions)",
                    seq_len, g.n_positions));
  }
  data::TokenFileOptions to;
  to.sequence_length = seq_len;
  to.random_windows = true;
  to.seed = static_cast<uint64_t>(c.train.seed);
  to.num_samples = o.get_int("num_samples", 0, 0);
  to.vocab_size = g.vocab_size;
  Datasets d;
  d.seq_len = seq_len;
  d.vocab_size = g.vocab_size;
  d.train = std::make_shared<data::TokenFileDataset>(expand_env(c.data.path, "data.path"), to);
  if (!c.data.test_path.empty()) {
    const std::string test_path = expand_env(c.data.test_path, "data.test_path");
    to.random_windows = false;
    to.num_samples = 0;
    d.test = std::make_shared<data::TokenFileDataset>(test_path, to);
    // test_num_samples caps the windows, so a short test file still gives what it has.
    const int64_t cap = o.get_int("test_num_samples", 0, 0);
    if (cap > 0 && cap < d.test->size()) {
      to.num_samples = cap;
      d.test = std::make_shared<data::TokenFileDataset>(test_path, to);
    }
  }
  fmt::print("data: tokens, {} training windows of {} tokens per epoch (random starts), {} test windows\n",
             d.train->size(), seq_len, d.test ? d.test->size() : 0);
  return d;
}

}  // namespace

Datasets make_datasets(const TrainConfig& c) {
  if (c.data.dataset == DatasetName::kTokens) return make_token_datasets(c);
  return make_image_datasets(c);
}

}  // namespace colossal::initialize
