// Tests of `colossal train`'s command line (cli/train_args.h): the MLP demo's flags are refused with
// --config, each naming the --set key to use instead; --set, --metrics and --resume are refused
// without it; consistent command lines fill TrainArgs; the help says what each mode is.
#include "colossal/cli/train_args.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace colossal::cli {
namespace {

struct Parsed {
  int exit_code = 0;
  std::string message;  ///< the parse error's text; empty on success
  TrainArgs args;
};

Parsed parse_train(std::vector<std::string> args) {
  CLI::App app{"colossal"};
  app.require_subcommand(1);
  Parsed parsed;
  add_train_command(app, parsed.args);
  args.insert(args.begin(), "colossal");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    parsed.exit_code = e.get_exit_code();
    parsed.message = e.what();
  }
  return parsed;
}

/// --config checks that the file exists; what is in it is train_command's business.
class TrainCommandLine : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = std::filesystem::temp_directory_path() / ("train_args_test_" + std::to_string(::getpid()) + ".toml");
    std::ofstream(config_) << "[train]\nepochs = 1\n";
  }
  void TearDown() override { std::filesystem::remove(config_); }

  std::string config() const { return config_.string(); }

 private:
  std::filesystem::path config_;
};

TEST_F(TrainCommandLine, EveryMlpFlagWithConfigIsAUsageErrorNamingItsReplacement) {
  struct Case {
    std::vector<std::string> flag;
    std::string replacement;
  };
  const std::vector<Case> cases = {
      {{"--lr", "0.1"}, "use --set optimizer.lr=0.1"},          {{"--steps", "300"}, "use --set train.max_steps=300"},
      {{"--batch-size=32"}, "use --set data.batch_size=32"},    {{"--seed", "7"}, "use --set train.seed=7"},
      {{"--log-every", "5"}, "use --set train.log_interval=5"}, {{"--hidden", "128"}, "no --set equivalent"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train", "--config", config()};
    args.insert(args.end(), c.flag.begin(), c.flag.end());
    const Parsed parsed = parse_train(args);
    EXPECT_EQ(parsed.exit_code, kTrainUsageExitCode) << c.flag[0];
    EXPECT_NE(parsed.message.find(c.flag[0].substr(0, c.flag[0].find('=')) + " is a flag of the built-in MLP demo"),
              std::string::npos)
        << parsed.message;
    EXPECT_NE(parsed.message.find(c.replacement), std::string::npos) << parsed.message;
  }
  // --hidden has no key of its own: the message points at where a config's width lives.
  EXPECT_NE(parse_train({"train", "--hidden", "128", "--config", config()}).message.find("model.options"),
            std::string::npos);
}

TEST_F(TrainCommandLine, EveryOffendingFlagIsNamedWhateverTheOrder) {
  const Parsed parsed =
      parse_train({"train", "--lr", "0.5", "--config", config(), "--set", "train.epochs=2", "--steps", "10"});
  EXPECT_EQ(parsed.exit_code, kTrainUsageExitCode);
  EXPECT_NE(parsed.message.find("--set optimizer.lr=0.5"), std::string::npos) << parsed.message;
  EXPECT_NE(parsed.message.find("--set train.max_steps=10"), std::string::npos) << parsed.message;
}

TEST_F(TrainCommandLine, ConfigOptionsWithoutConfigAreUsageErrors) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"train", "--set", "optimizer.lr=0.1"}, {"train", "--metrics", "m.jsonl"}, {"train", "--resume", "ckpt"}}) {
    const Parsed parsed = parse_train(args);
    EXPECT_EQ(parsed.exit_code, kTrainUsageExitCode) << args[1];
    EXPECT_NE(parsed.message.find(args[1] + " needs --config"), std::string::npos) << parsed.message;
  }
}

TEST_F(TrainCommandLine, ConsistentCommandLinesFillTheArguments) {
  const Parsed with_config = parse_train({"train", "--config", config(), "--set", "optimizer.lr=0.1", "--set",
                                          "train.max_steps=3", "--metrics", "m.jsonl", "--resume", "ckpt"});
  ASSERT_EQ(with_config.exit_code, 0) << with_config.message;
  EXPECT_EQ(with_config.args.config_path, config());
  EXPECT_EQ(with_config.args.overrides, (std::vector<std::string>{"optimizer.lr=0.1", "train.max_steps=3"}));
  EXPECT_EQ(with_config.args.metrics_path, "m.jsonl");
  EXPECT_EQ(with_config.args.resume_path, "ckpt");

  const Parsed demo = parse_train({"train", "--lr", "0.05", "--steps", "7", "--batch-size", "16", "--hidden", "8",
                                   "--seed", "3", "--log-every", "2"});
  ASSERT_EQ(demo.exit_code, 0) << demo.message;
  EXPECT_TRUE(demo.args.config_path.empty());
  EXPECT_EQ(demo.args.mlp.lr, 0.05);
  EXPECT_EQ(demo.args.mlp.steps, 7);
  EXPECT_EQ(demo.args.mlp.batch_size, 16);
  EXPECT_EQ(demo.args.mlp.hidden, 8);
  EXPECT_EQ(demo.args.mlp.seed, 3u);
  EXPECT_EQ(demo.args.mlp.log_every, 2);
}

TEST(TrainArgsHelp, SaysTrainRunsAConfigAndGroupsTheDemoFlags) {
  CLI::App app{"colossal"};
  TrainArgs args;
  CLI::App* train = add_train_command(app, args);
  const std::string summary = train->get_description();
  EXPECT_NE(summary.find("--config"), std::string::npos) << summary;
  EXPECT_NE(summary.find("without --config, run the built-in MLP demo"), std::string::npos) << summary;
  const std::string help = train->help();
  const size_t demo_group = help.find("Built-in MLP demo (only without --config)");
  ASSERT_NE(demo_group, std::string::npos) << help;
  // The demo's flags are listed under its heading, the config's options before it.
  EXPECT_GT(help.find("--lr"), demo_group) << help;
  EXPECT_GT(help.find("--hidden"), demo_group) << help;
  EXPECT_LT(help.find("--set"), demo_group) << help;
}

}  // namespace
}  // namespace colossal::cli
