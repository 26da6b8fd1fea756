// StateDict storage and the name-similarity helpers behind "did you mean" suggestions.
#include "colossal/nn/state_dict.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "colossal/core/error.h"

namespace colossal::nn {

void StateDict::insert(std::string name, Tensor tensor) {
  COLOSSAL_CHECK(!contains(name), "StateDict: duplicate key '{}'", name);
  index_.emplace(name, entries_.size());
  entries_.emplace_back(std::move(name), std::move(tensor));
}

void StateDict::insert_or_assign(std::string name, Tensor tensor) {
  if (auto it = index_.find(name); it != index_.end()) {
    entries_[it->second].second = std::move(tensor);
    return;
  }
  insert(std::move(name), std::move(tensor));
}

const Tensor* StateDict::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Tensor& StateDict::at(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  const auto near = nearest_names(name, keys());
  COLOSSAL_FAIL("StateDict has no key '{}' ({} keys){}", name, size(),
                near.empty() ? std::string() : fmt::format("; did you mean {}?", fmt::join(near, ", ")));
}

bool StateDict::erase(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  return true;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, tensor] : entries_) out.push_back(name);
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

namespace {
bool is_dotted_suffix(std::string_view longer, std::string_view shorter) {
  return longer.size() > shorter.size() && longer.ends_with(shorter) &&
         longer[longer.size() - shorter.size() - 1] == '.';
}
}  // namespace

std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string>& candidates,
                                       size_t limit) {
  std::vector<std::pair<size_t, const std::string*>> scored;
  const size_t budget = std::max<size_t>(2, name.size() / 3);
  for (const std::string& candidate : candidates) {
    if (is_dotted_suffix(candidate, name) || is_dotted_suffix(name, candidate)) {
      scored.emplace_back(0, &candidate);  // a prefix difference outranks any typo
      continue;
    }
    const size_t d = edit_distance(name, candidate);
    if (d <= budget) scored.emplace_back(d, &candidate);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < limit; ++i) out.push_back(*scored[i].second);
  return out;
}

}  // namespace colossal::nn
