// OptionTable's typed getters, its unknown-key check, and TOML spelling of option values.
#include "colossal/config/option_table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "colossal/config/rules.h"    // quote
#include "colossal/config/suggest.h"  // nearest_name
#include "colossal/core/error.h"      // colossal::Error

namespace colossal::config {

std::string_view type_name(const OptionValue& value) {
  switch (value.value.index()) {
    case 0:
      return "boolean";
    case 1:
      return "integer";
    case 2:
      return "float";
    case 3:
      return "string";
    default:
      return "array";
  }
}

std::string to_toml(const OptionValue& value) {
  if (const bool* b = std::get_if<bool>(&value.value)) return *b ? "true" : "false";
  if (const int64_t* i = std::get_if<int64_t>(&value.value)) return fmt::format("{}", *i);
  if (const double* d = std::get_if<double>(&value.value)) return toml_float(*d);
  if (const std::string* s = std::get_if<std::string>(&value.value)) return detail::quote(*s);
  const auto& array = std::get<OptionValue::Array>(value.value);
  std::string text = "[";
  for (std::size_t i = 0; i < array.size(); ++i) text += (i ? ", " : "") + to_toml(array[i]);
  return text + "]";
}

std::string toml_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

void OptionTable::set(const std::string& key, OptionValue value, std::string origin) {
  values_.insert_or_assign(key, std::move(value));
  if (origin.empty()) {
    origins_.erase(key);
  } else {
    origins_.insert_or_assign(key, std::move(origin));
  }
}

const OptionValue* OptionTable::find(std::string_view key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::string OptionTable::describe_key(std::string_view key) const {
  const std::string full = prefix_.empty() ? std::string(key) : fmt::format("{}.{}", prefix_, key);
  const auto it = origins_.find(key);
  return it == origins_.end() ? full : fmt::format("{}: {}", it->second, full);
}

int64_t OptionTable::get_int(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
  const OptionValue* value = find(key);
  if (value == nullptr) return fallback;
  const int64_t* i = std::get_if<int64_t>(&value->value);
  if (i == nullptr) {
    throw Error(fmt::format("{} = {}: expected an integer, got {}", describe_key(key), to_toml(*value),
                            detail::with_article(type_name(*value))));
  }
  if (*i < min || *i > max) {
    throw Error(fmt::format("{} = {} is out of range: must be between {} and {}", describe_key(key), *i, min, max));
  }
  return *i;
}

double OptionTable::get_double(std::string_view key, double fallback, double min, double max) const {
  const OptionValue* value = find(key);
  if (value == nullptr) return fallback;
  double d = 0;
  if (const int64_t* i = std::get_if<int64_t>(&value->value)) {
    d = static_cast<double>(*i);
  } else if (const double* f = std::get_if<double>(&value->value)) {
    d = *f;
  } else {
    throw Error(fmt::format("{} = {}: expected a number, got {}", describe_key(key), to_toml(*value),
                            detail::with_article(type_name(*value))));
  }
  if (!(d >= min && d <= max)) {
    throw Error(fmt::format("{} = {} is out of range: must be between {} and {}", describe_key(key), to_toml(*value),
                            min, max));
  }
  return d;
}

bool OptionTable::get_bool(std::string_view key, bool fallback) const {
  const OptionValue* value = find(key);
  if (value == nullptr) return fallback;
  const bool* b = std::get_if<bool>(&value->value);
  if (b == nullptr) {
    throw Error(fmt::format("{} = {}: expected a boolean (true or false), got {}", describe_key(key), to_toml(*value),
                            detail::with_article(type_name(*value))));
  }
  return *b;
}

std::string OptionTable::get_string(std::string_view key, std::string_view fallback) const {
  const OptionValue* value = find(key);
  if (value == nullptr) return std::string(fallback);
  const std::string* s = std::get_if<std::string>(&value->value);
  if (s == nullptr) {
    throw Error(fmt::format("{} = {}: expected a string, got {}", describe_key(key), to_toml(*value),
                            detail::with_article(type_name(*value))));
  }
  return *s;
}

void OptionTable::reject_unknown(std::initializer_list<std::string_view> known) const {
  const std::vector<std::string> candidates(known.begin(), known.end());
  std::vector<std::string> problems;
  for (const auto& [key, value] : values_) {
    if (std::find(candidates.begin(), candidates.end(), key) != candidates.end()) continue;
    std::string message = fmt::format("{}: unknown option", describe_key(key));
    if (auto near = nearest_name(key, candidates)) {
      message += fmt::format("; did you mean \"{}\"?", *near);
    } else {
      message += fmt::format("; the options are {}", quoted_list(candidates));
    }
    problems.push_back(std::move(message));
  }
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front());
  std::string message = fmt::format("{} unknown options in {}:", problems.size(), prefix_);
  for (const std::string& problem : problems) message += "\n  " + problem;
  throw Error(message);
}

}  // namespace colossal::config
