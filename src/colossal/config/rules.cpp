// Range and choice checks, the rules between keys, and the problem collector.
#include "colossal/config/rules.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <type_traits>

#include <fmt/format.h>

#include "colossal/config/suggest.h"
#include "colossal/core/error.h"  // colossal::Error

namespace colossal::config::detail {

namespace {

std::string format_number(double value) {
  return toml_float(value);
}

template <class E>
std::string_view enum_name(E value) {
  for (const auto& entry : enum_entries(value)) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

/// Range checks over every field, for configs built in code.
class ValueChecker {
 public:
  explicit ValueChecker(Problems& problems) : problems_(problems) {}

  template <class T>
  void operator()(std::string_view key, const T& value, const IntRange& range) {
    if (auto why = check_range(static_cast<int64_t>(value), range)) add(fmt::format("{} = {} {}", key, value, *why));
  }
  void operator()(std::string_view key, const double& value, const FloatRange& range) {
    if (auto why = check_range(value, range)) add(fmt::format("{} = {} {}", key, format_number(value), *why));
  }
  void operator()(std::string_view key, const std::vector<std::string>& values, const Choices& choices) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (auto why = check_choice(values[i], choices.names)) {
        add(fmt::format("{}[{}] = {} {}", key, i, quote(values[i]), *why));
      }
    }
  }
  void operator()(std::string_view key, const std::vector<double>& values, const FloatRange& range,
                  const ArraySize& size) {
    if (values.size() < size.min || values.size() > size.max) {
      add(fmt::format(
          "{} has {} values, expected {}", key, values.size(),
          size.min == size.max ? fmt::format("{}", size.min) : fmt::format("{} to {}", size.min, size.max)));
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (auto why = check_range(values[i], range)) {
        add(fmt::format("{}[{}] = {} {}", key, i, format_number(values[i]), *why));
      }
    }
  }
  void operator()(std::string_view key, const std::vector<int64_t>& values, const IntRange& range) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (auto why = check_range(values[i], range)) add(fmt::format("{}[{}] = {} {}", key, i, values[i], *why));
    }
  }
  void operator()(std::string_view key, const std::vector<TensorSpecRule>& rules) {
    for (std::size_t i = 0; i < rules.size(); ++i) {
      if (auto why = check_spec_pattern(rules[i].pattern)) {
        add(fmt::format("{}[{}].pattern = {}: {}", key, i, quote(rules[i].pattern), *why));
      }
    }
  }
  // Booleans, free strings, enums (always one of their names) and option tables have nothing to check.
  template <class T>
  void operator()(std::string_view, const T&) {}

 private:
  void add(std::string message) { problems_.add(0, std::move(message)); }
  Problems& problems_;
};

}  // namespace

std::string describe_range(const IntRange& range) {
  if (range.max >= kIntFieldMax) return fmt::format(">= {}", range.min);
  return fmt::format("between {} and {}", range.min, range.max);
}

std::string describe_range(const FloatRange& range) {
  std::string text = fmt::format("{} {}", range.min_open ? ">" : ">=", range.min);
  if (range.max != kInf) text += fmt::format(" and {} {}", range.max_open ? "<" : "<=", range.max);
  return text;
}

std::optional<std::string> check_range(int64_t value, const IntRange& range) {
  if (value >= range.min && value <= range.max) return std::nullopt;
  if (value > range.max && range.max >= kIntFieldMax)
    return fmt::format("is out of range: must be at most {}", range.max);
  return fmt::format("is out of range: must be {}", describe_range(range));
}

std::optional<std::string> check_range(double value, const FloatRange& range) {
  if (!std::isfinite(value)) return fmt::format("is not finite: must be {}", describe_range(range));
  const bool above_min = range.min_open ? value > range.min : value >= range.min;
  const bool below_max = range.max_open ? value < range.max : value <= range.max;
  if (above_min && below_max) return std::nullopt;
  return fmt::format("is out of range: must be {}", describe_range(range));
}

namespace {
constexpr std::string_view kRegexPrefix = "re:";

/// Glob match: `*` any run of characters (dots included), `?` one character, anything else itself.
bool glob_matches(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

std::optional<std::string> check_spec_pattern(std::string_view pattern) {
  if (pattern.empty()) return "an empty pattern matches no parameter; give a glob such as \"h.*.mlp.c_fc.*\"";
  if (!pattern.starts_with(kRegexPrefix)) return std::nullopt;
  try {
    std::regex(std::string(pattern.substr(kRegexPrefix.size())), std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    return fmt::format("the regular expression after \"re:\" does not compile ({})", error.what());
  }
  return std::nullopt;
}

bool spec_pattern_matches(std::string_view pattern, std::string_view name) {
  if (!pattern.starts_with(kRegexPrefix)) return glob_matches(pattern, name);
  const std::regex re(std::string(pattern.substr(kRegexPrefix.size())), std::regex::ECMAScript);
  return std::regex_match(name.begin(), name.end(), re);
}

std::optional<std::string> check_choice(std::string_view value, std::span<const std::string_view> names) {
  if (std::find(names.begin(), names.end(), value) != names.end()) return std::nullopt;
  const std::vector<std::string> candidates(names.begin(), names.end());
  std::string message = fmt::format("is not one of {}", quoted_list(candidates));
  if (auto near = nearest_name(value, candidates)) message += fmt::format("; did you mean \"{}\"?", *near);
  return message;
}

std::string with_article(std::string_view noun) {
  const bool vowel = !noun.empty() && std::string_view("aeiou").find(noun.front()) != std::string_view::npos;
  return fmt::format("{} {}", vowel ? "an" : "a", noun);
}

std::string quote(std::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        quoted += "\\\"";
        break;
      case '\\':
        quoted += "\\\\";
        break;
      case '\b':
        quoted += "\\b";
        break;
      case '\t':
        quoted += "\\t";
        break;
      case '\n':
        quoted += "\\n";
        break;
      case '\f':
        quoted += "\\f";
        break;
      case '\r':
        quoted += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          quoted += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          quoted += c;
        }
    }
  }
  return quoted + '"';
}

void Problems::raise(std::string_view source) const {
  std::vector<Problem> sorted = problems_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Problem& a, const Problem& b) { return a.order < b.order; });
  if (sorted.size() == 1) throw Error(sorted.front().message);
  std::string message = fmt::format("{} problems in config {}:", sorted.size(), source);
  for (const Problem& problem : sorted) message += "\n  " + problem.message;
  throw Error(message);
}

void check_values(const TrainConfig& config, Problems& problems) {
  ValueChecker checker(problems);
  visit_fields(config, checker);
}

void check_rules(const TrainConfig& c, const OriginOf& origin_of, Problems& problems) {
  const auto fail = [&](std::string_view key, std::string message) {
    const Origin origin = origin_of(key);
    problems.add(origin.order, origin.where.empty() ? std::move(message) : origin.where + ": " + message);
  };

  // The parallel sizes (tensor size against mode, pipelines, microbatches) are the parallel layer's
  // rules (parallel/layout_rules.h), passed in as owned rules by whoever loads a config to run it.

  // Sequence parallelism splits the sequence over the 1D tensor group: it needs one, and whole shards.
  if (c.parallel.tensor.sequence_parallel) {
    if (c.parallel.tensor.mode != TensorParallelMode::k1d || c.parallel.tensor.size < 2) {
      fail("parallel.tensor.sequence_parallel",
           fmt::format("parallel.tensor.sequence_parallel = true needs parallel.tensor.mode = \"1d\" and "
                       "parallel.tensor.size > 1 (they are \"{}\" and {}): it splits the sequence over the 1D "
                       "tensor-parallel group",
                       enum_name(c.parallel.tensor.mode), c.parallel.tensor.size));
    } else if (c.data.seq_len > 0 && c.data.seq_len % c.parallel.tensor.size != 0) {
      fail("parallel.tensor.sequence_parallel",
           fmt::format("parallel.tensor.sequence_parallel = true splits each sequence over the tensor ranks, but "
                       "data.seq_len = {} does not divide by parallel.tensor.size = {}; choose a data.seq_len that "
                       "is a multiple of {}",
                       c.data.seq_len, c.parallel.tensor.size, c.parallel.tensor.size));
    }
  }

  // Per-parameter sharding specs: the 1D split of GPT-2 or the ViT, without sequence parallelism.
  if (!c.parallel.tensor.specs.empty()) {
    if (c.parallel.tensor.mode != TensorParallelMode::k1d) {
      fail("parallel.tensor.specs",
           fmt::format("parallel.tensor.specs split parameters over the 1D tensor-parallel group, but "
                       "parallel.tensor.mode = \"{}\"; use mode \"1d\" or drop the specs",
                       enum_name(c.parallel.tensor.mode)));
    } else if (c.parallel.tensor.sequence_parallel) {
      fail("parallel.tensor.specs",
           "parallel.tensor.specs and parallel.tensor.sequence_parallel = true: sequence parallelism is built for "
           "the built-in policy only; drop the specs or set sequence_parallel = false");
    }
    if (c.model.name != ModelName::kGpt2 && c.model.name != ModelName::kVit) {
      fail("parallel.tensor.specs",
           fmt::format("parallel.tensor.specs split the linear layers of model.name = \"gpt2\" or \"vit\", and "
                       "model.name = \"{}\" has no tensor-parallel form; drop them",
                       enum_name(c.model.name)));
    }
  }

  // Precision.
  if (c.bf16 && c.fp16.mode != AmpMode::kOff) {
    fail("bf16", fmt::format("bf16 = true and fp16.mode = \"{}\" both ask for mixed precision; keep one "
                             "(fp16.mode = \"off\" or bf16 = false)",
                             enum_name(c.fp16.mode)));
  }
  if (c.fp16.max_scale < c.fp16.initial_scale) {
    fail("fp16.max_scale", fmt::format("fp16.max_scale = {} is below fp16.initial_scale = {}",
                                       format_number(c.fp16.max_scale), format_number(c.fp16.initial_scale)));
  }

  // ZeRO.
  if (c.zero.placement_policy != ZeroPlacement::kCuda && c.zero.stage != 3) {
    fail("zero.placement_policy",
         fmt::format("zero.placement_policy = \"{}\" places ZeRO-3 parameter chunks and needs zero.stage = 3 "
                     "(it is {})",
                     enum_name(c.zero.placement_policy), c.zero.stage));
  }
  if (c.zero.offload_optimizer && c.zero.stage == 0) {
    fail("zero.offload_optimizer", "zero.offload_optimizer = true needs ZeRO: set zero.stage to 1, 2 or 3");
  }

  // Model presets.
  if (!c.model.preset.empty()) {
    const std::span<const std::string_view> presets = model_presets(c.model.name);
    if (presets.empty()) {
      fail("model.preset", fmt::format("model.preset = {}: model \"{}\" has no presets; set its sizes in "
                                       "model.options",
                                       quote(c.model.preset), enum_name(c.model.name)));
    } else if (auto why = check_choice(c.model.preset, presets)) {
      fail("model.preset", fmt::format("model.preset = {} {} (the presets of model \"{}\")", quote(c.model.preset),
                                       *why, enum_name(c.model.name)));
    }
  }

  // Data.
  if (c.data.dataset != DatasetName::kSynthetic && c.data.path.empty()) {
    fail("data.dataset", fmt::format("data.path is empty, but data.dataset = \"{}\" reads its files from there",
                                     enum_name(c.data.dataset)));
  }

  // Optimizer.
  if (c.optimizer.name == OptimizerName::kSgd && c.optimizer.nesterov && c.optimizer.momentum == 0) {
    fail("optimizer.nesterov", "optimizer.nesterov = true needs optimizer.momentum > 0");
  }

  // Learning-rate schedule.
  const LrSchedulerConfig& s = c.lr_scheduler;
  if (s.warmup_steps > 0 && s.warmup_epochs > 0) {
    fail("lr_scheduler.warmup_epochs",
         fmt::format("lr_scheduler.warmup_steps = {} and lr_scheduler.warmup_epochs = {}: set only one", s.warmup_steps,
                     s.warmup_epochs));
  }
  if (s.total_steps > 0 && s.warmup_steps > s.total_steps) {
    fail("lr_scheduler.warmup_steps", fmt::format("lr_scheduler.warmup_steps = {} exceeds lr_scheduler.total_steps "
                                                  "= {}",
                                                  s.warmup_steps, s.total_steps));
  }
  for (std::size_t i = 1; i < s.milestones.size(); ++i) {
    if (s.milestones[i] <= s.milestones[i - 1]) {
      fail("lr_scheduler.milestones", fmt::format("lr_scheduler.milestones must increase: [{}] = {} follows [{}] = {}",
                                                  i, s.milestones[i], i - 1, s.milestones[i - 1]));
      break;
    }
  }
  if (s.name == SchedulerName::kMultistep && s.milestones.empty()) {
    fail("lr_scheduler.name", "lr_scheduler.name = \"multistep\" needs lr_scheduler.milestones (steps to decay at)");
  }
  if ((s.name == SchedulerName::kCosine || s.name == SchedulerName::kPolynomial) && s.eta_min > c.optimizer.lr) {
    fail("lr_scheduler.eta_min", fmt::format("lr_scheduler.eta_min = {} is above optimizer.lr = {}: the schedule "
                                             "would raise the rate",
                                             format_number(s.eta_min), format_number(c.optimizer.lr)));
  }

  // The loop.
  if (c.train.epochs == 0 && c.train.max_steps == 0) {
    fail("train.epochs", "train.epochs = 0 and train.max_steps = 0: the run would never end; set either");
  }
}

void check_owned_rules(const TrainConfig& config, const ConfigRules& rules, const OriginOf& origin_of,
                       Problems& problems) {
  for (const ConfigRule& rule : rules) {
    rule(config, [&](std::string_view key, std::string message) {
      const Origin origin = origin_of(key);
      problems.add(origin.order, origin.where.empty() ? std::move(message) : origin.where + ": " + message);
    });
  }
}

}  // namespace colossal::config::detail

namespace colossal::config {

bool TensorSpecRule::matches(std::string_view name) const {
  return detail::spec_pattern_matches(pattern, name);
}

}  // namespace colossal::config
