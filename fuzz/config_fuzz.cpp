// Fuzzes config loading (config/train_config.h: parse_config, what load_config reads) with the
// parallel layer's rules (parallel::layout_config_rule), as `colossal train --config` runs them. The
// input is the TOML text, optionally followed by a line "%%" and one `--set` override per line. A
// config that loads must round-trip: describe() gives TOML that parse_config reads back to an equal
// TrainConfig.
#include <string>
#include <vector>

#include "colossal/config/train_config.h"    // parse_config, describe
#include "colossal/parallel/layout_rules.h"  // layout_config_rule
#include "fuzz_support.h"                    // accept_errors, property_failed

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t split = input.find("\n%%\n");
  const std::string_view toml = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string_view::npos) {
    size_t pos = split + 4;
    while (pos <= input.size()) {
      size_t end = input.find('\n', pos);
      if (end == std::string_view::npos) end = input.size();
      overrides.emplace_back(input.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  static const config::ConfigRules rules{parallel::layout_config_rule()};
  return fuzz::accept_errors([&] {
    const config::TrainConfig loaded = config::parse_config(toml, overrides, "fuzz.toml", rules);
    const std::string described = config::describe(loaded);
    config::TrainConfig again;
    try {
      again = config::parse_config(described, {}, "describe()", rules);
    } catch (const Error& e) {
      fuzz::property_failed(fmt::format("describe() gave TOML that does not load: {}\n{}", e.what(), described));
    }
    if (!(again == loaded)) fuzz::property_failed(fmt::format("describe() does not round-trip:\n{}", described));
  });
}
