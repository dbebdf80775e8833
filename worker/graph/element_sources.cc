#include "worker/graph/element_sources.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace dptrain {
namespace graph {

std::vector<ElementReaders> Readers(const std::vector<int64_t>& sources,
                                    const std::vector<int64_t>& input_sizes) {
  std::vector<ElementReaders> result(input_sizes.size());
  for (size_t i = 0; i < input_sizes.size(); ++i) {
    result[i].offsets.assign(input_sizes[i] + 1, 0);
  }
  // Count each element's readers, then place them in output order (a counting sort).
  for (int64_t s : sources) {
    if (s < 0) continue;
    const int64_t input = s >> kSourceInputShift, e = s & kSourceIndexMask;
    if (input >= static_cast<int64_t>(input_sizes.size()) || e >= input_sizes[input]) return {};
    ++result[input].offsets[e + 1];
  }
  std::vector<std::vector<int64_t>> next(input_sizes.size());
  for (size_t i = 0; i < input_sizes.size(); ++i) {
    std::vector<int64_t>& offsets = result[i].offsets;
    for (size_t e = 1; e < offsets.size(); ++e) offsets[e] += offsets[e - 1];
    result[i].readers.resize(offsets.back());
    next[i].assign(offsets.begin(), offsets.end() - 1);
  }
  for (int64_t k = 0; k < static_cast<int64_t>(sources.size()); ++k) {
    const int64_t s = sources[k];
    if (s < 0) continue;
    const int64_t input = s >> kSourceInputShift, e = s & kSourceIndexMask;
    result[input].readers[next[input][e]++] = k;
  }
  return result;
}

template <typename T>
LookupReaders ReadersOfRows(const T* ids, int64_t n, int64_t table_rows, int64_t skipped_row) {
  // The lookups sorted by row, each row's in lookup order (O(n log n): the table's size does
  // not matter).
  std::vector<std::pair<int64_t, int64_t>> by_row;  // (row, lookup)
  by_row.reserve(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t id = static_cast<int64_t>(ids[j]);
    if (id != skipped_row && id >= 0 && id < table_rows) by_row.emplace_back(id, j);
  }
  std::sort(by_row.begin(), by_row.end());
  LookupReaders r;
  r.offsets.push_back(0);
  for (size_t p = 0; p < by_row.size(); ++p) {
    if (p == 0 || by_row[p].first != by_row[p - 1].first) {
      if (p > 0) r.offsets.push_back(static_cast<int64_t>(p));
      r.rows.push_back(by_row[p].first);
    }
    r.readers.push_back(by_row[p].second);
  }
  if (!by_row.empty()) r.offsets.push_back(static_cast<int64_t>(by_row.size()));
  return r;
}

template LookupReaders ReadersOfRows<float>(const float*, int64_t, int64_t, int64_t);
template LookupReaders ReadersOfRows<double>(const double*, int64_t, int64_t, int64_t);

}  // namespace graph
}  // namespace dptrain
