// `colossal describe`: see describe.h.
#include "colossal/cli/describe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/initialize/builders.h"        // gpt2_config, make_datasets, make_model
#include "colossal/initialize/pipeline_stage.h"  // pipeline_pieces, plan_pipeline
#include "colossal/initialize/training_run.h"    // load_run_config
#include "colossal/parallel/tp/gpt2_plan.h"
#include "colossal/parallel/tp/shard_spec.h"  // ShardSpec::padded_size
#include "colossal/parallel/tp/vit_plan.h"

namespace colossal::cli {
namespace {

using config::TensorSplit;

struct DescribeOptions {
  std::string config_path;
  std::vector<std::string> overrides;
};

/// One parameter's line: its split's ShardSpec dimension (of its own shape) and per-rank shape.
struct Row {
  std::string name;
  Shape shape;
  TensorSplit split = TensorSplit::kReplicate;
  int dim = -1;  ///< the split dimension, -1: whole
  bool padded = false;
  std::string source;
};

std::string shape_text(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// The dimension a split cuts in a parameter of `shape`: GPT-2's Conv1D [in, out] and embeddings
/// [rows, dim] (weights_out_last) cut the last dimension for column and the first for row; timm's
/// Linear [out, in] the reverse. Biases (1-D) are cut along their only dimension.
int split_dim(TensorSplit split, const Shape& shape, bool weights_out_last) {
  if (split == TensorSplit::kReplicate) return -1;
  if (shape.size() == 1) return 0;
  const int last = static_cast<int>(shape.size()) - 1;
  switch (split) {
    case TensorSplit::kColumn:
      return weights_out_last ? last : 0;
    case TensorSplit::kRow:
      return weights_out_last ? 0 : last;
    case TensorSplit::kVocab:
      return 0;
    case TensorSplit::kReplicate:
      break;
  }
  return -1;
}

void print_rows(const std::vector<Row>& rows, int tp) {
  size_t name_width = 4, shape_width = 5;
  for (const Row& r : rows) {
    name_width = std::max(name_width, r.name.size());
    shape_width = std::max(shape_width, shape_text(r.shape).size());
  }
  fmt::print("{:<{}}  {:<{}}  {:<9}  {:<15}  {:<{}}  {}\n", "name", name_width, "shape", shape_width, "spec",
             "ShardSpec", "on each rank", shape_width, "from");
  for (const Row& r : rows) {
    Shape local = r.shape;
    std::string shard = "whole";
    if (r.dim >= 0) {
      const int64_t n = local[static_cast<size_t>(r.dim)];
      local[static_cast<size_t>(r.dim)] = (r.padded ? parallel::tp::ShardSpec::padded_size(n, tp) : n) / tp;
      // The tutorial's spelling: the last dimension is -1.
      shard = fmt::format("ShardSpec([{}])", r.dim == static_cast<int>(r.shape.size()) - 1 ? -1 : r.dim);
    }
    fmt::print("{:<{}}  {:<{}}  {:<9}  {:<15}  {:<{}}  {}\n", r.name, name_width, shape_text(r.shape), shape_width,
               config::to_string(r.split), shard, shape_text(local), shape_width, r.source);
  }
}

void run_describe(const DescribeOptions& o) {
  const config::TrainConfig c = initialize::load_run_config(o.config_path, o.overrides);
  fmt::print("# the effective config ({}{})\n{}\n", o.config_path,
             o.overrides.empty() ? "" : fmt::format(" with {} --set", o.overrides.size()), config::describe(c));
  const int tp = c.parallel.tensor.size;
  core::Generator init(static_cast<uint64_t>(c.train.seed)), dropout(static_cast<uint64_t>(c.train.seed) + 7);
  std::shared_ptr<nn::Module> model;
  if (c.model.name == config::ModelName::kGpt2) {
    model = std::make_shared<nn::models::GPT2>(initialize::gpt2_config(c), &init, &dropout);  // no data needed
  } else {
    model = initialize::make_model(c, initialize::make_datasets(c), init, dropout);
  }
  std::vector<std::string> names;
  int64_t count = 0;
  for (const auto& [name, parameter] : model->named_parameters()) {
    names.push_back(name);
    count += parameter.numel();
  }
  std::vector<Row> rows;
  for (const auto& [name, parameter] : model->named_parameters()) rows.push_back({name, parameter.shape()});
  std::string how = "one process holds every parameter (parallel.tensor.size = 1)";
  if (tp > 1 && c.parallel.tensor.mode != config::TensorParallelMode::k1d) {
    how = fmt::format("parallel.tensor.mode = \"{}\" over {} ranks: only mode \"1d\" is built so far",
                      config::to_string(c.parallel.tensor.mode), tp);
  } else if (tp > 1) {
    // The model's resolved plan: the built-in policy or the specs, checked for tp ranks.
    std::vector<parallel::tp::ParameterSplit> splits;
    bool weights_out_last = false;
    std::string logits;
    if (auto* gpt2 = dynamic_cast<nn::models::GPT2*>(model.get())) {
      parallel::tp::ResolvedGpt2Plan resolved =
          c.parallel.tensor.specs.empty()
              ? parallel::tp::builtin_gpt2_plan(gpt2->config(), names)
              : parallel::tp::resolve_gpt2_specs(c.parallel.tensor.specs, gpt2->config(), names, tp);
      if (c.parallel.tensor.specs.empty()) parallel::tp::check_gpt2_plan(resolved.plan, gpt2->config(), tp);
      splits = std::move(resolved.parameters);
      weights_out_last = true;  // Conv1D's [in, out]
      logits = resolved.plan.logits_whole() ? "whole on every rank" : "split by vocabulary";
    } else if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(model.get())) {
      parallel::tp::ResolvedVitPlan resolved =
          c.parallel.tensor.specs.empty()
              ? parallel::tp::builtin_vit_plan(vit->config(), names)
              : parallel::tp::resolve_vit_specs(c.parallel.tensor.specs, vit->config(), names, tp);
      if (c.parallel.tensor.specs.empty()) parallel::tp::check_vit_plan(resolved.plan, vit->config(), tp);
      splits = std::move(resolved.parameters);
      logits = "whole on every rank";
    }
    if (!splits.empty()) {
      for (size_t i = 0; i < rows.size(); ++i) {
        Row& r = rows[i];
        const parallel::tp::ParameterSplit& p = splits[i];
        r.split = p.split;
        r.dim = split_dim(p.split, r.shape, weights_out_last);
        r.padded = p.split == TensorSplit::kVocab;
        r.source =
            p.source.starts_with("rule ")
                ? fmt::format("{} \"{}\"", p.source, c.parallel.tensor.specs[std::stoul(p.source.substr(5))].pattern)
                : p.source;
      }
      how = fmt::format("1D tensor parallelism over {} ranks, {}; logits {}", tp,
                        c.parallel.tensor.specs.empty()
                            ? std::string("the built-in policy")
                            : fmt::format("{} rules of parallel.tensor.specs", c.parallel.tensor.specs.size()),
                        logits);
    } else {
      how = fmt::format("parallel.tensor.size = {}: model \"{}\" has no tensor-parallel form", tp,
                        config::to_string(c.model.name));
    }
  }
  fmt::print("# model \"{}\": {} parameters in {} tensors; {}\n", config::to_string(c.model.name), count, rows.size(),
             how);
  print_rows(rows, tp);
  for (const Row& r : rows) {
    if (r.split == TensorSplit::kColumn && (r.name.ends_with("c_attn.weight") || r.name.ends_with("attn.qkv.weight"))) {
      fmt::print("(the fused q/k/v projection's column split holds whole heads per rank: its heads' q, k and v)\n");
      break;
    }
  }
  if (c.parallel.pipeline > 1) {
    // The stages as colossal train cuts them (initialize/pipeline_stage.h).
    const auto pieces = initialize::pipeline_pieces(*model);
    if (initialize::measures_pipeline_partition(c.parallel)) {
      // The cut needs each piece's time on the training devices: colossal train measures it at
      // start-up and prints it. Here the pieces it cuts.
      fmt::print(
          "# pipeline: {} stages x {} chunk(s), {} pieces {}, {} microbatches of {} samples; the cut is "
          "made at start-up by colossal train, which prints it\n",
          c.parallel.pipeline, c.parallel.num_chunks, pieces.size(), initialize::describe_partition(c.parallel),
          c.parallel.num_microbatches, c.data.batch_size / std::max(1, c.parallel.num_microbatches));
      for (size_t i = 0; i < pieces.size(); ++i) {
        int64_t params = 0;
        for (const Tensor& t : pieces[i]->parameters()) params += t.numel();
        fmt::print("piece {}: {} ({} parameters)\n", i, pieces[i]->type_name(), params);
      }
      return;
    }
    const parallel::pp::StageParts parts = initialize::plan_pipeline(pieces, c.parallel);
    fmt::print("# pipeline: {} stages x {} chunk(s), {} pieces {}, {} microbatches of {} samples\n",
               c.parallel.pipeline, c.parallel.num_chunks, pieces.size(), initialize::describe_partition(c.parallel),
               c.parallel.num_microbatches, c.data.batch_size / std::max(1, c.parallel.num_microbatches));
    for (size_t s = 0; s < parts.size(); ++s) {
      for (size_t k = 0; k < parts[s].size(); ++k) {
        int64_t params = 0;
        std::vector<std::string> kinds;
        for (int64_t i = parts[s][k].begin; i < parts[s][k].end; ++i) {
          for (const Tensor& t : pieces[static_cast<size_t>(i)]->parameters()) params += t.numel();
          kinds.push_back(pieces[static_cast<size_t>(i)]->type_name());
        }
        fmt::print("stage {} chunk {}: pieces [{}, {}) {} ({} parameters)\n", s, k, parts[s][k].begin, parts[s][k].end,
                   fmt::join(kinds, " "), params);
      }
    }
  }
}

}  // namespace

CLI::App* add_describe_command(CLI::App& app) {
  auto options = std::make_shared<DescribeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "describe", "Print a config's effective keys and its model's parameters with their tensor-parallel specs");
  cmd->add_option("--config", options->config_path, "A TOML config (configs/*.toml)")->required();
  cmd->add_option("--set", options->overrides, "Override a config key: key=value (repeatable)");
  cmd->callback([options] {
    try {
      run_describe(*options);
    } catch (const Error& e) {
      fmt::print(stderr, "colossal describe: {}\n", e.what());
      std::exit(1);
    }
  });
  return cmd;
}

}  // namespace colossal::cli
