#include "worker/graph/element_sources.h"

#include <cstddef>

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

}  // namespace graph
}  // namespace dptrain
