// The rows one shard holds of a sparse table (sparse_table.h): row id -> slot, the slots
// numbered 0, 1, 2, ... in the order the rows were created. Open addressing with linear
// probing over 16-byte entries (id and slot together), so that a lookup costs one cache line
// (a large table's index is far beyond the caches), and Prefetch lets a batch of lookups
// overlap their misses. Rows are only added (or all dropped by Clear), never removed one by
// one. Not thread-safe: the table's lock guards it.
#ifndef DPTRAIN_SERVER_ROW_INDEX_H_
#define DPTRAIN_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/mix.h"

namespace dptrain {

class RowIndex {
 public:
  RowIndex() { Clear(); }

  int64_t size() const { return size_; }
  // The slot of row `id`, or -1 if it is not held (any negative id: never held).
  int64_t Find(int64_t id) const {
    for (size_t at = Home(id);; at = (at + 1) & mask_) {
      const Entry& e = entries_[at];
      if (e.id == kEmpty) return -1;
      if (e.id == id) return e.slot;
    }
  }
  // The slot of row `id` (which must be >= 0: row ids are); a row not held yet gets slot
  // size(), and `created` is set.
  int64_t FindOrAdd(int64_t id, bool& created);
  // Starts fetching the cache line where a lookup of `id` begins.
  void Prefetch(int64_t id) const { __builtin_prefetch(&entries_[Home(id)]); }
  // Room for `rows` rows without growing.
  void Reserve(int64_t rows);
  // Drops every row.
  void Clear();
  // f(id, slot) for every row held, in no particular order.
  template <typename F>
  void ForEach(F f) const {
    for (const Entry& e : entries_) {
      if (e.id != kEmpty) f(e.id, e.slot);
    }
  }

 private:
  static constexpr int64_t kEmpty = -1;
  struct Entry {
    int64_t id = kEmpty;
    int64_t slot = 0;
  };
  size_t Home(int64_t id) const { return Mix64(static_cast<uint64_t>(id)) & mask_; }
  // Rehashes into `capacity` entries (a power of two above size_ / kMaxLoad).
  void Rehash(size_t capacity);

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int64_t size_ = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_ROW_INDEX_H_
