// TrainConfig from TOML: defaults, every section read from a file, --set overrides, describe() round
// trips, the example configs in configs/, and one test per kind of mistake (syntax, unknown key,
// wrong type, out of range, bad choice, broken rule between keys), each checking that the message
// names the full key, where it came from and what would be valid.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::config {
namespace {

namespace fs = std::filesystem;
using Overrides = std::vector<std::string>;

TrainConfig parse(const std::string& toml, const Overrides& overrides = {}) {
  return parse_config(toml, overrides, "test.toml");
}

/// The message parse() throws, or "" when it does not throw.
std::string error_of(const std::string& toml, const Overrides& overrides = {}) {
  try {
    parse(toml, overrides);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_CONFIG_ERROR(toml, overrides, substring) EXPECT_ERROR_CONTAINS(parse(toml, overrides), substring)

TEST(TrainConfig, EmptyFileGivesTheDefaults) {
  const TrainConfig config = parse("");
  EXPECT_EQ(config, TrainConfig{});
  EXPECT_EQ(config.parallel.data, 0);
  EXPECT_EQ(config.parallel.pipeline, 1);
  EXPECT_EQ(config.parallel.tensor.size, 1);
  EXPECT_EQ(config.parallel.tensor.mode, TensorParallelMode::k1d);
  EXPECT_EQ(config.fp16.mode, AmpMode::kOff);
  EXPECT_EQ(config.fp16.growth_interval, 0);  // the mode's default: torch 2000, naive 1000
  EXPECT_FALSE(config.bf16);
  EXPECT_EQ(config.zero.stage, 0);
  EXPECT_EQ(config.gradient_accumulation, 1);
  EXPECT_EQ(config.clip_grad_norm, 0.0);
  EXPECT_EQ(config.model.name, ModelName::kMlp);
  EXPECT_EQ(config.data.dataset, DatasetName::kSynthetic);
  EXPECT_EQ(config.optimizer.name, OptimizerName::kAdamw);
  EXPECT_EQ(config.optimizer.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(config.lr_scheduler.name, SchedulerName::kConstant);
  EXPECT_EQ(config.train.seed, 1024);
  EXPECT_NO_THROW(validate(config));
}

TEST(TrainConfig, ReadsEverySection) {
  const TrainConfig c = parse(R"(
gradient_accumulation = 16
clip_grad_norm = 1.0

[parallel]
data = 2
pipeline = 2
num_microbatches = 4
num_chunks = 2
tensor = { size = 8, mode = "2.5d", depth = 2 }

[fp16]
mode = "naive"
initial_scale = 4096
hysteresis = 3

[zero]
stage = 3
placement_policy = "auto"
offload_optimizer = true

[model]
name = "vit"
preset = "vit_base_patch16_224"
options = { num_classes = 10, dropout = 0.1, checkpoint = true, act = "gelu", sizes = [1, 2] }

[data]
dataset = "cifar10"
path = "/data/cifar"
batch_size = 256
num_workers = 4
transforms = ["random_crop", "random_flip", "normalize"]

[data.options]
crop.padding = 4

[optimizer]
name = "lamb"
lr = 1.8e-2
weight_decay = 0.1
betas = [0.9, 0.95]

[lr_scheduler]
name = "cosine"
warmup_epochs = 32
eta_min = 1e-5

[train]
epochs = 300
seed = 42
log_interval = 50
checkpoint_dir = "ckpt"
device = "cuda"
)");
  EXPECT_EQ(c.gradient_accumulation, 16);
  EXPECT_EQ(c.clip_grad_norm, 1.0);
  EXPECT_EQ(c.parallel.data, 2);
  EXPECT_EQ(c.parallel.pipeline, 2);
  EXPECT_EQ(c.parallel.num_microbatches, 4);
  EXPECT_EQ(c.parallel.num_chunks, 2);
  EXPECT_EQ(c.parallel.tensor.size, 8);
  EXPECT_EQ(c.parallel.tensor.mode, TensorParallelMode::k2p5d);
  EXPECT_EQ(c.parallel.tensor.depth, 2);
  EXPECT_EQ(c.fp16.mode, AmpMode::kNaive);
  EXPECT_EQ(c.fp16.initial_scale, 4096.0);  // an integer is a fine float
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.placement_policy, ZeroPlacement::kAuto);
  EXPECT_TRUE(c.zero.offload_optimizer);
  EXPECT_EQ(c.model.name, ModelName::kVit);
  EXPECT_EQ(c.model.preset, "vit_base_patch16_224");
  EXPECT_EQ(c.model.options.get_int("num_classes", 0), 10);
  EXPECT_EQ(c.model.options.get_double("dropout", 0), 0.1);
  EXPECT_TRUE(c.model.options.get_bool("checkpoint", false));
  EXPECT_EQ(c.model.options.get_string("act", ""), "gelu");
  EXPECT_EQ(c.model.options.values().at("sizes"), (OptionValue{OptionValue::Array{{int64_t{1}}, {int64_t{2}}}}));
  EXPECT_EQ(c.data.dataset, DatasetName::kCifar10);
  EXPECT_EQ(c.data.path, "/data/cifar");
  EXPECT_EQ(c.data.batch_size, 256);
  EXPECT_EQ(c.data.num_workers, 4);
  EXPECT_EQ(c.data.transforms, (std::vector<std::string>{"random_crop", "random_flip", "normalize"}));
  EXPECT_EQ(c.data.options.get_int("crop.padding", 0), 4);  // nested tables become dotted keys
  EXPECT_EQ(c.optimizer.name, OptimizerName::kLamb);
  EXPECT_EQ(c.optimizer.lr, 1.8e-2);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(c.lr_scheduler.name, SchedulerName::kCosine);
  EXPECT_EQ(c.lr_scheduler.warmup_epochs, 32);
  EXPECT_EQ(c.lr_scheduler.eta_min, 1e-5);
  EXPECT_EQ(c.train.epochs, 300);
  EXPECT_EQ(c.train.seed, 42);
  EXPECT_EQ(c.train.log_interval, 50);
  EXPECT_EQ(c.train.checkpoint_dir, "ckpt");
  EXPECT_EQ(c.train.device, DeviceKind::kCuda);
  EXPECT_NO_THROW(validate(c));
}

TEST(TrainConfig, OverridesParseTomlValues) {
  const TrainConfig c =
      parse("[optimizer]\nlr = 0.1\nbetas = [0.9, 0.99]\n",
            {"optimizer.lr=3e-4", "optimizer.betas=[0.8, 0.9]", "bf16=true", "data.batch_size=32", "model.name=gpt2",
             "model.preset=\"gpt2-medium\"", "optimizer.name = sgd", "parallel.tensor={size = 4, mode = \"2d\"}",
             "model.options.n_layer=2", "model.options.tags=[\"a\", \"b\"]", "train.checkpoint_dir="});
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.9}));
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_EQ(c.model.name, ModelName::kGpt2);  // a bare word is a string
  EXPECT_EQ(c.model.preset, "gpt2-medium");
  EXPECT_EQ(c.optimizer.name, OptimizerName::kSgd);  // spaces around '=' are fine
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, TensorParallelMode::k2d);
  EXPECT_EQ(c.model.options.get_int("n_layer", 12), 2);
  EXPECT_TRUE(c.model.options.contains("tags"));
  EXPECT_EQ(c.train.checkpoint_dir, "");
}

TEST(TrainConfig, LaterOverridesWinAndReplaceWholeTables) {
  const TrainConfig c =
      parse("[model.options]\na = 1\nb = 2\n", {"optimizer.lr=0.5", "optimizer.lr=0.25", "model.options={c = 3}"});
  EXPECT_EQ(c.optimizer.lr, 0.25);
  EXPECT_FALSE(c.model.options.contains("a"));
  EXPECT_FALSE(c.model.options.contains("b"));
  EXPECT_EQ(c.model.options.get_int("c", 0), 3);
  // Overrides alone, no file.
  EXPECT_EQ(parse("", {"train.max_steps=100"}).train.max_steps, 100);
}

TEST(TrainConfig, DescribeRoundTrips) {
  TrainConfig c;
  c.parallel = {.data = 2,
                .pipeline = 4,
                .tensor = {.size = 27, .mode = TensorParallelMode::k3d, .depth = 1},
                .num_microbatches = 8,
                .num_chunks = 2};
  c.fp16.mode = AmpMode::kTorch;
  c.fp16.initial_scale = 1024;
  c.fp16.backoff_factor = 0.25;
  c.zero = {.stage = 2, .offload_optimizer = true, .reduce_bucket_mb = 50};
  c.gradient_accumulation = 3;
  c.clip_grad_norm = 0.1 + 0.2;  // not exactly 0.3: the text must keep every bit
  c.model.name = ModelName::kGpt2;
  c.model.preset = "gpt2-xl";
  c.model.options.set("n_layer", OptionValue{int64_t{2}});
  c.model.options.set("dropout", OptionValue{0.0});  // stays a float, not the integer 0
  c.model.options.set("name with space", OptionValue{std::string("quote \" backslash \\ tab \t")});
  c.model.options.set("nested.key", OptionValue{true});
  c.model.options.set("mixed", OptionValue{OptionValue::Array{{1.5}, {std::string("x")}, {OptionValue::Array{}}}});
  c.data = {.dataset = DatasetName::kTokens,
            .path = "/data/tokens.bin",
            .batch_size = 16,
            .seq_len = 1024,
            .transforms = {"mixup"}};
  c.optimizer = {.name = OptimizerName::kSgd, .lr = 1.0 / 3.0, .momentum = 0.9, .nesterov = true};
  c.lr_scheduler = {.name = SchedulerName::kMultistep, .warmup_steps = 100, .milestones = {1000, 2000}, .gamma = 0.5};
  c.train.epochs = 0;
  c.train.max_steps = 5000;
  c.train.log_dir = "logs/ü";
  c.train.device = DeviceKind::kCpu;
  validate(c);

  const std::string text = describe(c);
  const TrainConfig back = parse(text);
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(describe(back), text);
  EXPECT_EQ(parse(describe(TrainConfig{})), TrainConfig{});
  // Comments list an enum's choices.
  EXPECT_NE(text.find("mode = \"3d\"  # 1d | 2d | 2.5d | 3d"), std::string::npos) << text;
}

TEST(TrainConfig, ExampleConfigsLoad) {
  const fs::path configs = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs";
  const TrainConfig vit = load_config(configs / "vit_cifar10_hybrid.toml");
  EXPECT_EQ(vit.parallel.pipeline, 2);
  EXPECT_EQ(vit.parallel.tensor.size, 2);
  EXPECT_EQ(vit.fp16.mode, AmpMode::kNaive);
  const TrainConfig gpt2 = load_config(configs / "gpt2_zero3.toml", Overrides{"train.max_steps=10"});
  EXPECT_EQ(gpt2.zero.stage, 3);
  EXPECT_EQ(gpt2.train.max_steps, 10);
}

// ---- mistakes ---------------------------------------------------------------------------------

TEST(TrainConfigErrors, SyntaxErrorsNameFileLineAndColumn) {
  EXPECT_CONFIG_ERROR("[optimizer]\nlr = = 3\n", {}, "test.toml:2:");
  EXPECT_CONFIG_ERROR("[optimizer]\nlr = = 3\n", {}, "TOML syntax error");
  EXPECT_CONFIG_ERROR("a = 1\na = 2\n", {}, "test.toml:2:");
}

TEST(TrainConfigErrors, UnknownKeysSuggestTheNearest) {
  EXPECT_CONFIG_ERROR("[optimzer]\nlr = 0.1\n", {},
                      "test.toml:1: unknown key \"optimzer\"; did you mean \"optimizer\"?");
  EXPECT_CONFIG_ERROR("[optimizer]\nlrr = 0.1\n", {},
                      "test.toml:2: unknown key \"optimizer.lrr\"; did you mean \"optimizer.lr\"?");
  EXPECT_CONFIG_ERROR("[parallel]\ntensor = { sise = 2 }\n", {},
                      "unknown key \"parallel.tensor.sise\"; did you mean \"parallel.tensor.size\"?");
  EXPECT_CONFIG_ERROR("[data]\nbatchsize = 3\n", {}, "did you mean \"data.batch_size\"?");
  // The right name in the wrong section.
  EXPECT_CONFIG_ERROR("lr = 0.1\n", {}, "unknown key \"lr\"; did you mean \"optimizer.lr\"?");
  EXPECT_CONFIG_ERROR("[train]\nbatch_size = 3\n", {},
                      "unknown key \"train.batch_size\"; did you mean \"data.batch_size\"?");
  // Nothing near: the valid keys of the section are listed.
  EXPECT_CONFIG_ERROR("[zero]\nflavour = 1\n", {},
                      "unknown key \"zero.flavour\"; the keys in [zero] are \"stage\", \"placement_policy\", "
                      "\"offload_optimizer\", \"chunk_size_mb\", \"reduce_bucket_mb\"");
  // From an override.
  EXPECT_CONFIG_ERROR("", Overrides{"optimizer.learning_rate=0.1"}, "--set optimizer.learning_rate=0.1: unknown key");
  EXPECT_CONFIG_ERROR("", Overrides{"optimzer.lr=0.1"}, "did you mean \"optimizer.lr\"?");
}

TEST(TrainConfigErrors, WrongTypesNameTheKeyAndBothTypes) {
  EXPECT_CONFIG_ERROR("[data]\nbatch_size = \"big\"\n", {},
                      "test.toml:2: data.batch_size = \"big\": expected an integer, got a string");
  EXPECT_CONFIG_ERROR("[data]\nbatch_size = 32.0\n", {}, "data.batch_size = 32.0: expected an integer, got a float");
  EXPECT_CONFIG_ERROR("bf16 = 1\n", {}, "bf16 = 1: expected a boolean (true or false), got an integer");
  EXPECT_CONFIG_ERROR("[optimizer]\nlr = \"fast\"\n", {}, "optimizer.lr = \"fast\": expected a number, got a string");
  EXPECT_CONFIG_ERROR("[optimizer]\nbetas = 0.9\n", {}, "optimizer.betas = 0.9: expected an array of numbers");
  EXPECT_CONFIG_ERROR("[optimizer]\nbetas = [0.9, \"x\"]\n", {}, "optimizer.betas[1] = \"x\": expected a number");
  EXPECT_CONFIG_ERROR("[fp16]\nmode = 1\n", {},
                      "fp16.mode = 1: expected one of the strings \"off\", \"torch\", "
                      "\"naive\", got an integer");
  EXPECT_CONFIG_ERROR("parallel = 2\n", {}, "test.toml:1: parallel is a section and must be a table");
  EXPECT_CONFIG_ERROR("[optimizer.lr]\nvalue = 1\n", {}, "optimizer.lr (a table): expected a number, got a table");
  EXPECT_CONFIG_ERROR("[model]\noptions = 3\n", {}, "model.options = 3: expected a table of options");
  EXPECT_CONFIG_ERROR("[model.options]\nwhen = 1979-05-27\n", {},
                      "test.toml:2: model.options.when: options are booleans, numbers, strings or arrays of them, "
                      "got a date");
  EXPECT_CONFIG_ERROR("", Overrides{"train.epochs=ten"},
                      "--set train.epochs=ten: train.epochs = \"ten\": expected an integer, got a string");
}

TEST(TrainConfigErrors, OutOfRangeGivesTheRange) {
  EXPECT_CONFIG_ERROR("[optimizer]\nlr = -0.1\n", {}, "test.toml:2: optimizer.lr = -0.1 is out of range: must be > 0");
  EXPECT_CONFIG_ERROR("[optimizer]\nlr = nan\n", {}, "optimizer.lr = nan is not finite");
  EXPECT_CONFIG_ERROR("[zero]\nstage = 4\n", {}, "zero.stage = 4 is out of range: must be between 0 and 3");
  EXPECT_CONFIG_ERROR("gradient_accumulation = 0\n", {}, "gradient_accumulation = 0 is out of range: must be >= 1");
  EXPECT_CONFIG_ERROR("[data]\nbatch_size = 3000000000\n", {}, "must be at most 2147483647");
  EXPECT_CONFIG_ERROR("[optimizer]\nbetas = [0.9, 1.0]\n", {},
                      "optimizer.betas[1] = 1.0 is out of range: must be >= 0 and < 1");
  EXPECT_CONFIG_ERROR("[optimizer]\nbetas = [0.9]\n", {}, "optimizer.betas = [0.9]: expected 2 numbers, got 1");
  EXPECT_CONFIG_ERROR("[fp16]\nbackoff_factor = 1\n", {}, "must be > 0 and < 1");
  EXPECT_CONFIG_ERROR("[lr_scheduler]\nmilestones = [10, 0]\n", {},
                      "lr_scheduler.milestones[1] = 0 is out of range: must be >= 1");
  EXPECT_CONFIG_ERROR("", Overrides{"train.label_smoothing=1.5"},
                      "--set train.label_smoothing=1.5: "
                      "train.label_smoothing = 1.5 is out of range");
}

TEST(TrainConfigErrors, BadChoicesListTheChoicesAndSuggest) {
  EXPECT_CONFIG_ERROR("[parallel.tensor]\nmode = \"2p5d\"\n", {},
                      "parallel.tensor.mode = \"2p5d\" is not one of \"1d\", \"2d\", \"2.5d\", \"3d\"; did you mean "
                      "\"2.5d\"?");
  EXPECT_CONFIG_ERROR("[fp16]\nmode = \"TORCH\"\n", {}, "did you mean \"torch\"?");
  EXPECT_CONFIG_ERROR("[optimizer]\nname = \"rmsprop\"\n", {},
                      "optimizer.name = \"rmsprop\" is not one of \"sgd\", \"adam\", \"adamw\", \"lamb\", \"lars\"");
  EXPECT_CONFIG_ERROR("[data]\ntransforms = [\"random_crop\", \"random_flp\"]\n", {},
                      "data.transforms[1] = \"random_flp\" is not one of");
  EXPECT_CONFIG_ERROR("[data]\ntransforms = [\"random_crop\", \"random_flp\"]\n", {}, "did you mean \"random_flip\"?");
  EXPECT_CONFIG_ERROR("[model]\nname = \"gpt2\"\npreset = \"gpt2-medum\"\n", {},
                      "test.toml:3: model.preset = \"gpt2-medum\" is not one of \"gpt2\", \"gpt2-medium\", "
                      "\"gpt2-large\", \"gpt2-xl\"; did you mean \"gpt2-medium\"? (the presets of model \"gpt2\")");
  EXPECT_CONFIG_ERROR("[model]\npreset = \"tiny\"\n", {}, "model \"mlp\" has no presets");
  EXPECT_CONFIG_ERROR("[parallel.tensor]\nall_reduce = \"copy_engine\"\n", {},
                      "parallel.tensor.all_reduce = \"copy_engine\" is not one of \"auto\", \"copy_engines\", "
                      "\"nccl\"; did you mean \"copy_engines\"?");
}

TEST(TrainConfig, TensorSumsAndResidualDefaultToTheFastWays) {
  // Unset: the copy engines where they can (else NCCL), the residual in the row layers' GEMMs, TF32.
  const TrainConfig defaults = parse("");
  EXPECT_EQ(defaults.parallel.tensor.all_reduce, TensorAllReduce::kAuto);
  EXPECT_TRUE(defaults.parallel.tensor.fused_residual);
  EXPECT_TRUE(defaults.train.tf32);
  const TrainConfig set =
      parse("[parallel.tensor]\nall_reduce = \"nccl\"\nfused_residual = false\n", Overrides{"train.tf32=false"});
  EXPECT_EQ(set.parallel.tensor.all_reduce, TensorAllReduce::kNccl);
  EXPECT_FALSE(set.parallel.tensor.fused_residual);
  EXPECT_FALSE(set.train.tf32);
  EXPECT_EQ(parse("", Overrides{"parallel.tensor.all_reduce=\"copy_engines\""}).parallel.tensor.all_reduce,
            TensorAllReduce::kCopyEngines);
  // The pipeline's exchanges likewise.
  EXPECT_EQ(defaults.parallel.pipeline_p2p, PipelineP2P::kAuto);
  EXPECT_EQ(parse("[parallel]\npipeline_p2p = \"nccl\"\n").parallel.pipeline_p2p, PipelineP2P::kNccl);
  EXPECT_EQ(parse("", Overrides{"parallel.pipeline_p2p=\"copy_engines\""}).parallel.pipeline_p2p,
            PipelineP2P::kCopyEngines);
  EXPECT_ERROR_CONTAINS(parse("[parallel]\npipeline_p2p = \"nvlink\"\n"),
                        "parallel.pipeline_p2p = \"nvlink\" is not one of \"auto\", \"copy_engines\", \"nccl\"");
}

TEST(TrainConfigErrors, RulesBetweenKeys) {
  // The parallel layout's rules (tensor sizes per mode, pipelines, microbatches) belong to the
  // parallel layer, which passes them to config loading: tests/parallel/layout_test.cpp.
  EXPECT_NO_THROW(parse("[parallel.tensor]\nsize = 6\nmode = \"2d\"\n"));
  // Precision, ZeRO, data, optimizer, schedule, loop.
  EXPECT_CONFIG_ERROR("bf16 = true\n[fp16]\nmode = \"torch\"\n", {}, "both ask for mixed precision");
  EXPECT_CONFIG_ERROR("[zero]\nplacement_policy = \"cpu\"\nstage = 2\n", {},
                      "zero.placement_policy = \"cpu\" places ZeRO-3 parameter chunks and needs zero.stage = 3 (it is "
                      "2)");
  EXPECT_CONFIG_ERROR("[zero]\noffload_optimizer = true\n", {}, "needs ZeRO: set zero.stage to 1, 2 or 3");
  EXPECT_CONFIG_ERROR("[data]\ndataset = \"mnist\"\n", {},
                      "test.toml:2: data.path is empty, but data.dataset = \"mnist\" reads its files from there");
  EXPECT_CONFIG_ERROR("[optimizer]\nname = \"sgd\"\nnesterov = true\n", {}, "needs optimizer.momentum > 0");
  EXPECT_CONFIG_ERROR("[lr_scheduler]\nwarmup_steps = 5\nwarmup_epochs = 1\n", {}, "set only one");
  EXPECT_CONFIG_ERROR("[lr_scheduler]\nname = \"multistep\"\n", {}, "needs lr_scheduler.milestones");
  EXPECT_CONFIG_ERROR("[lr_scheduler]\nmilestones = [10, 10]\n", {}, "lr_scheduler.milestones must increase");
  EXPECT_CONFIG_ERROR("[lr_scheduler]\nname = \"cosine\"\neta_min = 0.5\n", {}, "is above optimizer.lr = 0.001");
  EXPECT_CONFIG_ERROR("[train]\nepochs = 0\n", {}, "the run would never end");
  // The rule is checked on the final values: an override can repair the file.
  EXPECT_NO_THROW(parse("[parallel.tensor]\nsize = 6\nmode = \"2d\"\n", {"parallel.tensor.size=9"}));
}

TEST(TrainConfigErrors, AllProblemsAreReportedInFileOrder) {
  const std::string message =
      error_of("[optimizer]\nlr = 0\nname = \"adamx\"\n[data]\nbatch_size = 0\n", {"train.epochs=-1"});
  EXPECT_EQ(message,
            "4 problems in config test.toml:\n"
            "  test.toml:2: optimizer.lr = 0 is out of range: must be > 0\n"
            "  test.toml:3: optimizer.name = \"adamx\" is not one of \"sgd\", \"adam\", \"adamw\", \"lamb\", \"lars\"; "
            "did you mean \"adam\"?\n"
            "  test.toml:5: data.batch_size = 0 is out of range: must be >= 1\n"
            "  --set train.epochs=-1: train.epochs = -1 is out of range: must be >= 0");
}

TEST(TrainConfigErrors, MalformedOverrides) {
  EXPECT_CONFIG_ERROR("", Overrides{"optimizer.lr"}, "--set optimizer.lr: expected dotted.key=value");
  EXPECT_CONFIG_ERROR("", Overrides{"=3"}, "--set =3: expected dotted.key=value");
  EXPECT_CONFIG_ERROR("", Overrides{"optimizer..lr=3"}, "expected dotted.key=value");
  EXPECT_CONFIG_ERROR("", Overrides{"optimizer.betas=[0.9,"}, "--set optimizer.betas=[0.9,: [0.9, is not a TOML value");
  EXPECT_CONFIG_ERROR("", Overrides{"model.preset=\"gpt2"}, "is not a TOML value");
  EXPECT_CONFIG_ERROR("", Overrides{"train.seed=1\nbf16 = true"}, "is not a TOML value (it holds more than one value)");
}

TEST(TrainConfigErrors, MissingFile) {
  EXPECT_ERROR_CONTAINS(load_config("/nonexistent/train.toml"), "cannot read config file '/nonexistent/train.toml'");
}

TEST(TrainConfigErrors, FileErrorsNameThePath) {
  const fs::path path = fs::path(::testing::TempDir()) / fmt::format("colossal_config_{}.toml", ::getpid());
  std::ofstream(path) << "# comment\n\n[optimizer]\nlr = -1\n";
  EXPECT_ERROR_CONTAINS(load_config(path), path.string() + ":4: optimizer.lr = -1 is out of range");
  fs::remove(path);
}

TEST(TrainConfigErrors, ValidateChecksConfigsBuiltInCode) {
  TrainConfig c;
  c.optimizer.lr = 0;
  c.data.transforms = {"flip"};
  EXPECT_ERROR_CONTAINS(validate(c), "optimizer.lr = 0.0 is out of range: must be > 0");
  EXPECT_ERROR_CONTAINS(validate(c), "data.transforms[0] = \"flip\" is not one of");
}

TEST(TrainConfigErrors, RulesOwnedByOtherLayersRunAfterConfigsOwnWithTheKeysOrigin) {
  // A layer above config (the parallel layout's rules) passes its rule to load_config: it runs once
  // the values bound and config's own rules found nothing, and its message gets the key's origin.
  const ConfigRule rule = [](const TrainConfig& c, const std::function<void(std::string_view, std::string)>& report) {
    if (c.parallel.pipeline == 3) report("parallel.pipeline", "three stages are not allowed here");
  };
  EXPECT_NO_THROW(parse_config("[parallel]\npipeline = 2\n", {}, "test.toml", {rule}));
  try {
    parse_config("[parallel]\npipeline = 3\n", {}, "test.toml", {rule});
    FAIL() << "the owned rule did not run";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "test.toml:2: three stages are not allowed here");
  }
  TrainConfig c;
  c.parallel.pipeline = 3;
  EXPECT_ERROR_CONTAINS(validate(c, {rule}), "three stages are not allowed here");
  EXPECT_NO_THROW(validate(c));
}

TEST(TrainConfig, EnumNames) {
  EXPECT_EQ(to_string(TensorParallelMode::k2p5d), "2.5d");
  EXPECT_EQ(to_string(TensorAllReduce::kCopyEngines), "copy_engines");
  EXPECT_EQ(to_string(PipelineP2P::kNccl), "nccl");
  EXPECT_EQ(to_string(AmpMode::kNaive), "naive");
  EXPECT_EQ(to_string(ZeroPlacement::kAuto), "auto");
  EXPECT_EQ(to_string(ModelName::kResnet), "resnet");
  EXPECT_EQ(to_string(DatasetName::kFashionMnist), "fashion_mnist");
  EXPECT_EQ(to_string(OptimizerName::kLars), "lars");
  EXPECT_EQ(to_string(SchedulerName::kPolynomial), "polynomial");
  EXPECT_EQ(to_string(DeviceKind::kCuda), "cuda");
}

}  // namespace
}  // namespace colossal::config
