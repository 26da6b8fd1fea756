// TOML -> TrainConfig: parse the file, flatten it into dotted keys with their origins, lay the
// --set overrides over it, bind each schema field (type and range checked), report what is left as
// unknown keys with suggestions, then apply the rules between keys.
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "colossal/config/rules.h"
#include "colossal/config/suggest.h"
#include "colossal/config/train_config.h"
#include "colossal/core/error.h"  // colossal::Error

namespace colossal::config {

namespace {

using detail::ArraySize;
using detail::Choices;
using detail::FloatRange;
using detail::IntRange;
using detail::Origin;
using detail::Problems;

/// Overrides sort after everything in the file.
constexpr int64_t kOverrideOrder = int64_t{1} << 40;

/// The keys of TrainConfig: its fields, the sections (tables) holding them, and the free-form
/// option tables, below which any key goes.
struct Schema {
  std::vector<std::string> fields;
  std::set<std::string, std::less<>> field_set;
  std::set<std::string, std::less<>> sections;
  std::set<std::string, std::less<>> option_tables;

  template <class T, class... Constraints>
  void operator()(std::string_view key, const T&, const Constraints&...) {
    fields.emplace_back(key);
    field_set.emplace(key);
    for (std::size_t dot = key.find('.'); dot != std::string_view::npos; dot = key.find('.', dot + 1)) {
      sections.emplace(key.substr(0, dot));
    }
    if constexpr (std::is_same_v<T, OptionTable>) option_tables.emplace(key);
  }

  /// An option table or a key below one.
  bool is_open(std::string_view key) const {
    for (const std::string& table : option_tables) {
      if (key == table || (key.starts_with(table) && key.size() > table.size() && key[table.size()] == '.')) {
        return true;
      }
    }
    return false;
  }

  static const Schema& get() {
    static const Schema schema = [] {
      Schema s;
      const TrainConfig defaults;
      detail::visit_fields(defaults, s);
      return s;
    }();
    return schema;
  }
};

std::string parent_of(std::string_view key) {
  const std::size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? std::string() : std::string(key.substr(0, dot));
}

std::string leaf_of(std::string_view key) {
  const std::size_t dot = key.rfind('.');
  return std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
}

/// One value of the flattened document.
struct Entry {
  const toml::node* node = nullptr;
  Origin origin;
  bool used = false;
};
using FlatMap = std::map<std::string, Entry, std::less<>>;

std::string_view node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

/// The node as an option value; nothing for dates, times, tables and arrays holding them.
std::optional<OptionValue> to_option_value(const toml::node& node) {
  if (const auto* b = node.as_boolean()) return OptionValue{b->get()};
  if (const auto* i = node.as_integer()) return OptionValue{i->get()};
  if (const auto* f = node.as_floating_point()) return OptionValue{f->get()};
  if (const auto* s = node.as_string()) return OptionValue{s->get()};
  if (const auto* array = node.as_array()) {
    OptionValue::Array values;
    for (const toml::node& element : *array) {
      std::optional<OptionValue> value = to_option_value(element);
      if (!value) return std::nullopt;
      values.push_back(std::move(*value));
    }
    return OptionValue{std::move(values)};
  }
  return std::nullopt;
}

/// "key = value" for messages, or "key (a table)" where the value has no short spelling.
std::string key_and_value(std::string_view key, const toml::node& node) {
  if (std::optional<OptionValue> value = to_option_value(node)) return fmt::format("{} = {}", key, to_toml(*value));
  return fmt::format("{} ({})", key, detail::with_article(node_type_name(node)));
}

std::string with_origin(const Origin& origin, std::string_view message) {
  return origin.where.empty() ? std::string(message) : fmt::format("{}: {}", origin.where, message);
}

/// Adds `node` under `key` to the flat map: tables of sections and option tables are opened, every
/// other value (including a table where a field or unknown key is) is one entry.
void flatten(const std::string& key, const toml::node& node, const std::function<Origin(const toml::node&)>& origin_of,
             FlatMap& flat, Problems& problems) {
  const Schema& schema = Schema::get();
  const bool section = schema.sections.contains(key);
  if ((section || schema.is_open(key)) && node.is_table()) {
    for (const auto& [name, child] : *node.as_table())
      flatten(key + "." + std::string(name.str()), child, origin_of, flat, problems);
    return;
  }
  if (section) {
    const Origin origin = origin_of(node);
    problems.add(origin.order,
                 with_origin(origin, fmt::format("{} is a section and must be a table ([{}] or "
                                                 "{} = {{...}}), got {}",
                                                 key, key, key, detail::with_article(node_type_name(node)))));
    return;
  }
  flat.insert_or_assign(key, Entry{&node, origin_of(node)});
}

/// Binds the flat entries to the fields of a TrainConfig, checking each value's type and range.
class Binder {
 public:
  Binder(FlatMap& flat, Problems& problems) : flat_(flat), problems_(problems) {}

  void operator()(std::string_view key, bool& field) {
    if (const Entry* e = take(key)) {
      if (const auto* b = e->node->as_boolean()) {
        field = b->get();
      } else {
        wrong_type(*e, key, "a boolean (true or false)");
      }
    }
  }

  template <class T>
  requires std::is_integral_v<T>
  void operator()(std::string_view key, T& field, const IntRange& range) {
    if (const Entry* e = take(key)) {
      const auto* i = e->node->as_integer();
      if (i == nullptr) return wrong_type(*e, key, "an integer");
      if (auto why = detail::check_range(i->get(), range))
        return report(*e, fmt::format("{} = {} {}", key, i->get(), *why));
      field = static_cast<T>(i->get());
    }
  }

  void operator()(std::string_view key, double& field, const FloatRange& range) {
    if (const Entry* e = take(key)) {
      const std::optional<double> value = number(*e->node);
      if (!value) return wrong_type(*e, key, "a number");
      if (auto why = detail::check_range(*value, range)) {
        return report(*e, fmt::format("{} {}", key_and_value(key, *e->node), *why));
      }
      field = *value;
    }
  }

  void operator()(std::string_view key, std::string& field) {
    if (const Entry* e = take(key)) {
      if (const auto* s = e->node->as_string()) {
        field = s->get();
      } else {
        wrong_type(*e, key, "a string");
      }
    }
  }

  template <class E>
  requires std::is_enum_v<E>
  void operator()(std::string_view key, E& field) {
    if (const Entry* e = take(key)) {
      const auto* s = e->node->as_string();
      std::vector<std::string_view> names;
      for (const auto& entry : detail::enum_entries(E{})) names.push_back(entry.name);
      if (s == nullptr) {
        return wrong_type(*e, key, fmt::format("one of the strings {}", quoted(names)));
      }
      for (const auto& entry : detail::enum_entries(E{})) {
        if (entry.name == s->get()) {
          field = entry.value;
          return;
        }
      }
      report(*e, fmt::format("{} {}", key_and_value(key, *e->node), *detail::check_choice(s->get(), names)));
    }
  }

  void operator()(std::string_view key, std::vector<std::string>& field, const Choices& choices) {
    if (const Entry* e = take(key)) {
      const toml::array* array = e->node->as_array();
      if (array == nullptr) return wrong_type(*e, key, "an array of strings");
      std::vector<std::string> values;
      bool ok = true;
      for (std::size_t i = 0; i < array->size(); ++i) {
        const auto* s = (*array)[i].as_string();
        const std::string element = fmt::format("{}[{}]", key, i);
        if (s == nullptr) {
          wrong_type(*e, element, "a string", &(*array)[i]);
          ok = false;
        } else if (auto why = detail::check_choice(s->get(), choices.names)) {
          report(*e, fmt::format("{} = {} {}", element, detail::quote(s->get()), *why));
          ok = false;
        } else {
          values.push_back(s->get());
        }
      }
      if (ok) field = std::move(values);
    }
  }

  void operator()(std::string_view key, std::vector<double>& field, const FloatRange& range, const ArraySize& size) {
    if (const Entry* e = take(key)) {
      const toml::array* array = e->node->as_array();
      if (array == nullptr) return wrong_type(*e, key, "an array of numbers");
      if (array->size() < size.min || array->size() > size.max) {
        return report(*e, fmt::format("{}: expected {} numbers, got {}", key_and_value(key, *e->node),
                                      size.min == size.max ? fmt::format("{}", size.min)
                                                           : fmt::format("{} to {}", size.min, size.max),
                                      array->size()));
      }
      std::vector<double> values;
      bool ok = true;
      for (std::size_t i = 0; i < array->size(); ++i) {
        const std::string element = fmt::format("{}[{}]", key, i);
        const std::optional<double> value = number((*array)[i]);
        if (!value) {
          wrong_type(*e, element, "a number", &(*array)[i]);
          ok = false;
        } else if (auto why = detail::check_range(*value, range)) {
          report(*e, fmt::format("{} {}", key_and_value(element, (*array)[i]), *why));
          ok = false;
        } else {
          values.push_back(*value);
        }
      }
      if (ok) field = std::move(values);
    }
  }

  void operator()(std::string_view key, std::vector<int64_t>& field, const IntRange& range) {
    if (const Entry* e = take(key)) {
      const toml::array* array = e->node->as_array();
      if (array == nullptr) return wrong_type(*e, key, "an array of integers");
      std::vector<int64_t> values;
      bool ok = true;
      for (std::size_t i = 0; i < array->size(); ++i) {
        const std::string element = fmt::format("{}[{}]", key, i);
        const auto* value = (*array)[i].as_integer();
        if (value == nullptr) {
          wrong_type(*e, element, "an integer", &(*array)[i]);
          ok = false;
        } else if (auto why = detail::check_range(value->get(), range)) {
          report(*e, fmt::format("{} = {} {}", element, value->get(), *why));
          ok = false;
        } else {
          values.push_back(value->get());
        }
      }
      if (ok) field = std::move(values);
    }
  }

  /// An array of { pattern = "...", spec = "..." } tables; every problem of every rule is reported.
  void operator()(std::string_view key, std::vector<TensorSpecRule>& field) {
    if (const Entry* e = take(key)) {
      const toml::array* array = e->node->as_array();
      if (array == nullptr) {
        return wrong_type(*e, key, "an array of rules { pattern = \"<glob>\", spec = \"column\" }");
      }
      std::vector<std::string_view> splits;
      for (const auto& entry : detail::enum_entries(TensorSplit{})) splits.push_back(entry.name);
      static constexpr std::string_view kRuleKeys[] = {"pattern", "spec"};
      std::vector<TensorSpecRule> rules;
      bool ok = true;
      for (std::size_t i = 0; i < array->size(); ++i) {
        const std::string element = fmt::format("{}[{}]", key, i);
        const toml::table* table = (*array)[i].as_table();
        if (table == nullptr) {
          wrong_type(*e, element, "a rule { pattern = \"<glob>\", spec = \"column\" }", &(*array)[i]);
          ok = false;
          continue;
        }
        for (const auto& [name, value] : *table) {
          if (!detail::check_choice(name.str(), kRuleKeys)) continue;
          report(*e,
                 fmt::format("{}: key \"{}\" {}", element, name.str(), *detail::check_choice(name.str(), kRuleKeys)));
          ok = false;
        }
        TensorSpecRule rule;
        const toml::node* pattern = table->get("pattern");
        if (pattern == nullptr) {
          report(*e, fmt::format("{} has no pattern: give the parameter names it applies to, a glob such as "
                                 "\"h.*.mlp.c_fc.*\" or a regular expression after \"re:\"",
                                 element));
          ok = false;
        } else if (const auto* text = pattern->as_string(); text == nullptr) {
          wrong_type(*e, element + ".pattern", "a string", pattern);
          ok = false;
        } else if (auto why = detail::check_spec_pattern(text->get())) {
          report(*e, fmt::format("{}.pattern = {}: {}", element, detail::quote(text->get()), *why));
          ok = false;
        } else {
          rule.pattern = text->get();
        }
        const toml::node* spec = table->get("spec");
        if (spec == nullptr) {
          report(*e, fmt::format("{} has no spec: one of {}", element, quoted(splits)));
          ok = false;
        } else if (const auto* text = spec->as_string(); text == nullptr) {
          wrong_type(*e, element + ".spec", fmt::format("one of the strings {}", quoted(splits)), spec);
          ok = false;
        } else if (auto why = detail::check_choice(text->get(), splits)) {
          report(*e, fmt::format("{}.spec = {} {}", element, detail::quote(text->get()), *why));
          ok = false;
        } else {
          for (const auto& entry : detail::enum_entries(TensorSplit{})) {
            if (entry.name == text->get()) rule.spec = entry.value;
          }
        }
        rules.push_back(std::move(rule));
      }
      if (ok) field = std::move(rules);
    }
  }

  void operator()(std::string_view key, OptionTable& field) {
    // The table itself given as something other than a table.
    if (const Entry* e = take(key)) return wrong_type(*e, key, "a table of options");
    const std::string prefix = std::string(key) + ".";
    for (auto it = flat_.lower_bound(prefix); it != flat_.end() && it->first.starts_with(prefix); ++it) {
      Entry& e = it->second;
      e.used = true;
      std::optional<OptionValue> value = to_option_value(*e.node);
      if (!value) {
        report(e, fmt::format("{}: options are booleans, numbers, strings or arrays of them, got {}", it->first,
                              detail::with_article(node_type_name(*e.node))));
        continue;
      }
      field.set(it->first.substr(prefix.size()), std::move(*value), e.origin.where);
    }
  }

 private:
  static std::optional<double> number(const toml::node& node) {
    if (const auto* i = node.as_integer()) return static_cast<double>(i->get());
    if (const auto* f = node.as_floating_point()) return f->get();
    return std::nullopt;
  }

  static std::string quoted(std::span<const std::string_view> names) {
    return quoted_list(std::vector<std::string>(names.begin(), names.end()));
  }

  Entry* take(std::string_view key) {
    const auto it = flat_.find(key);
    if (it == flat_.end()) return nullptr;
    it->second.used = true;
    return &it->second;
  }

  void report(const Entry& e, std::string_view message) {
    problems_.add(e.origin.order, with_origin(e.origin, message));
  }

  void wrong_type(const Entry& e, std::string_view key, std::string_view expected, const toml::node* node = nullptr) {
    const toml::node& value = node ? *node : *e.node;
    report(e, fmt::format("{}: expected {}, got {}", key_and_value(key, value), expected,
                          detail::with_article(node_type_name(value))));
  }

  FlatMap& flat_;
  Problems& problems_;
};

/// "unknown key ...; did you mean ...?" for a key no field or section has.
std::string unknown_key_message(const std::string& key) {
  const Schema& schema = Schema::get();
  const std::string parent = parent_of(key);
  const std::string leaf = leaf_of(key);
  // 1. A typo of a sibling: a field or section with the same parent.
  std::vector<std::string> siblings;
  const auto add_sibling = [&](const std::string& name) {
    if (parent_of(name) == parent) siblings.push_back(leaf_of(name));
  };
  for (const std::string& field : schema.fields) add_sibling(field);
  for (const std::string& section : schema.sections) add_sibling(section);
  if (auto near = nearest_name(leaf, siblings)) {
    return fmt::format("unknown key \"{}\"; did you mean \"{}\"?", key, parent.empty() ? *near : parent + "." + *near);
  }
  // 2. The right name in another section (lr at the top level for optimizer.lr).
  for (const std::string& field : schema.fields) {
    if (edit_distance(leaf_of(field), leaf) == 0)
      return fmt::format("unknown key \"{}\"; did you mean \"{}\"?", key, field);
  }
  // 3. The whole dotted key mistyped.
  if (auto near = nearest_name(key, schema.fields))
    return fmt::format("unknown key \"{}\"; did you mean \"{}\"?", key, *near);
  return fmt::format("unknown key \"{}\"; the keys {} are {}", key,
                     parent.empty() ? "at the top level" : "in [" + parent + "]", quoted_list(siblings));
}

/// Lays "key=value" over the flat map, replacing the key and everything below or above it.
void apply_override(const std::string& spec, int64_t index, std::deque<toml::table>& storage, FlatMap& flat,
                    Problems& problems) {
  const Origin origin{"--set " + spec, kOverrideOrder + index};
  const std::size_t equals = spec.find('=');
  const auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  const std::string key(trim(std::string_view(spec).substr(0, equals == std::string::npos ? 0 : equals)));
  bool key_ok = !key.empty() && key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos;
  for (const char c : key) {
    key_ok = key_ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                        c == '-' || c == '.');
  }
  if (equals == std::string::npos || !key_ok) {
    problems.add(origin.order, with_origin(origin, "expected dotted.key=value (for example optimizer.lr=3e-4)"));
    return;
  }
  const std::string_view value = trim(std::string_view(spec).substr(equals + 1));

  std::optional<toml::table> parsed;
  std::string why_not;
  try {
    toml::table table = toml::parse(fmt::format("v = {}", value), std::string_view(origin.where));
    if (table.size() == 1 && table.contains("v")) {
      parsed = std::move(table);
    } else {
      why_not = "it holds more than one value";
    }
  } catch (const toml::parse_error& error) {
    why_not = std::string(error.description());
    // Quoted strings, arrays and tables must be valid TOML; anything else is taken as a bare string.
    const bool structured = !value.empty() && (value.front() == '"' || value.front() == '\'' || value.front() == '[' ||
                                               value.front() == '{');
    if (!structured) {
      parsed.emplace();
      parsed->insert("v", std::string(value));
    }
  }
  if (!parsed) {
    problems.add(origin.order, with_origin(origin, fmt::format("{} is not a TOML value ({})", value, why_not)));
    return;
  }
  storage.push_back(std::move(*parsed));

  // The override replaces the key's whole subtree and any value at a key above it.
  for (auto it = flat.lower_bound(key); it != flat.end() && (it->first == key || it->first.starts_with(key + "."));) {
    it = flat.erase(it);
  }
  for (std::size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    flat.erase(key.substr(0, dot));
  }
  flatten(
      key, *storage.back().get("v"), [&](const toml::node&) { return origin; }, flat, problems);
}

}  // namespace

TrainConfig parse_config(std::string_view toml_text, const std::vector<std::string>& overrides,
                         std::string_view source_name, const ConfigRules& rules) {
  const std::string source(source_name);
  toml::table document;
  try {
    document = toml::parse(toml_text, std::string_view(source));
  } catch (const toml::parse_error& error) {
    throw Error(fmt::format("{}:{}:{}: TOML syntax error: {}", source, error.source().begin.line,
                            error.source().begin.column, error.description()));
  }

  Problems problems;
  FlatMap flat;
  const auto file_origin = [&](const toml::node& node) {
    const toml::source_position begin = node.source().begin;
    return Origin{fmt::format("{}:{}", source, begin.line),
                  static_cast<int64_t>(begin.line) * 100000 + static_cast<int64_t>(begin.column)};
  };
  for (const auto& [name, node] : document) flatten(std::string(name.str()), node, file_origin, flat, problems);
  std::deque<toml::table> override_values;
  for (std::size_t i = 0; i < overrides.size(); ++i) {
    apply_override(overrides[i], static_cast<int64_t>(i), override_values, flat, problems);
  }

  TrainConfig config;
  Binder binder(flat, problems);
  detail::visit_fields(config, binder);
  for (const auto& [key, entry] : flat) {
    if (!entry.used) problems.add(entry.origin.order, with_origin(entry.origin, unknown_key_message(key)));
  }
  // The rules between keys read bound values: only meaningful once every value bound.
  if (problems.empty()) {
    const auto origin_of = [&](std::string_view key) {
      const auto it = flat.find(key);
      return it == flat.end() ? Origin{} : it->second.origin;
    };
    detail::check_rules(config, origin_of, problems);
    detail::check_owned_rules(config, rules, origin_of, problems);
  }
  problems.raise_if_any(source);
  return config;
}

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides,
                        const ConfigRules& rules) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error(
        fmt::format("cannot read config file '{}': {}", path.string(), error ? error.message() : "not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw Error(fmt::format("cannot open config file '{}': {}", path.string(), std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), overrides, path.string(), rules);
}

void validate(const TrainConfig& config, const ConfigRules& rules) {
  Problems problems;
  detail::check_values(config, problems);
  const auto no_origin = [](std::string_view) { return Origin{}; };
  detail::check_rules(config, no_origin, problems);
  if (problems.empty()) detail::check_owned_rules(config, rules, no_origin, problems);
  problems.raise_if_any("(built in code)");
}

}  // namespace colossal::config
