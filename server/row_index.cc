#include "server/row_index.h"

#include <algorithm>

namespace dptrain {
namespace {

// At most 3/4 full: short probe runs with linear probing and a good hash.
bool OverLoaded(int64_t rows, size_t capacity) {
  return 4 * static_cast<size_t>(rows) > 3 * capacity;
}

}  // namespace

int64_t RowIndex::FindOrAdd(int64_t id, bool& created) {
  created = false;
  if (OverLoaded(size_ + 1, entries_.size())) Rehash(2 * entries_.size());
  size_t at = Home(id);
  for (;; at = (at + 1) & mask_) {
    Entry& e = entries_[at];
    if (e.id == kEmpty) break;
    if (e.id == id) return e.slot;
  }
  created = true;
  entries_[at] = Entry{id, size_};
  return size_++;
}

void RowIndex::Reserve(int64_t rows) {
  size_t capacity = std::max<size_t>(entries_.size(), 16);
  while (OverLoaded(rows, capacity)) capacity *= 2;
  if (capacity != entries_.size()) Rehash(capacity);
}

void RowIndex::Clear() {
  entries_.assign(16, Entry{});
  mask_ = entries_.size() - 1;
  size_ = 0;
}

void RowIndex::Rehash(size_t capacity) {
  std::vector<Entry> old(capacity);
  old.swap(entries_);
  mask_ = capacity - 1;
  for (const Entry& e : old) {
    if (e.id == kEmpty) continue;
    size_t at = Home(e.id);
    while (entries_[at].id != kEmpty) at = (at + 1) & mask_;
    entries_[at] = e;
  }
}

}  // namespace dptrain
