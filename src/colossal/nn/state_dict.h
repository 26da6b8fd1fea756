// StateDict: the insertion-ordered name -> Tensor map that Module::state_dict() returns and
// load_state_dict() reads; checkpoint IO writes and reads the same type. Names are dotted module
// paths ("h.0.attn.c_attn.weight"), so a map from Hugging Face or timm loads under its own names.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::nn {

class StateDict {
 public:
  using Entry = std::pair<std::string, Tensor>;

  /// Appends name -> tensor; throws if name is already present.
  void insert(std::string name, Tensor tensor);
  /// Replaces the tensor under an existing name, or appends a new entry.
  void insert_or_assign(std::string name, Tensor tensor);
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  /// The tensor under name, or nullptr.
  const Tensor* find(std::string_view name) const;
  /// The tensor under name; throws naming the nearest present names when it is absent.
  const Tensor& at(std::string_view name) const;
  /// Removes name if present; returns whether it was.
  bool erase(std::string_view name);

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> keys() const;
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

/// Levenshtein distance between two names (suggestions in error messages).
size_t edit_distance(std::string_view a, std::string_view b);
/// The candidates closest to name (at most `limit`), or none when nothing is plausibly a typo of
/// it: within a third of its length in edits, or one being a dotted suffix of the other (a
/// missing or extra prefix such as "transformer." or "module.").
std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string>& candidates,
                                       size_t limit = 3);

}  // namespace colossal::nn
