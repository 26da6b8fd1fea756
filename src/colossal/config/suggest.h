// "Did you mean ...?": the nearest of a set of names by edit distance, for messages about unknown
// keys and bad choices. Used by the config loader and OptionTable; any layer naming things may use it.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace colossal::config {

/// Edits (insert, delete, substitute, swap two neighbours) turning a into b, ignoring ASCII case.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `name`, if it is near enough to be a plausible typo: at most a third of
/// name's length in edits (at least one). Ties go to the earlier candidate.
std::optional<std::string> nearest_name(std::string_view name, std::span<const std::string> candidates);

/// `"a", "b", "c"` (each quoted, comma separated), for "must be one of ..." messages.
std::string quoted_list(std::span<const std::string> names);

}  // namespace colossal::config
