#pragma once
// A map for the handful of entries one fallback call needs (its tensors and
// storages): a linear search over inline storage beats hashing and never
// allocates for the common op.
#include <c10/util/SmallVector.h>

#include <utility>

namespace torch_fallback {

template <typename Key, typename Value, unsigned N = 4>
class SmallMap {
 public:
  Value* find(const Key& key) {
    for (auto& entry : entries_) {
      if (entry.first == key) return &entry.second;
    }
    return nullptr;
  }

  Value& insert(const Key& key, Value value) {
    entries_.emplace_back(key, std::move(value));
    return entries_.back().second;
  }

  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

 private:
  c10::SmallVector<std::pair<Key, Value>, N> entries_;
};

}  // namespace torch_fallback
