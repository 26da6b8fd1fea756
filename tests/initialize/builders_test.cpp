// Tests of the run builders (initialize/builders.h): each model builds from a config, token files give
// next-token samples and the LM loss, data.transforms wire augmentations into the training set only,
// mixup gives soft targets and a soft-target loss, bad options fail naming the key, and the configs
// in configs/ load and build (on stand-in data) and take two optimizer steps.
#include "colossal/initialize/builders.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>  // setenv, unsetenv
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/cuda_device.h"  // is_available
#include "colossal/core/error.h"
#include "colossal/core/random.h"  // Generator, randn
#include "colossal/data/batch.h"   // stack_collate
#include "colossal/data/data_loader.h"
#include "colossal/data/synthetic.h"   // SyntheticImageDataset
#include "colossal/data/token_file.h"  // TokenFileDataset
#include "colossal/data/transforms.h"  // to_float_image, resize_bilinear, normalize
#include "colossal/engine/engine.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/resnet.h"
#include "colossal/nn/models/vit.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/lamb.h"
#include "colossal/optim/lr_scheduler.h"

namespace colossal::initialize {
namespace {

namespace fs = std::filesystem;
using config::TrainConfig;

const fs::path kConfigsDir = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs";

TrainConfig parse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return config::parse_config(toml, overrides, "test.toml");
}

/// Runs `f`, expecting colossal::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << parts.front() << "\"";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

/// A fresh folder for one test.
fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_builders_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_tokens(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary);
  for (uint16_t t : tokens) {
    const char bytes[2] = {static_cast<char>(t & 0xFF), static_cast<char>(t >> 8)};
    out.write(bytes, 2);
  }
}

/// CIFAR-10's binary layout with `records` images per file (label byte, then 3072 pixel bytes).
void write_fake_cifar10(const fs::path& dir, int records) {
  const std::vector<std::string> files = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                          "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  int image = 0;
  for (const std::string& name : files) {
    std::ofstream out(dir / name, std::ios::binary);
    for (int r = 0; r < records; ++r, ++image) {
      out.put(static_cast<char>(image % 10));
      for (int j = 0; j < 3072; ++j) out.put(static_cast<char>((image * 31 + j * 7 + j / 96) % 256));
    }
  }
}

bool all_finite(const Tensor& t) {
  for (float v : t.contiguous().to_vector<float>()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// The examples at `indices` collated into one batch.
data::Batch collate(const data::Dataset& dataset, const std::vector<int64_t>& indices) {
  std::vector<data::Example> examples;
  for (int64_t i : indices) examples.push_back(dataset.get(i));
  return data::stack_collate(examples, data::host_empty);
}

// ---- models -----------------------------------------------------------------------------------

constexpr const char* kSyntheticRgb = R"(
[data]
dataset = "synthetic"
options = { size = 16, test_size = 4, image_size = 8, channels = 3, num_classes = 5 }
)";

TEST(BuildersModel, ResnetFromPresetWithOptions) {
  const TrainConfig c = parse(std::string(kSyntheticRgb) + R"(
[model]
name = "resnet"
preset = "resnet18"
options = { layers = [1, 1, 1, 1], cifar_stem = true, zero_init_residual = true, width = 8 }
)");
  const Datasets d = make_datasets(c);
  core::Generator init(1), dropout(2);
  const auto model = make_model(c, d, init, dropout);
  const auto* resnet = dynamic_cast<nn::models::ResNet*>(model.get());
  ASSERT_NE(resnet, nullptr);
  EXPECT_EQ(resnet->config().block, nn::models::ResNetBlockKind::basic);
  EXPECT_EQ(resnet->config().layers, (std::array<int64_t, 4>{1, 1, 1, 1}));
  EXPECT_TRUE(resnet->config().cifar_stem);
  EXPECT_TRUE(resnet->config().zero_init_residual);
  EXPECT_EQ(resnet->config().num_classes, 5);
  EXPECT_EQ(resnet->config().in_chans, 3);
  EXPECT_EQ(resnet->config().width, 8);
  EXPECT_EQ(resnet->fc()->weight().size(1), 64);  // layer4 is 8 x 8 channels wide (basic blocks)
  // No GPU here: channels_last defaults to the CPU's NCHW.
  EXPECT_EQ(resnet->config().channels_last, core::cuda::is_available());
  const Tensor logits = model->forward(collate(*d.train, {0, 1}).input);
  EXPECT_EQ(logits.shape(), (Shape{2, 5}));
  EXPECT_TRUE(all_finite(logits));
}

TEST(BuildersModel, ResnetChannelsLastFromConfig) {
  const TrainConfig c = parse(std::string(kSyntheticRgb) + R"(
[model]
name = "resnet"
preset = "resnet18"
options = { layers = [1, 1, 1, 1], cifar_stem = true, width = 8, channels_last = true }
)");
  const Datasets d = make_datasets(c);
  core::Generator init(1), dropout(2);
  const auto model = make_model(c, d, init, dropout);
  const auto* resnet = dynamic_cast<nn::models::ResNet*>(model.get());
  ASSERT_NE(resnet, nullptr);
  EXPECT_TRUE(resnet->config().channels_last);
  // Images still go in as [B, C, H, W]; logits come out as [B, classes].
  const Tensor logits = model->forward(collate(*d.train, {0, 1}).input);
  EXPECT_EQ(logits.shape(), (Shape{2, 5}));
  EXPECT_TRUE(all_finite(logits));
}

TEST(BuildersModel, ResnetPresetsPickTheirBlock) {
  // resnet50 (and the empty preset) are bottleneck nets; layers keeps the test small.
  for (const char* preset : {"resnet50", ""}) {
    const TrainConfig c = parse(std::string(kSyntheticRgb) + "[model]\nname = \"resnet\"\npreset = \"" + preset +
                                "\"\noptions = { layers = [1, 1, 1, 1], num_classes = 7 }\n");
    const Datasets d = make_datasets(c);
    core::Generator init(1), dropout(2);
    const auto model = make_model(c, d, init, dropout);
    const auto& config = dynamic_cast<nn::models::ResNet&>(*model).config();
    EXPECT_EQ(config.block, nn::models::ResNetBlockKind::bottleneck) << preset;
    EXPECT_FALSE(config.cifar_stem);
    EXPECT_EQ(model->forward(collate(*d.train, {0, 1}).input).shape(), (Shape{2, 7}));
  }
}

TEST(BuildersModel, Gpt2PresetsAndOptions) {
  const TrainConfig medium = parse("[model]\nname = \"gpt2\"\npreset = \"gpt2-medium\"\n");
  const nn::models::GPT2Config m = gpt2_config(medium);
  EXPECT_EQ(m.n_layer, 24);
  EXPECT_EQ(m.n_embd, 1024);
  EXPECT_EQ(m.n_head, 16);
  const nn::models::GPT2Config base = gpt2_config(parse("[model]\nname = \"gpt2\"\n"));
  EXPECT_EQ(base.n_layer, 12);
  EXPECT_EQ(base.vocab_size, 50257);
  EXPECT_EQ(gpt2_config(parse("[model]\nname = \"gpt2\"\npreset = \"gpt2-xl\"\n")).n_embd, 1600);
  const nn::models::GPT2Config small = gpt2_config(parse(R"(
[model]
name = "gpt2"
preset = "gpt2-large"
options = { n_layer = 2, n_embd = 32, n_head = 4, n_positions = 16, vocab_size = 50, vocab_multiple = 16, dropout = 0.0 }
)"));
  EXPECT_EQ(small.n_layer, 2);
  EXPECT_EQ(small.n_embd, 32);
  EXPECT_EQ(small.n_head, 4);
  EXPECT_EQ(small.n_positions, 16);
  EXPECT_EQ(small.padded_vocab_size(), 64);
  EXPECT_EQ(small.dropout, 0.0);
}

TEST(BuildersModel, VitTakesTheGeometryAfterTheTransforms) {
  // 8 x 8 images resized to 12: the ViT is built for 12 x 12.
  const TrainConfig c = parse(R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2 }
[data]
dataset = "synthetic"
transforms = ["resize"]
options = { size = 8, test_size = 2, image_size = 8, channels = 3, num_classes = 4, resize = 12 }
)");
  const Datasets d = make_datasets(c);
  EXPECT_EQ(d.image_size, 12);
  core::Generator init(1), dropout(2);
  const auto model = make_model(c, d, init, dropout);
  EXPECT_EQ(dynamic_cast<nn::models::VisionTransformer&>(*model).config().img_size, 12);
  EXPECT_EQ(model->forward(collate(*d.train, {0, 1}).input).shape(), (Shape{2, 4}));
}

// ---- token data and the language-model loss ---------------------------------------------------

/// A tiny GPT-2 on a token file of `tokens` (ids below 50), seq_len T.
std::string gpt2_tokens_config(const fs::path& train, const fs::path& test, int seq_len) {
  return "[model]\nname = \"gpt2\"\n"
         "options = { n_layer = 1, n_embd = 16, n_head = 2, n_positions = 8, vocab_size = 50, vocab_multiple = 16, "
         "dropout = 0.0 }\n"
         "[data]\ndataset = \"tokens\"\npath = \"" +
         train.string() + "\"\n" + (test.empty() ? "" : "test_path = \"" + test.string() + "\"\n") +
         "batch_size = 2\nseq_len = " + std::to_string(seq_len) + "\n";
}

std::vector<uint16_t> token_sequence(int n) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 50));
  return tokens;
}

std::vector<int64_t> slice(const std::vector<uint16_t>& tokens, int64_t start, int64_t length) {
  return {tokens.begin() + start, tokens.begin() + start + length};
}

TEST(BuildersTokens, TargetsAreTheNextTokens) {
  const fs::path dir = temp_dir("tokens");
  const std::vector<uint16_t> train = token_sequence(101), test = token_sequence(41);
  write_tokens(dir / "train.bin", train);
  write_tokens(dir / "val.bin", test);
  const TrainConfig c = parse(gpt2_tokens_config(dir / "train.bin", dir / "val.bin", 6));
  const Datasets d = make_datasets(c);
  EXPECT_EQ(d.seq_len, 6);
  EXPECT_EQ(d.vocab_size, 50);
  EXPECT_EQ(d.image_size, 0);
  EXPECT_EQ(d.train_transform, nullptr);
  EXPECT_EQ(d.train->size(), 100 / 6);  // one pass's worth of windows
  const auto& windows = dynamic_cast<const data::TokenFileDataset&>(*d.train);
  for (int64_t i = 0; i < d.train->size(); ++i) {
    const data::Example e = d.train->get(i);
    ASSERT_EQ(e.input.shape(), (Shape{6}));
    ASSERT_EQ(e.target.shape(), (Shape{6}));
    const int64_t start = windows.window_start(i);
    EXPECT_EQ(e.input.to_vector<int64_t>(), slice(train, start, 6)) << "window " << i;
    EXPECT_EQ(e.target.to_vector<int64_t>(), slice(train, start + 1, 6)) << "window " << i;
  }
  // The test file: consecutive windows from the start.
  ASSERT_NE(d.test, nullptr);
  EXPECT_EQ(d.test->size(), 40 / 6);
  for (int64_t i = 0; i < d.test->size(); ++i) {
    EXPECT_EQ(d.test->get(i).input.to_vector<int64_t>(), slice(test, 6 * i, 6));
    EXPECT_EQ(d.test->get(i).target.to_vector<int64_t>(), slice(test, 6 * i + 1, 6));
  }
  // data.options: training windows per epoch, and a cap on the test windows.
  const TrainConfig capped = parse(gpt2_tokens_config(dir / "train.bin", dir / "val.bin", 6),
                                   {"data.options.num_samples=40", "data.options.test_num_samples=2"});
  EXPECT_EQ(make_datasets(capped).train->size(), 40);
  EXPECT_EQ(make_datasets(capped).test->size(), 2);
  EXPECT_EQ(make_datasets(
                parse(gpt2_tokens_config(dir / "train.bin", dir / "val.bin", 6), {"data.options.test_num_samples=100"}))
                .test->size(),
            6);
  // No test_path: no test set.
  EXPECT_EQ(make_datasets(parse(gpt2_tokens_config(dir / "train.bin", {}, 6))).test, nullptr);
}

TEST(BuildersTokens, SeqLenZeroIsTheModelContextAndLongerFails) {
  const fs::path dir = temp_dir("tokens_seq_len");
  write_tokens(dir / "train.bin", token_sequence(64));
  EXPECT_EQ(make_datasets(parse(gpt2_tokens_config(dir / "train.bin", {}, 0))).seq_len, 8);  // n_positions
  expect_error([&] { make_datasets(parse(gpt2_tokens_config(dir / "train.bin", {}, 9))); },
               {"data.seq_len = 9", "context of 8 positions"});
}

TEST(BuildersTokens, Gpt2LogitsAgainstNextTokensGiveTheLmLoss) {
  const fs::path dir = temp_dir("tokens_loss");
  write_tokens(dir / "train.bin", token_sequence(64));
  const TrainConfig c = parse(gpt2_tokens_config(dir / "train.bin", {}, 8));
  const Datasets d = make_datasets(c);
  core::Generator init(3), dropout(4);
  const auto model = make_model(c, d, init, dropout);
  ASSERT_NE(dynamic_cast<nn::models::GPT2*>(model.get()), nullptr);
  const data::Batch batch = collate(*d.train, {0, 1, 2});
  const Tensor logits = model->forward(batch.input);
  ASSERT_EQ(logits.shape(), (Shape{3, 8, 64}));  // vocab 50 padded to a multiple of 16
  const Tensor loss = make_criterion(c, d)(logits, batch.target);
  const Tensor expected = ops::cross_entropy(logits.reshape({24, 64}), batch.target.reshape({24}));
  // The same op on the same rows: equal up to summation order.
  EXPECT_NEAR(loss.item<float>(), expected.item<float>(), 1e-6);
  // Freshly initialised weights (std 0.02) give near-uniform logits: the loss is close to ln(64).
  EXPECT_NEAR(loss.item<float>(), std::log(64.0), 0.1);
}

TEST(BuildersTokens, MismatchedModelsAndSettingsFail) {
  const fs::path dir = temp_dir("tokens_errors");
  write_tokens(dir / "train.bin", token_sequence(64));
  const std::string tokens = gpt2_tokens_config(dir / "train.bin", {}, 8);
  // A language model with image data, image models with tokens.
  const TrainConfig gpt2_on_images = parse(std::string(kSyntheticRgb) + "[model]\nname = \"gpt2\"\n");
  const Datasets images = make_datasets(gpt2_on_images);
  core::Generator init(1), dropout(2);
  expect_error([&] { make_model(gpt2_on_images, images, init, dropout); }, {"data.dataset must be \"tokens\""});
  const std::string vit =
      "[model]\nname = \"vit\"\n[data]\ndataset = \"tokens\"\npath = \"" + (dir / "train.bin").string() + "\"\n";
  expect_error([&] { make_datasets(parse(vit)); }, {"model.name must be \"gpt2\", not \"vit\""});
  expect_error([&] { make_datasets(parse(tokens, {"data.transforms=[\"normalize\"]"})); },
               {"data.transforms", "takes none"});
  const TrainConfig smoothed = parse(tokens, {"train.label_smoothing=0.1"});
  expect_error([&] { make_criterion(smoothed, make_datasets(smoothed)); }, {"train.label_smoothing"});
  expect_error([&] { make_datasets(parse(tokens, {"data.options.num_sample=4"})); },
               {"data.options.num_sample", "did you mean \"num_samples\""});
}

// ---- image transforms and mixup ---------------------------------------------------------------

constexpr const char* kAugmentedConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2 }
[data]
dataset = "synthetic"
transforms = ["random_crop", "random_flip", "auto_augment", "resize", "normalize", "mixup"]
[data.options]
size = 16
test_size = 8
image_size = 8
channels = 3
num_classes = 4
dtype = "u8"
crop_padding = 2
resize = 12
normalize_mean = [0.5, 0.4, 0.3]
normalize_std = 0.25
mixup_alpha = 0.4
[train]
label_smoothing = 0.1
)";

TEST(BuildersTransforms, TrainingSetIsAugmentedTestSetOnlyDeterministic) {
  const TrainConfig c = parse(kAugmentedConfig);
  const Datasets d = make_datasets(c);
  EXPECT_EQ(d.image_size, 12);
  EXPECT_EQ(d.channels, 3);
  ASSERT_NE(d.train_transform, nullptr);
  ASSERT_NE(d.test_transform, nullptr);
  const std::string train = d.train_transform->name(), test = d.test_transform->name();
  for (const char* step : {"RandomCrop(8x8, padding=[2, 2, 2, 2]", "RandomHorizontalFlip(p=0.5)", "AutoAugment",
                           "ToTensor", "Resize(12x12", "Normalize"}) {
    EXPECT_NE(train.find(step), std::string::npos) << step << " missing from " << train;
  }
  for (const char* step : {"ToTensor", "Resize(12x12", "Normalize"}) {
    EXPECT_NE(test.find(step), std::string::npos) << step << " missing from " << test;
  }
  for (const char* step : {"RandomCrop", "RandomHorizontalFlip", "AutoAugment", "Mixup"}) {
    EXPECT_EQ(test.find(step), std::string::npos) << step << " in the test pipeline " << test;
  }
  // uint8 augmentations come before the conversion to float.
  EXPECT_LT(train.find("AutoAugment"), train.find("ToTensor"));

  // A test image is exactly normalize(resize(to_float(raw))), whatever the epoch.
  data::SyntheticImageOptions raw_options;
  raw_options.size = 8;
  raw_options.image_shape = {3, 8, 8};
  raw_options.num_classes = 4;
  raw_options.seed = static_cast<uint64_t>(c.train.seed) + 1;
  raw_options.dtype = DType::u8;
  const data::SyntheticImageDataset raw(raw_options);
  for (int64_t i = 0; i < 3; ++i) {
    const Tensor expected =
        data::normalize(data::resize_bilinear(data::to_float_image(raw.get(i).input), 12, 12), {0.5, 0.4, 0.3}, {0.25});
    d.test->set_epoch(0);
    EXPECT_EQ(d.test->get(i).input.to_vector<float>(), expected.to_vector<float>()) << "test image " << i;
    d.test->set_epoch(5);
    EXPECT_EQ(d.test->get(i).input.to_vector<float>(), expected.to_vector<float>()) << "test image " << i;
  }
  // Training images are drawn afresh each epoch (crop offsets, flips and AutoAugment policies).
  int changed = 0;
  for (int64_t i = 0; i < 8; ++i) {
    d.train->set_epoch(0);
    const Tensor first = d.train->get(i).input;
    EXPECT_EQ(first.shape(), (Shape{3, 12, 12}));
    EXPECT_EQ(first.to_vector<float>(), d.train->get(i).input.to_vector<float>()) << "same epoch, same image";
    d.train->set_epoch(1);
    changed += first.to_vector<float>() != d.train->get(i).input.to_vector<float>() ? 1 : 0;
  }
  // Each draw keeps an image unchanged with probability well under 1/2 (a 5 x 5 choice of crop
  // offsets alone); all 8 staying the same would mean the augmentations are not applied.
  EXPECT_GE(changed, 4);
}

TEST(BuildersTransforms, CenterCropAndAnUnaugmentedDataset) {
  // f32 synthetic images: center_crop takes the middle (offset rounded half to even), or pads.
  const std::string base = R"(
[data]
dataset = "synthetic"
transforms = ["center_crop"]
options = { size = 4, test_size = 2, image_size = 6, channels = 1, num_classes = 2, center_crop = CROP }
)";
  auto with_crop = [&](int crop) {
    std::string text = base;
    text.replace(text.find("CROP"), 4, std::to_string(crop));
    return make_datasets(parse(text));
  };
  data::SyntheticImageOptions raw_options;
  raw_options.size = 2;
  raw_options.image_shape = {1, 6, 6};
  raw_options.num_classes = 2;
  raw_options.seed = 1024 + 1;  // train.seed's default + 1, as the test split
  const Tensor raw = data::SyntheticImageDataset(raw_options).get(0).input;
  const Datasets cropped = with_crop(3);
  EXPECT_EQ(cropped.image_size, 3);
  // torchvision: top = round((6 - 3) / 2) = round(1.5) = 2.
  EXPECT_EQ(cropped.test->get(0).input.to_vector<float>(), data::crop(raw, 2, 2, 3, 3).to_vector<float>());
  const Datasets padded = with_crop(8);
  EXPECT_EQ(padded.test->get(0).input.to_vector<float>(), data::pad(raw, 1, 1, 1, 1).to_vector<float>());

  // No transforms: the datasets are used as they are.
  const Datasets plain = make_datasets(parse(kSyntheticRgb));
  EXPECT_EQ(plain.train_transform, nullptr);
  EXPECT_EQ(plain.batch_transform, nullptr);
  EXPECT_EQ(plain.image_size, 8);
}

TEST(BuildersTransforms, MixupGivesSoftTargetsAndTheCriterionSoftCrossEntropy) {
  const TrainConfig c = parse(kAugmentedConfig);
  const Datasets d = make_datasets(c);
  ASSERT_NE(d.batch_transform, nullptr);
  EXPECT_NE(d.batch_transform->name().find("Mixup"), std::string::npos);
  data::Batch batch = collate(*d.train, {0, 1, 2, 3});
  ASSERT_EQ(batch.target.shape(), (Shape{4}));
  core::Generator generator(11);
  d.batch_transform->apply(batch, generator, data::host_empty);
  ASSERT_EQ(batch.target.shape(), (Shape{4, 4}));
  ASSERT_EQ(batch.target.dtype(), DType::f32);
  const std::vector<float> soft = batch.target.to_vector<float>();
  for (int row = 0; row < 4; ++row) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      // train.label_smoothing = 0.1 is blended in: every class keeps at least 0.1 / 4.
      EXPECT_GE(soft[row * 4 + k], 0.025f - 1e-6f);
      sum += soft[row * 4 + k];
    }
    EXPECT_NEAR(sum, 1.0f, 1e-6f);  // four f32 additions of values <= 1
  }

  const engine::Criterion criterion = make_criterion(c, d);
  core::Generator logits_generator(12);
  const Tensor logits = core::randn({4, 4}, {}, &logits_generator);
  // Mixed batches: soft-target cross-entropy without smoothing on top (it is in the targets).
  EXPECT_FLOAT_EQ(criterion(logits, batch.target).item<float>(),
                  ops::cross_entropy(logits, batch.target).item<float>());
  // Unmixed test batches: class indices with train.label_smoothing.
  const Tensor labels = core::from_vector<int64_t>({0, 3, 1, 2}, {4});
  EXPECT_FLOAT_EQ(criterion(logits, labels).item<float>(),
                  ops::cross_entropy(logits, labels, {.label_smoothing = 0.1}).item<float>());
  EXPECT_NE(criterion(logits, labels).item<float>(), ops::cross_entropy(logits, labels).item<float>());

  // Without mixup: hard targets only, and the model may have more classes than the data.
  const TrainConfig plain = parse(kSyntheticRgb);
  EXPECT_FLOAT_EQ(make_criterion(plain, make_datasets(plain))(logits, labels).item<float>(),
                  ops::cross_entropy(logits, labels).item<float>());
}

TEST(BuildersTransforms, DataPathExpandsEnvironmentVariables) {
  const fs::path dir = temp_dir("cifar_env");
  write_fake_cifar10(dir, 3);
  ASSERT_EQ(::setenv("COLOSSAL_BUILDERS_TEST_DATA", dir.c_str(), 1), 0);
  const std::string config = R"(
[data]
dataset = "cifar10"
path = "${COLOSSAL_BUILDERS_TEST_DATA}"
transforms = ["random_crop", "auto_augment", "normalize"]
)";
  const Datasets d = make_datasets(parse(config));
  EXPECT_EQ(d.train->size(), 15);
  EXPECT_EQ(d.test->size(), 3);
  EXPECT_EQ(d.image_size, 32);
  EXPECT_EQ(d.test->get(0).input.shape(), (Shape{3, 32, 32}));
  // CIFAR-10's own statistics by default.
  EXPECT_NE(d.test_transform->name().find("0.4914"), std::string::npos) << d.test_transform->name();
  EXPECT_EQ(make_datasets(parse(config, {"data.path=$COLOSSAL_BUILDERS_TEST_DATA"})).train->size(), 15);
  // Options that belong to the synthetic dataset.
  expect_error([&] { make_datasets(parse(config, {"data.options.image_size=16"})); },
               {"data.options.image_size applies to data.dataset = \"synthetic\" only"});
  ASSERT_EQ(::unsetenv("COLOSSAL_BUILDERS_TEST_DATA"), 0);
  expect_error([&] { make_datasets(parse(config)); },
               {"data.path = \"${COLOSSAL_BUILDERS_TEST_DATA}\"", "COLOSSAL_BUILDERS_TEST_DATA is not set"});
}

// ---- bad options ------------------------------------------------------------------------------

TEST(BuildersBadOptions, ErrorsNameTheKey) {
  const TrainConfig augmented = parse(kAugmentedConfig);
  const auto datasets = [&](const std::vector<std::string>& overrides) {
    make_datasets(parse(kAugmentedConfig, overrides));
  };
  expect_error([&] { datasets({"data.options.crop_paddng=4"}); },
               {"data.options.crop_paddng", "did you mean \"crop_padding\""});
  expect_error([&] { datasets({"data.options.mixup_alpha=0"}); }, {"data.options.mixup_alpha = 0"});
  expect_error([&] { datasets({"data.options.crop_padding=\"four\""}); }, {"data.options.crop_padding", "integer"});
  expect_error([&] { datasets({"data.options.normalize_std=[0.2, 0.3]"}); },
               {"data.options.normalize_std has 2 values", "one per channel (3)"});
  expect_error([&] { datasets({"data.options.normalize_std=0"}); }, {"data.options.normalize_std must be positive"});
  expect_error([&] { datasets({"data.options.crop_padding_mode=\"wrap\""}); },
               {"data.options.crop_padding_mode = \"wrap\"", "\"reflect\""});
  expect_error([&] { datasets({"data.options.crop_size=13"}); }, {"data.options.crop_size = 13", "larger than"});
  expect_error([&] { datasets({"data.options.flip_p=1.5"}); }, {"data.options.flip_p", "out of range"});
  // The list of transforms against the options and the pixel type.
  const auto u8_images = [](const std::string& transforms, const std::string& options) {
    make_datasets(parse("[data]\ndataset = \"synthetic\"\ntransforms = " + transforms +
                        "\noptions = { size = 8, test_size = 2, image_size = 8, channels = 3, num_classes = 4, "
                        "dtype = \"u8\"" +
                        (options.empty() ? "" : ", " + options) + " }\n"));
  };
  const std::string stats = "normalize_mean = 0.5, normalize_std = 0.25";
  expect_error([&] { u8_images(R"(["random_flip", "normalize", "auto_augment"])", stats); },
               {"\"auto_augment\" works on uint8 images", "before \"normalize\""});
  expect_error([&] { u8_images(R"(["random_flip", "random_flip"])", ""); },
               {"data.transforms lists \"random_flip\" twice"});
  expect_error([&] { u8_images(R"(["random_crop", "resize"])", "resize = 4, " + stats); },
               {"data.options.normalize_mean is set but data.transforms has no \"normalize\""});
  expect_error([&] { u8_images(R"(["random_crop"])", "crop_size = 6"); },
               {"training images come out 6 x 6 but test images 8 x 8", "center_crop"});
  expect_error([&] { u8_images(R"(["resize"])", ""); }, {"data.options.resize", "not set"});
  expect_error([&] { u8_images(R"(["normalize"])", ""); }, {"needs data.options.normalize_mean"});
  expect_error([&] { datasets({"data.options.dtype=\"f32\""}); },
               {"\"auto_augment\" works on uint8 images", "data.options.dtype = \"u8\""});
  expect_error([&] { datasets({"data.options.dtype=\"u16\""}); }, {"data.options.dtype = \"u16\""});

  const Datasets d = make_datasets(augmented);
  core::Generator init(1), dropout(2);
  const auto model = [&](const std::string& model_section) {
    const TrainConfig c = parse(std::string(kSyntheticRgb) + model_section);
    make_model(c, make_datasets(c), init, dropout);
  };
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { cifar_stme = true }\n"); },
               {"model.options.cifar_stme", "did you mean \"cifar_stem\""});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { cifar_stem = 3 }\n"); },
               {"model.options.cifar_stem = 3", "boolean"});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { block = \"wide\" }\n"); },
               {"model.options.block = \"wide\""});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { layers = [1, 2] }\n"); },
               {"model.options.layers has 2 entries"});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { layers = [1, 0, 1, 1] }\n"); },
               {"model.options.layers = [1, 0, 1, 1]"});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { in_chans = 1 }\n"); },
               {"model.options.in_chans = 1"});
  expect_error([&] { model("[model]\nname = \"resnet\"\noptions = { num_classes = 3 }\n"); },
               {"model.options.num_classes = 3 is fewer than the 5 classes"});
  expect_error([&] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { n_layers = 2 }\n")); },
               {"model.options.n_layers", "did you mean \"n_layer\""});
  expect_error([&] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { n_head = 5 }\n")); },
               {"model.options", "n_head"});
  expect_error([&] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { dropout = 2.0 }\n")); },
               {"model.options.dropout", "out of range"});
  expect_error([&] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { vocab_size = 70000 }\n")); },
               {"model.options.vocab_size = 70000", "out of range"});
  // Mixup's soft targets have one column per data class.
  const TrainConfig wide = parse(kAugmentedConfig, {"model.options.num_classes=6"});
  expect_error([&] { make_model(wide, d, init, dropout); },
               {"model.options.num_classes = 6 must equal the dataset's 4 classes with mixup"});
}

// Weight decay skips biases and norm parameters unless the config asks for decay everywhere.
TEST(BuildersOptimizer, BiasesAndNormsGoToTheNoDecayGroup) {
  const TrainConfig adamw = parse(
      "[model]\nname = \"vit\"\noptions = { patch_size = 4, embed_dim = 8, depth = 1, num_heads = 2 }\n"
      "[data]\noptions = { image_size = 8 }\n[optimizer]\nname = \"adamw\"\nweight_decay = 0.05\n");
  Datasets d = make_datasets(adamw);
  core::Generator init(1), dropout(2);
  auto model = make_model(adamw, d, init, dropout);
  auto optimizer = make_optimizer(adamw, model->named_parameters());
  const auto& groups = optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].options.at("weight_decay"), 0.05);
  EXPECT_EQ(groups[1].options.at("weight_decay"), 0.0);
  size_t decayed = 0, total = 0;
  for (const auto& [name, param] : model->named_parameters()) {
    ++total;
    const bool expect_decay = !optim::default_no_weight_decay(name, param);
    decayed += expect_decay ? 1 : 0;
    const auto& group = groups[expect_decay ? 0 : 1].params;
    EXPECT_TRUE(std::any_of(group.begin(), group.end(), [&](const Tensor& t) { return t.is_same(param); })) << name;
  }
  EXPECT_EQ(groups[0].params.size(), decayed);
  EXPECT_EQ(groups[0].params.size() + groups[1].params.size(), total);

  const TrainConfig everywhere = parse("[optimizer]\nweight_decay = 0.05\nno_decay_bias_and_norm = false\n");
  auto single = make_optimizer(everywhere, model->named_parameters());
  ASSERT_EQ(single->param_groups().size(), 1u);
  EXPECT_EQ(single->param_groups()[0].params.size(), total);
}

TEST(BuildersScheduler, WarmupLongerThanAShortenedRunIsCompressed) {
  const Tensor weight = core::ones({2}, TensorOptions(DType::f32).with_requires_grad(true));
  const TrainConfig linear = parse("[optimizer]\nlr = 1.0\n[lr_scheduler]\nname = \"linear\"\nwarmup_epochs = 5\n");
  auto optimizer = make_optimizer(linear, {weight});
  // 5 warmup epochs of 2 steps in a run of 2 updates (train.max_steps = 2): warm up over 1.
  const auto scheduler = make_scheduler(linear, *optimizer, 2, 2);
  ASSERT_NE(dynamic_cast<optim::LinearWarmupLR*>(scheduler.get()), nullptr);
  const TrainConfig cosine = parse("[lr_scheduler]\nname = \"cosine\"\nwarmup_steps = 200\n", {"train.max_steps=2"});
  EXPECT_NE(make_scheduler(cosine, *optimizer, 2, 1), nullptr);
  // An explicit total_steps shorter than the warmup is a mistake in the config (the loader catches
  // it for warmup_steps; warmup_epochs are known only here).
  const TrainConfig explicit_total = parse("[lr_scheduler]\nname = \"cosine\"\nwarmup_epochs = 5\ntotal_steps = 8\n");
  expect_error([&] { make_scheduler(explicit_total, *optimizer, 1000, 2); },
               {"lr_scheduler.warmup_epochs (10 steps) must be shorter than lr_scheduler.total_steps = 8"});
}

// ---- the configs in configs/ ------------------------------------------------------------------

TEST(BuildersConfigs, EveryConfigLoads) {
  std::vector<fs::path> configs;
  for (const auto& entry : fs::directory_iterator(kConfigsDir)) {
    if (entry.path().extension() == ".toml") configs.push_back(entry.path());
  }
  ASSERT_GE(configs.size(), 3u) << kConfigsDir;
  for (const fs::path& path : configs) {
    EXPECT_NO_THROW(config::load_config(path, {"train.max_steps=2"})) << path;
  }

  const TrainConfig vit = config::load_config(kConfigsDir / "vit_b16_cifar10.toml");
  EXPECT_EQ(vit.model.preset, "vit_base_patch16_224");
  EXPECT_EQ(vit.optimizer.name, config::OptimizerName::kLamb);
  EXPECT_EQ(vit.lr_scheduler.name, config::SchedulerName::kLinear);
  EXPECT_GT(vit.lr_scheduler.warmup_epochs, 0);
  EXPECT_EQ(vit.gradient_accumulation, 16);
  EXPECT_EQ(vit.clip_grad_norm, 1.0);
  for (const char* t : {"auto_augment", "mixup", "resize"}) {
    EXPECT_NE(std::find(vit.data.transforms.begin(), vit.data.transforms.end(), t), vit.data.transforms.end()) << t;
  }
  const TrainConfig resnet = config::load_config(kConfigsDir / "resnet50_cifar10.toml");
  EXPECT_EQ(resnet.model.name, config::ModelName::kResnet);
  EXPECT_EQ(resnet.model.preset, "resnet50");
  const TrainConfig gpt2 = config::load_config(kConfigsDir / "gpt2_tokens.toml");
  EXPECT_EQ(gpt2.model.preset, "gpt2");
  EXPECT_EQ(gpt2.data.dataset, config::DatasetName::kTokens);
}

/// Builds every piece of `c` and takes two optimizer updates through a DataLoader (with the
/// batch transform) and the Engine; returns the two losses.
std::vector<double> two_updates(const TrainConfig& c) {
  Datasets d = make_datasets(c);
  core::Generator init(5), dropout(6);
  std::shared_ptr<nn::Module> model = make_model(c, d, init, dropout);
  std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(c, model->parameters());
  std::shared_ptr<optim::LRScheduler> scheduler = make_scheduler(c, *optimizer, 100000, 10);
  engine::EngineOptions eo;
  eo.gradient_accumulation = c.gradient_accumulation;
  if (c.clip_grad_norm > 0) eo.clip_grad_norm = c.clip_grad_norm;
  engine::Engine engine(model, optimizer, make_criterion(c, d), eo, scheduler);
  data::DataLoaderOptions lo;
  lo.batch_size = c.data.batch_size;
  lo.drop_last = true;
  lo.batch_transform = d.batch_transform;
  data::DataLoader loader(d.train, lo);
  std::vector<double> losses;
  engine.train();
  for (data::Batch& batch : loader) {
    const Tensor loss = engine.step(batch.input, batch.target);
    EXPECT_TRUE(std::isfinite(loss.item<float>()));
    if (engine.last_step_updated()) losses.push_back(loss.item<float>());
    if (losses.size() == 2) break;
  }
  EXPECT_EQ(losses.size(), 2u) << "the loader ran out before two updates";
  if (d.test) {
    // Test batches go through the criterion unmixed.
    engine.eval();
    const data::Batch test = collate(*d.test, {0, 1});
    EXPECT_TRUE(std::isfinite(engine.criterion(engine.evaluate(test.input), test.target).item<float>()));
  }
  return losses;
}

/// A folder of CIFAR-10 stand-in files with 16 images per file (80 training images: two updates
/// of 16 accumulated batches of 2).
std::string stand_in_cifar10(const std::string& name) {
  // CIFAR-10 itself is not on the test machines: a few records in its format stand in for it.
  const fs::path dir = temp_dir(name);
  write_fake_cifar10(dir, 16);
  return "data.path=" + dir.string();
}

TEST(BuildersConfigs, VitB16Cifar10BuildsAndTrainsOnStandInData) {
  // The model shrinks (depth, width) so that the run takes about a second; every other setting (the
  // transforms up to 224 x 224, mixup, accumulation 16, LAMB, the warmup) is the config's own.
  const TrainConfig vit = config::load_config(
      kConfigsDir / "vit_b16_cifar10.toml",
      {stand_in_cifar10("vit_config"), "data.batch_size=2", "data.num_workers=0", "model.options.depth=1",
       "model.options.embed_dim=24", "model.options.num_heads=2", "train.max_steps=2"});
  Datasets d = make_datasets(vit);
  EXPECT_EQ(d.image_size, 224);
  EXPECT_NE(d.batch_transform, nullptr);
  core::Generator init(1), dropout(2);
  auto model = make_model(vit, d, init, dropout);
  auto optimizer = make_optimizer(vit, model->parameters());
  EXPECT_NE(dynamic_cast<optim::Lamb*>(optimizer.get()), nullptr);
  EXPECT_NE(dynamic_cast<optim::LinearWarmupLR*>(make_scheduler(vit, *optimizer, 100000, 10).get()), nullptr);
  two_updates(vit);
}

TEST(BuildersConfigs, Resnet50Cifar10BuildsAndTrainsOnStandInData) {
  // One bottleneck block per stage instead of ResNet-50's [3, 4, 6, 3]; the rest is the config's.
  const TrainConfig resnet = config::load_config(kConfigsDir / "resnet50_cifar10.toml",
                                                 {stand_in_cifar10("resnet_config"), "data.batch_size=2",
                                                  "data.num_workers=0", "model.options.layers=[1, 1, 1, 1]"});
  EXPECT_EQ(make_datasets(resnet).image_size, 32);
  two_updates(resnet);
}

TEST(BuildersConfigs, Gpt2TokensConfigBuildsAndTrains) {
  const fs::path dir = temp_dir("gpt2_config");
  write_tokens(dir / "train.bin", token_sequence(400));
  write_tokens(dir / "val.bin", token_sequence(100));
  const std::string data_dir = dir.string();
  ASSERT_EQ(::setenv("DATA", data_dir.c_str(), 1), 0);
  // GPT-2's 50257-token vocabulary, but 1 layer of width 32 and a 16-token window.
  const TrainConfig c = config::load_config(kConfigsDir / "gpt2_tokens.toml",
                                            {"data.batch_size=2", "data.seq_len=16", "model.options.n_layer=1",
                                             "model.options.n_embd=32", "model.options.n_head=2", "train.max_steps=2"});
  const Datasets d = make_datasets(c);
  EXPECT_EQ(d.seq_len, 16);
  EXPECT_EQ(d.vocab_size, 50257);
  two_updates(c);
  ASSERT_EQ(::unsetenv("DATA"), 0);
}

}  // namespace
}  // namespace colossal::initialize
