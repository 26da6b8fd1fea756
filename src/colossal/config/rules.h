// Internal to config/: the checks on values (ranges, choices) and the rules between keys that both
// load_config and validate apply, and the collector that turns their findings into one error.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/config/schema.h"

namespace colossal::config::detail {

/// "between 1 and 3", ">= 0", "> 0 and < 1": what a range allows, for messages.
std::string describe_range(const IntRange& range);
std::string describe_range(const FloatRange& range);

/// Why `value` breaks the range ("is out of range: must be ..."), or nothing when it is inside.
std::optional<std::string> check_range(int64_t value, const IntRange& range);
std::optional<std::string> check_range(double value, const FloatRange& range);

/// Why `value` is not among `names` (with the nearest as a suggestion), or nothing when it is.
std::optional<std::string> check_choice(std::string_view value, std::span<const std::string_view> names);

/// Why a parallel.tensor.specs pattern cannot match anything (empty; a regular expression after
/// "re:" that does not compile), or nothing when it is usable.
std::optional<std::string> check_spec_pattern(std::string_view pattern);

/// Whether `name` matches a parallel.tensor.specs pattern (config/train_config.h: TensorSpecRule).
bool spec_pattern_matches(std::string_view pattern, std::string_view name);

/// "an integer", "a string": a type name with its article, for "got ..." in messages.
std::string with_article(std::string_view noun);

/// A TOML string literal: quoted, with escapes.
std::string quote(std::string_view text);

/// The problems found in a config, each with an ordering key (file position, then overrides in
/// order) so that they are reported as they appear.
class Problems {
 public:
  void add(int64_t order, std::string message) { problems_.push_back({order, std::move(message)}); }
  bool empty() const { return problems_.empty(); }
  /// Throws colossal::Error: the one problem, or "N problems in <source>:" and one per line.
  [[noreturn]] void raise(std::string_view source) const;
  /// raise() when there is any problem.
  void raise_if_any(std::string_view source) const {
    if (!empty()) raise(source);
  }

 private:
  struct Problem {
    int64_t order;
    std::string message;
  };
  std::vector<Problem> problems_;
};

/// Where a key's value came from ("train.toml:12", "--set key=value") and its ordering key;
/// an empty origin for keys that kept their default or configs built in code.
struct Origin {
  std::string where;
  int64_t order = 0;
};
using OriginOf = std::function<Origin(std::string_view key)>;

/// Every value's range or choices (for configs built in code; the loader checks as it binds).
void check_values(const TrainConfig& config, Problems& problems);

/// The rules between keys: tensor size against mode, the interleaved schedule's needs, microbatch
/// split, fp16 against bf16, ZeRO placement against stage, presets per model, dataset paths,
/// scheduler settings, a run that ends. Each problem names the keys involved and the origin of the
/// first of them.
void check_rules(const TrainConfig& config, const OriginOf& origin_of, Problems& problems);

/// Runs the rules other layers own (load_config's `rules`), each problem prefixed with its key's origin.
void check_owned_rules(const TrainConfig& config, const ConfigRules& rules, const OriginOf& origin_of,
                       Problems& problems);

}  // namespace colossal::config::detail
