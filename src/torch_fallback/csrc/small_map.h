#pragma once
// A map for the entries one fallback call needs (its tensors and storages):
// a linear search over inline storage beats hashing and never allocates for
// the common op; past kLinear entries (a _foreach_ op's lists) a hash index
// keeps lookups constant-time (open addressing: no allocation per entry). The
// index exists only then: an empty hash table still costs its teardown.
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <memory>
#include <utility>

namespace torch_fallback {

template <typename Key, typename Value, unsigned N = 4>
class SmallMap {
 public:
  Value* find(const Key& key) {
    if (index_ != nullptr && !index_->empty()) {
      const auto it = index_->find(key);
      return it == index_->end() ? nullptr : &entries_[it->second].second;
    }
    for (auto& entry : entries_) {
      if (entry.first == key) return &entry.second;
    }
    return nullptr;
  }

  // Room for `count` entries without growing.
  void reserve(size_t count) {
    if (count <= N) return;
    entries_.reserve(count);
    if (count > kLinear) make_index()->reserve(count);
  }

  // References into the map last until the next insert.
  Value& insert(const Key& key, Value value) {
    entries_.emplace_back(key, std::move(value));
    if (entries_.size() > kLinear) {
      if (index_ == nullptr || index_->empty()) {
        Index* index = make_index();
        index->reserve(4 * kLinear);
        for (size_t i = 0; i < entries_.size(); ++i) index->emplace(entries_[i].first, i);
      } else {
        index_->emplace(key, entries_.size() - 1);
      }
    }
    return entries_.back().second;
  }

  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

 private:
  using Index = ska::flat_hash_map<Key, size_t>;
  static constexpr size_t kLinear = 16;

  Index* make_index() {
    if (index_ == nullptr) index_ = std::make_unique<Index>();
    return index_.get();
  }

  c10::SmallVector<std::pair<Key, Value>, N> entries_;
  std::unique_ptr<Index> index_;
};

}  // namespace torch_fallback
