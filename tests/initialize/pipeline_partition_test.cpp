// How colossal train cuts a model's pieces among pipeline stages (initialize/pipeline_stage.h's
// plan_pipeline): parallel.partition "balanced" (by parameters, the tied wte counted in the head),
// "uniform" (by pieces) and "measured" (by each piece's measured time), or parallel.partition_sizes
// (explicit pieces per part, in part order), and the errors that name the keys.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/initialize/pipeline_stage.h"
#include "colossal/nn/models/gpt2.h"

namespace colossal::initialize {
namespace {

using parallel::pp::PieceRange;
using parallel::pp::StageParts;

/// A tiny GPT-2 of 4 blocks: 6 pieces (the embedding, h.0-h.3, the head with the tied wte).
std::vector<std::shared_ptr<nn::Module>> gpt2_pieces(std::shared_ptr<nn::models::GPT2>& keep) {
  nn::models::GPT2Config g;
  g.vocab_size = 512;
  g.n_positions = 16;
  g.n_embd = 16;
  g.n_layer = 4;
  g.n_head = 2;
  core::Generator init(3);
  keep = std::make_shared<nn::models::GPT2>(g, &init);
  return pipeline_pieces(*keep);
}

config::ParallelConfig pipeline(int stages, int chunks = 1) {
  config::ParallelConfig p;
  p.pipeline = stages;
  p.num_chunks = chunks;
  return p;
}

std::string error_of(const std::vector<std::shared_ptr<nn::Module>>& pieces, const config::ParallelConfig& p) {
  try {
    (void)plan_pipeline(pieces, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelinePartition, TheConfigKeysLoadAndAreChecked) {
  const config::TrainConfig c = config::parse_config(
      "[parallel]\npipeline = 2\npartition = \"uniform\"\npartition_sizes = [2, 4]\n", {}, "test.toml");
  EXPECT_EQ(c.parallel.partition, config::PipelinePartition::kUniform);
  EXPECT_EQ(c.parallel.partition_sizes, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(
      config::parse_config("[parallel]\npipeline = 2\npartition = \"measured\"\n", {}, "test.toml").parallel.partition,
      config::PipelinePartition::kMeasured);
  try {
    (void)config::parse_config("[parallel]\npartition = \"even\"\n", {}, "test.toml");
    ADD_FAILURE() << "an unknown partition loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parallel.partition"), std::string::npos) << m;
    EXPECT_NE(m.find("uniform"), std::string::npos) << m;
  }
  try {
    (void)config::parse_config("[parallel]\npartition_sizes = [3, 0]\n", {}, "test.toml");
    ADD_FAILURE() << "a part of 0 pieces loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.partition_sizes"), std::string::npos) << e.what();
  }
}

TEST(PipelinePartition, BalancedUniformAndExplicit) {
  std::shared_ptr<nn::models::GPT2> model;
  const auto pieces = gpt2_pieces(model);
  ASSERT_EQ(pieces.size(), 6u);

  // Balanced: the head carries the 512 x 16 wte (8192 of the embedding stage's weight goes there),
  // so the head's stage takes fewer blocks than the first.
  config::ParallelConfig p = pipeline(2);
  const StageParts balanced = plan_pipeline(pieces, p);
  ASSERT_EQ(balanced.size(), 2u);
  EXPECT_GT(balanced[0][0].end - balanced[0][0].begin, balanced[1][0].end - balanced[1][0].begin)
      << parallel::pp::describe(balanced);
  EXPECT_EQ(describe_partition(p), "balanced by parameters");

  p.partition = config::PipelinePartition::kUniform;
  EXPECT_EQ(plan_pipeline(pieces, p), (StageParts{{PieceRange{0, 3}}, {PieceRange{3, 6}}}));
  EXPECT_EQ(describe_partition(p), "uniform by pieces");

  // Interleaved, 2 chunks of 3 pieces each cut among the 2 stages: stage 0 holds parts 0 and 2.
  config::ParallelConfig v2 = pipeline(2, 2);
  v2.partition = config::PipelinePartition::kUniform;
  const StageParts interleaved = plan_pipeline(pieces, v2);
  ASSERT_EQ(interleaved.size(), 2u);
  ASSERT_EQ(interleaved[0].size(), 2u);
  EXPECT_EQ(interleaved[0][0].begin, 0);
  EXPECT_EQ(interleaved[1][1].end, 6);

  // Explicit sizes win over partition.
  p.partition_sizes = {2, 4};
  EXPECT_EQ(plan_pipeline(pieces, p), (StageParts{{PieceRange{0, 2}}, {PieceRange{2, 6}}}));
  EXPECT_EQ(describe_partition(p), "cut as parallel.partition_sizes = [2, 4]");
}

TEST(PipelinePartition, MeasuredBalancesTheTimesOfThePieces) {
  std::shared_ptr<nn::models::GPT2> model;
  const auto pieces = gpt2_pieces(model);
  config::ParallelConfig p = pipeline(2);
  p.partition = config::PipelinePartition::kMeasured;
  EXPECT_EQ(describe_partition(p), "balanced by measured times");
  // A head that takes as long as the four blocks gets a stage of its own with the last block.
  EXPECT_EQ(plan_pipeline(pieces, p, {1, 1, 1, 1, 1, 4}), (StageParts{{PieceRange{0, 5}}, {PieceRange{5, 6}}}));
  EXPECT_EQ(plan_pipeline(pieces, p, {5, 1, 1, 1, 1, 1}), (StageParts{{PieceRange{0, 1}}, {PieceRange{1, 6}}}));
  const std::string m = error_of(pieces, p);  // no times
  EXPECT_NE(m.find("parallel.partition = \"measured\": 0 measured times for the model's 6 pieces"), std::string::npos)
      << m;

  // The times themselves: every piece, forward and backward of a microbatch of token ids, positive; the
  // pieces' gradients dropped afterwards (the tied wte's two pieces included).
  config::TrainConfig c;
  c.parallel = p;
  c.parallel.num_microbatches = 2;
  c.data.batch_size = 4;
  c.data.seq_len = 8;
  const Tensor sample = pipeline_sample_microbatch(*model, c, Tensor(), Device{});
  EXPECT_EQ(sample.shape(), (Shape{2, 8}));
  EXPECT_EQ(sample.dtype(), DType::i64);
  const std::vector<double> seconds = measure_pipeline_pieces(pieces, sample, 2);
  ASSERT_EQ(seconds.size(), pieces.size());
  for (double t : seconds) EXPECT_GT(t, 0.0);
  for (const auto& [name, param] : model->named_parameters()) EXPECT_FALSE(param.grad().defined()) << name;

  // In the run's 16-bit dtype (each piece converted, as mixed precision converts its stage, and put
  // back): times for every piece, the parameters still the same f32 tensors, no gradient left.
  std::map<std::string, const core::TensorImpl*> before;
  for (const auto& [name, param] : model->named_parameters()) before.emplace(name, param.impl());
  c.bf16 = true;
  ASSERT_EQ(pipeline_compute_dtype(c), DType::bf16);
  const std::vector<double> bf16 = measure_pipeline_pieces(pieces, sample, 1, pipeline_compute_dtype(c));
  ASSERT_EQ(bf16.size(), pieces.size());
  for (double t : bf16) EXPECT_GT(t, 0.0);
  for (const auto& [name, param] : model->named_parameters()) {
    EXPECT_EQ(param.dtype(), DType::f32) << name;
    EXPECT_EQ(param.impl(), before.at(name)) << name;
    EXPECT_FALSE(param.grad().defined()) << name;
  }
  c.bf16 = false;
  c.fp16.mode = config::AmpMode::kNaive;
  EXPECT_EQ(pipeline_compute_dtype(c), DType::f16);
  c.fp16.mode = config::AmpMode::kOff;
  EXPECT_EQ(pipeline_compute_dtype(c), std::nullopt);
}

TEST(PipelinePartition, CutBeforeBuildingEqualsTheCutOfTheWholeModel) {
  // Note [Stage pieces built alone]: the cut made before building is the whole model's, for GPT-2 and
  // ViT (from a probe) and ResNet (from its computed counts), by parameters (with GPT-2's tied wte),
  // uniformly and as listed; none where the whole model is built.
  config::TrainConfig c;
  c.parallel.pipeline = 2;
  c.model.name = config::ModelName::kGpt2;
  c.model.options.set("n_layer", config::OptionValue{int64_t{5}});
  c.model.options.set("n_embd", config::OptionValue{int64_t{32}});
  c.model.options.set("n_head", config::OptionValue{int64_t{2}});
  Datasets tokens;
  tokens.seq_len = 8;
  tokens.vocab_size = 50257;
  Datasets images;
  images.channels = 3;
  images.image_size = 16;
  images.num_classes = 10;
  config::TrainConfig vit;
  vit.parallel = c.parallel;
  vit.model.name = config::ModelName::kVit;
  vit.model.preset = "vit_tiny_patch4_32";
  vit.model.options.set("img_size", config::OptionValue{int64_t{16}});
  vit.model.options.set("depth", config::OptionValue{int64_t{5}});
  // ResNets of 7 pieces (the stem, 5 blocks, the head), whose blocks differ (Note [Stage pieces built
  // alone]: their counts are computed): basic blocks with the CIFAR stem, bottlenecks with ImageNet's.
  const auto resnet = [&c](const std::string& preset, const std::string& options) {
    config::TrainConfig r = config::parse_config("[model]\nname = \"resnet\"\npreset = \"" + preset +
                                                     "\"\noptions = { " + options + " }\n[train]\ndevice = \"cpu\"\n",
                                                 {}, "test.toml");
    r.parallel = c.parallel;
    return r;
  };
  const config::TrainConfig basic = resnet("resnet18", "cifar_stem = true, width = 8, layers = [1, 1, 2, 1]");
  const config::TrainConfig bottleneck = resnet("resnet50", "width = 4, layers = [2, 1, 1, 1]");
  for (const auto& [cfg, data] :
       {std::pair{c, tokens}, std::pair{vit, images}, std::pair{basic, images}, std::pair{bottleneck, images}}) {
    SCOPED_TRACE(std::string(config::to_string(cfg.model.name)) + " " + cfg.model.preset);
    for (int chunks : {1, 2}) {
      for (auto partition : {config::PipelinePartition::kBalanced, config::PipelinePartition::kUniform}) {
        config::TrainConfig t = cfg;
        t.parallel.num_chunks = chunks;
        t.parallel.partition = partition;
        if (partition == config::PipelinePartition::kUniform && 7 % chunks != 0) continue;
        core::Generator init(1), dropout(2);
        const std::shared_ptr<nn::Module> whole = make_model(t, data, init, dropout, ModelBuild{.quiet = true});
        const std::optional<StageParts> planned = plan_before_building(t, data);
        ASSERT_TRUE(planned.has_value());
        EXPECT_EQ(*planned, plan_pipeline(pipeline_pieces(*whole), t.parallel))
            << parallel::pp::describe(*planned) << " chunks " << chunks;
        const nn::models::PieceFilter mine = stage_pieces(*planned, 1);
        for (const parallel::pp::PieceRange& r : (*planned)[1]) EXPECT_TRUE(mine(static_cast<size_t>(r.begin)));
        for (const parallel::pp::PieceRange& r : (*planned)[0]) EXPECT_FALSE(mine(static_cast<size_t>(r.begin)));
      }
    }
    config::TrainConfig listed = cfg;
    listed.parallel.partition_sizes = {2, 5};
    EXPECT_EQ(*plan_before_building(listed, data), (StageParts{{PieceRange{0, 2}}, {PieceRange{2, 7}}}));
  }
  // ResNet-50 itself (18 pieces) over 4 stages: its blocks weigh from 70k (layer1) to 4.5M (layer4.0)
  // parameters, so the balanced cut is no uniform one.
  config::TrainConfig resnet50 = resnet("resnet50", "cifar_stem = true");
  resnet50.parallel.pipeline = 4;
  for (int chunks : {1, 2}) {
    for (auto partition : {config::PipelinePartition::kBalanced, config::PipelinePartition::kUniform}) {
      config::TrainConfig t = resnet50;
      t.parallel.num_chunks = chunks;
      t.parallel.partition = partition;
      core::Generator init(1), dropout(2);
      const std::shared_ptr<nn::Module> whole = make_model(t, images, init, dropout, ModelBuild{.quiet = true});
      const std::optional<StageParts> planned = plan_before_building(t, images);
      ASSERT_TRUE(planned.has_value());
      const StageParts cut = plan_pipeline(pipeline_pieces(*whole), t.parallel);
      EXPECT_EQ(*planned, cut) << parallel::pp::describe(*planned) << " chunks " << chunks;
      if (partition == config::PipelinePartition::kBalanced) {
        EXPECT_NE(cut, parallel::pp::partition_uniform(18, 4, chunks)) << parallel::pp::describe(cut);
      }
    }
  }
  config::TrainConfig listed50 = resnet50;
  listed50.parallel.partition_sizes = {1, 3, 4, 10};
  EXPECT_EQ(*plan_before_building(listed50, images),
            (StageParts{{PieceRange{0, 1}}, {PieceRange{1, 4}}, {PieceRange{4, 8}}, {PieceRange{8, 18}}}));
  // The model's options are checked before anything is cut, naming the key.
  std::string error;
  try {
    (void)plan_before_building(resnet("resnet18", "block = \"wide\""), images);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("model.options.block = \"wide\""), std::string::npos) << error;
  // A measured cut without a MeasuredCutSetup is left to make_pipeline_stage (the CLI tests time the
  // probes: TrainPipelineTensor.*).
  config::TrainConfig measured = c;
  measured.parallel.partition = config::PipelinePartition::kMeasured;
  EXPECT_FALSE(plan_before_building(measured, tokens).has_value());
  config::TrainConfig measured_resnet = basic;
  measured_resnet.parallel.partition = config::PipelinePartition::kMeasured;
  EXPECT_FALSE(plan_before_building(measured_resnet, images).has_value());
  config::TrainConfig serial = c;
  serial.parallel.pipeline = 1;
  EXPECT_FALSE(plan_before_building(serial, tokens).has_value());
  // Imported weights are cut alike: each stage then reads its own pieces' tensors (Note [Weights of
  // the pieces held] in nn/hub_weights.h).
  config::TrainConfig imported = c;
  imported.model.weights = "gpt2.safetensors";
  ASSERT_TRUE(plan_before_building(imported, tokens).has_value());
  EXPECT_EQ(plan_before_building(imported, tokens), plan_before_building(c, tokens));
  config::TrainConfig imported_resnet = basic;
  imported_resnet.model.weights = "resnet18.safetensors";
  ASSERT_TRUE(plan_before_building(imported_resnet, images).has_value());
  EXPECT_EQ(plan_before_building(imported_resnet, images), plan_before_building(basic, images));
}

TEST(PipelinePartition, ErrorsNameTheKeysAndTheNumbers) {
  std::shared_ptr<nn::models::GPT2> model;
  const auto pieces = gpt2_pieces(model);
  config::ParallelConfig p = pipeline(2);
  p.partition_sizes = {2, 3};
  std::string m = error_of(pieces, p);
  EXPECT_NE(m.find("parallel.partition_sizes = [2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("adding up to the model's 6 pieces"), std::string::npos) << m;

  p.partition_sizes = {1, 1, 4};
  m = error_of(pieces, p);
  EXPECT_NE(m.find("2 x 1 = 2 counts"), std::string::npos) << m;

  config::ParallelConfig v4 = pipeline(1, 4);
  v4.partition = config::PipelinePartition::kUniform;
  m = error_of(pieces, v4);
  EXPECT_NE(m.find("parallel.partition = \"uniform\" with parallel.num_chunks = 4"), std::string::npos) << m;

  m = error_of(pieces, pipeline(4, 2));
  EXPECT_NE(m.find("fewer than the 8 parts"), std::string::npos) << m;
}

}  // namespace
}  // namespace colossal::initialize
