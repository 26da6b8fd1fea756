// `colossal train`'s options and the check that keeps the config run and the MLP demo's flags apart
// (cli/train_args.h).
#include "colossal/cli/train_args.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string_view>

namespace colossal::cli {
namespace {

constexpr std::string_view kMlpGroup = "Built-in MLP demo (only without --config)";
constexpr std::string_view kConfigGroup = "Config run (with --config)";

/// A flag of the MLP demo and how a config run says the same thing. The demo's flags were accepted
/// next to --config and silently dropped, so a run the user thought had lr 0.1 trained with the
/// config's; now each is refused with its replacement.
struct MlpFlag {
  std::string_view name;
  std::string_view config_key;  ///< the --set key with the same meaning; empty: none
  std::string_view otherwise;   ///< what to do when there is no such key
};

constexpr MlpFlag kMlpFlags[] = {
    {"--steps", "train.max_steps", ""},
    {"--batch-size", "data.batch_size", ""},
    {"--lr", "optimizer.lr", ""},
    {"--hidden", "",
     "a config's model width is its model.preset or one of the model's own options "
     "(--set model.options.NAME=N, e.g. n_embd for gpt2)"},
    {"--seed", "train.seed", ""},
    {"--log-every", "train.log_interval", ""},
};

/// The value given last for opt, as typed.
std::string given_value(const CLI::Option& opt) {
  return opt.results().empty() ? std::string("N") : opt.results().back();
}

/// The usage errors of this command line, one line each; empty when it is consistent.
std::string usage_errors(const CLI::App& train, bool with_config) {
  std::string errors;
  if (with_config) {
    for (const MlpFlag& flag : kMlpFlags) {
      const CLI::Option* opt = train.get_option(std::string(flag.name));
      if (opt->count() == 0) continue;
      if (!flag.config_key.empty()) {
        errors += fmt::format("{} is a flag of the built-in MLP demo, which --config does not run; use --set {}={}\n",
                              flag.name, flag.config_key, given_value(*opt));
      } else {
        errors += fmt::format(
            "{} is a flag of the built-in MLP demo, which --config does not run; it has no --set "
            "equivalent: {}\n",
            flag.name, flag.otherwise);
      }
    }
  } else {
    for (const char* name : {"--set", "--metrics", "--resume", "--profile", "--profile-steps", "--profile-host"}) {
      if (train.get_option(name)->count() == 0) continue;
      errors += fmt::format(
          "{} needs --config: it applies to a config run; the built-in MLP demo takes only its own flags "
          "(--steps, --batch-size, --lr, --hidden, --seed, --log-every)\n",
          name);
    }
  }
  if (!errors.empty()) errors.pop_back();  // CLI11 ends the message with its own newline
  return errors;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainArgs& args) {
  CLI::App* train = app.add_subcommand(
      "train",
      "Train from a TOML config (--config FILE, see configs/); without --config, run the built-in MLP demo (a "
      "2-layer MLP on synthetic data, CPU)");
  train->footer(
      "Examples:\n"
      "  colossal train --config configs/vit_fashion_mnist.toml --set optimizer.lr=1e-3 --metrics run.jsonl\n"
      "  colossal train --steps 500 --lr 0.05     (the MLP demo)\n");

  const std::string config_group(kConfigGroup);
  train->add_option("--config", args.config_path, "Train from a TOML config (configs/*.toml)")
      ->check(CLI::ExistingFile)
      ->group(config_group);
  train->add_option("--set", args.overrides, "Override a config key: key=value (repeatable)")
      ->allow_extra_args(false)
      ->group(config_group);
  train
      ->add_option("--metrics", args.metrics_path,
                   "Write JSONL metrics: a line every train.log_interval steps, one per epoch, then a summary")
      ->group(config_group);
  train
      ->add_option("--resume", args.resume_path,
                   "Continue from a checkpoint file, or from the newest one in a checkpoint folder (same as --set "
                   "train.resume_from=PATH)")
      ->group(config_group);

  train
      ->add_option("--profile", args.profile.path,
                   "Profile a window of training steps (host and CUDA-event ranges): write a Chrome trace "
                   "(chrome://tracing, ui.perfetto.dev) here and a per-range summary on stderr; one file per rank, "
                   "its rank before the extension (also COLOSSAL_PROFILE=PATH)")
      ->group(config_group);
  train
      ->add_option_function<std::string>(
          "--profile-steps",
          [&args](const std::string& value) {
            long long first = -1, count = -1;
            char tail = 0;
            if (std::sscanf(value.c_str(), "%lld:%lld%c", &first, &count, &tail) != 2 || first < 0 || count < 1) {
              throw CLI::ValidationError(
                  "--profile-steps",
                  "expected FIRST:COUNT with FIRST >= 0 and COUNT >= 1 (e.g. 100:10), got '" + value + "'");
            }
            args.profile.first_step = first;
            args.profile.num_steps = count;
          },
          "The profiled steps as FIRST:COUNT (default 20:5; also COLOSSAL_PROFILE_STEPS)")
      ->group(config_group);
  train
      ->add_flag("--profile-host", args.profile.host_samples,
                 "With --profile: also sample the host's stacks over the window into <trace>.host.txt, for "
                 "tools/host-profile-report (also COLOSSAL_PROFILE_HOST=1)")
      ->group(config_group);

  const std::string mlp_group(kMlpGroup);
  MlpTrainConfig& mlp = args.mlp;
  train->add_option("--steps", mlp.steps, "SGD steps")->capture_default_str()->group(mlp_group);
  train->add_option("--batch-size", mlp.batch_size, "Examples per step")->capture_default_str()->group(mlp_group);
  train->add_option("--lr", mlp.lr, "Learning rate")->capture_default_str()->group(mlp_group);
  train->add_option("--hidden", mlp.hidden, "Hidden layer width")->capture_default_str()->group(mlp_group);
  train->add_option("--seed", mlp.seed, "Seed of the task and of the run")->capture_default_str()->group(mlp_group);
  train->add_option("--log-every", mlp.log_every, "Print the loss every N steps (0: only the last)")
      ->capture_default_str()
      ->group(mlp_group);

  // Checked once the whole command line is read, so that the order of the flags does not matter.
  train->callback([train, &args] {
    const std::string errors = usage_errors(*train, !args.config_path.empty());
    if (!errors.empty()) throw CLI::ValidationError(errors, kTrainUsageExitCode);
  });
  return train;
}

}  // namespace colossal::cli
