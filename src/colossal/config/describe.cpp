// describe(): the effective TrainConfig as TOML that parse_config reads back, and the enums' names.
#include <fmt/format.h>

#include <string>
#include <type_traits>
#include <vector>

#include "colossal/config/rules.h"  // quote
#include "colossal/config/schema.h"

namespace colossal::config {

namespace {

template <class E>
std::string_view enum_name(E value) {
  for (const auto& entry : detail::enum_entries(value)) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

/// A key component as TOML writes it: bare when it can be, quoted otherwise.
std::string toml_key(std::string_view component) {
  const bool bare = !component.empty() && component.find_first_not_of(
                                              "abcdefghijklmnopqrstuvwxyz"
                                              "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string_view::npos;
  return bare ? std::string(component) : detail::quote(component);
}

/// A dotted option key ("a.b") as TOML key components.
std::string toml_dotted_key(std::string_view key) {
  std::string text;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    text += toml_key(key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return text;
    text += '.';
    start = dot + 1;
  }
}

/// "[a, b, c]" with each element spelled by `spell`.
template <class T, class F>
std::string array_text(const std::vector<T>& values, F spell) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + spell(values[i]);
  return text + "]";
}

std::string choices_comment(std::span<const std::string_view> names) {
  std::string text;
  for (const std::string_view name : names) text += fmt::format("{}{}", text.empty() ? "" : " | ", name);
  return text;
}

template <class E>
std::vector<std::string_view> names_of(E value) {
  std::vector<std::string_view> names;
  for (const auto& entry : detail::enum_entries(value)) names.push_back(entry.name);
  return names;
}

/// Writes each field as "leaf = value" under its section's [header], top-level keys first.
class Describer {
 public:
  void operator()(std::string_view key, const bool& value) { line(key, value ? "true" : "false"); }
  template <class T>
  void operator()(std::string_view key, const T& value, const detail::IntRange&) {
    line(key, fmt::format("{}", value));
  }
  void operator()(std::string_view key, const double& value, const detail::FloatRange&) {
    line(key, toml_float(value));
  }
  void operator()(std::string_view key, const std::string& value) { line(key, detail::quote(value)); }
  template <class E>
  requires std::is_enum_v<E>
  void operator()(std::string_view key, const E& value) {
    std::vector<std::string_view> names;
    for (const auto& entry : detail::enum_entries(value)) names.push_back(entry.name);
    line(key, detail::quote(enum_name(value)), choices_comment(names));
  }
  void operator()(std::string_view key, const std::vector<std::string>& values, const detail::Choices& choices) {
    line(key, array_text(values, [](const std::string& value) { return detail::quote(value); }),
         "any of " + choices_comment(choices.names));
  }
  void operator()(std::string_view key, const std::vector<double>& values, const detail::FloatRange&,
                  const detail::ArraySize&) {
    line(key, array_text(values, toml_float));
  }
  void operator()(std::string_view key, const std::vector<int64_t>& values, const detail::IntRange&) {
    line(key, array_text(values, [](int64_t value) { return fmt::format("{}", value); }));
  }
  void operator()(std::string_view key, const std::vector<TensorSpecRule>& rules) {
    line(key,
         array_text(rules,
                    [](const TensorSpecRule& rule) {
                      return fmt::format("{{ pattern = {}, spec = {} }}", detail::quote(rule.pattern),
                                         detail::quote(enum_name(rule.spec)));
                    }),
         "spec: " + choices_comment(names_of(TensorSplit{})));
  }
  void operator()(std::string_view key, const OptionTable& options) {
    Section& section = section_named(std::string(key));
    for (const auto& [name, value] : options.values()) {
      section.lines.push_back(fmt::format("{} = {}", toml_dotted_key(name), to_toml(value)));
    }
  }

  std::string text() const {
    std::string out;
    for (const Section& section : sections_) {
      if (!section.name.empty()) out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section.name);
      for (const std::string& line : section.lines) out += line + "\n";
    }
    return out;
  }

 private:
  struct Section {
    std::string name;
    std::vector<std::string> lines;
  };

  Section& section_named(const std::string& name) {
    for (Section& section : sections_) {
      if (section.name == name) return section;
    }
    // Top-level keys must come before any [header].
    if (name.empty()) return *sections_.insert(sections_.begin(), Section{});
    return sections_.emplace_back(Section{name, {}});
  }

  void line(std::string_view key, const std::string& value, const std::string& comment = "") {
    const std::size_t dot = key.rfind('.');
    const std::string section = dot == std::string_view::npos ? std::string() : std::string(key.substr(0, dot));
    const std::string_view leaf = dot == std::string_view::npos ? key : key.substr(dot + 1);
    section_named(section).lines.push_back(
        fmt::format("{} = {}{}", leaf, value, comment.empty() ? "" : "  # " + comment));
  }

  std::vector<Section> sections_;
};

}  // namespace

std::string describe(const TrainConfig& config) {
  Describer describer;
  detail::visit_fields(config, describer);
  return describer.text();
}

std::string_view to_string(TensorSplit value) {
  return enum_name(value);
}
std::string_view to_string(TensorParallelMode value) {
  return enum_name(value);
}
std::string_view to_string(TensorAllReduce value) {
  return enum_name(value);
}
std::string_view to_string(PipelineP2P value) {
  return enum_name(value);
}
std::string_view to_string(AmpMode value) {
  return enum_name(value);
}
std::string_view to_string(ZeroPlacement value) {
  return enum_name(value);
}
std::string_view to_string(ModelName value) {
  return enum_name(value);
}
std::string_view to_string(DatasetName value) {
  return enum_name(value);
}
std::string_view to_string(OptimizerName value) {
  return enum_name(value);
}
std::string_view to_string(SchedulerName value) {
  return enum_name(value);
}
std::string_view to_string(DeviceKind value) {
  return enum_name(value);
}

}  // namespace colossal::config
