// Reading what MetricsJsonlHook wrote (`colossal train --metrics`), for the tests that compare runs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace colossal::testing {

/// The JSON objects of a metrics file, one per line.
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

/// The loss of every "step" line, by step number.
inline std::map<int64_t, double> step_losses(const std::filesystem::path& path) {
  std::map<int64_t, double> losses;
  for (const nlohmann::json& j : read_jsonl(path)) {
    if (j["event"] == "step") losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return losses;
}

}  // namespace colossal::testing
