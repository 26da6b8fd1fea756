// OptionTable: the free-form parts of a config (model.options, data.options) whose keys belong to the
// code that consumes them (a model builder, a dataset), with typed getters whose errors name the full
// dotted key and where it was set, as the config loader's own errors do.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace colossal::config {

/// One option value: anything TOML can write except dates and times. Nested tables are flattened
/// into dotted keys ("a.b") by the loader.
struct OptionValue {
  using Array = std::vector<OptionValue>;
  std::variant<bool, int64_t, double, std::string, Array> value;

  friend bool operator==(const OptionValue&, const OptionValue&) = default;
};

/// "integer", "float", ... : the TOML type name of a value, for messages.
std::string_view type_name(const OptionValue& value);

/// The value as TOML writes it (strings quoted and escaped, floats always with a '.' or exponent).
std::string to_toml(const OptionValue& value);

/// A double as TOML writes it: the shortest text that reads back to the same value, with a '.' or an
/// exponent so that it stays a float ("65536.0", "0.001", "1e+20", "inf").
std::string toml_float(double value);

class OptionTable {
 public:
  OptionTable() = default;
  /// `prefix` is the table's own dotted key ("model.options"); messages put it before each key.
  explicit OptionTable(std::string prefix) : prefix_(std::move(prefix)) {}

  /// Sets `key` (relative to the table, may be dotted); `origin` says where it came from
  /// ("train.toml:12", "--set model.options.n_layer=2") for later messages.
  void set(const std::string& key, OptionValue value, std::string origin = {});

  bool contains(std::string_view key) const { return values_.find(key) != values_.end(); }
  bool empty() const { return values_.empty(); }
  const std::map<std::string, OptionValue, std::less<>>& values() const { return values_; }
  const std::string& prefix() const { return prefix_; }

  /// Typed reads: `fallback` when the key is absent; colossal::Error naming the full key, its origin
  /// and the expected type or range when present but wrong. get_double accepts integers too.
  int64_t get_int(std::string_view key, int64_t fallback, int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max()) const;
  double get_double(std::string_view key, double fallback, double min = -std::numeric_limits<double>::infinity(),
                    double max = std::numeric_limits<double>::infinity()) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;

  /// Throws colossal::Error listing every key not in `known`, each with the nearest known key as a
  /// suggestion. Consumers call it once they know their schema.
  void reject_unknown(std::initializer_list<std::string_view> known) const;

  /// Equal values; prefixes and origins do not count.
  friend bool operator==(const OptionTable& a, const OptionTable& b) { return a.values_ == b.values_; }

 private:
  const OptionValue* find(std::string_view key) const;
  /// "model.options.n_layer (train.toml:12)".
  std::string describe_key(std::string_view key) const;

  std::string prefix_;
  std::map<std::string, OptionValue, std::less<>> values_;
  std::map<std::string, std::string, std::less<>> origins_;
};

}  // namespace colossal::config
