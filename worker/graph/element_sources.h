// Ops that only move elements (Transpose, Gather by constant indices, Slice, Concat, Pad and
// Expand of computed values, whatever their shapes) described as data, so that any backend runs
// them with one gather and its inverse instead of a twin per op: for each output element, the
// runtime input and the element it copies, or a zero (NodeImpl::ElementSources); a node that
// reads a tensor of the model (Expand of a class token, Gather of rows of a table by constant
// indices) numbers it as the input after its runtime ones (TwinSpec's operand fields say where
// it lies; a learned one's gradient is its readers' sums like an input's). The backward
// is, for each input element, the sum of the output gradients of the elements that read it, in
// increasing order (the CPU nodes' order); `Readers` inverts the sources into that list.
//
// The per-element functions below are what the CUDA kernels run (worker/cuda/graph_kernels.cu
// includes this header; no absl, no std containers in them) and what element_sources_test runs
// on the host against every such CPU node, so the index arithmetic is checked without a GPU.
#ifndef DPTRAIN_WORKER_GRAPH_ELEMENT_SOURCES_H_
#define DPTRAIN_WORKER_GRAPH_ELEMENT_SOURCES_H_

#include <cstdint>

#include "common/host_device.h"

#ifndef __CUDACC__
#include <vector>
#endif

namespace dptrain {
namespace graph {

// A source: input i's element e is (i << kSourceInputShift) | e; kZeroSource is a zero.
inline constexpr int kSourceInputShift = 48;
inline constexpr int64_t kSourceIndexMask = (int64_t{1} << kSourceInputShift) - 1;
inline constexpr int64_t kZeroSource = -1;
// The most inputs (runtime ones and the operand) a moving node may read (a Concat of more is
// refused by the twins).
inline constexpr int kMaxSourceInputs = 16;

DPTRAIN_HOST_DEVICE inline int64_t ElementSource(int input, int64_t element) {
  return (static_cast<int64_t>(input) << kSourceInputShift) | element;
}

// Output element k of the gather: `inputs` holds one pointer per runtime input.
template <typename T>
DPTRAIN_HOST_DEVICE inline T MovedElement(const int64_t* sources, const T* const* inputs,
                                          int64_t k) {
  const int64_t s = sources[k];
  if (s < 0) return T(0);
  return inputs[s >> kSourceInputShift][s & kSourceIndexMask];
}

// d(loss)/d(element e) of one input: the sum of dy over e's readers (offsets[e] to
// offsets[e + 1] in `readers`, increasing), from zero as the CPU nodes add.
template <typename T>
DPTRAIN_HOST_DEVICE inline T ReadersSum(const int64_t* offsets, const int64_t* readers, const T* dy,
                                        int64_t e) {
  T sum = T(0);
  for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) sum += dy[readers[r]];
  return sum;
}

// An embedding lookup (a table's rows picked by computed ids, integers in [0, rows) checked
// before: NodeImpl::CheckInputs): output element k is column k % row of row ids[k / row].
template <typename T>
DPTRAIN_HOST_DEVICE inline T LookedUp(const T* table, const T* ids, int64_t row, int64_t k) {
  return table[static_cast<int64_t>(ids[k / row]) * row + k % row];
}

// The table's gradient at column i of the u-th distinct row looked up: the sum over its lookups
// j (readers[offsets[u] .. offsets[u + 1]), increasing: LookupReaders) of dy[j * row + i].
template <typename T>
DPTRAIN_HOST_DEVICE inline T LookupGradSum(const int64_t* offsets, const int64_t* readers,
                                           const T* dy, int64_t row, int64_t u, int64_t i) {
  T sum = T(0);
  for (int64_t r = offsets[u]; r < offsets[u + 1]; ++r) sum += dy[readers[r] * row + i];
  return sum;
}

#ifndef __CUDACC__
// The lookups of each distinct row of a table: rows[u] was looked up by ids j =
// readers[offsets[u] .. offsets[u + 1]), in increasing order; rows increasing. A row
// `skipped_row` (nn.Embedding's padding_idx, or -1) is left out: its gradient stays zero.
struct LookupReaders {
  std::vector<int64_t> rows, offsets, readers;
};
template <typename T>
LookupReaders ReadersOfRows(const T* ids, int64_t n, int64_t table_rows, int64_t skipped_row);

// One input's readers in compressed rows: element e's are readers[offsets[e] .. offsets[e+1]).
struct ElementReaders {
  std::vector<int64_t> offsets;  // input_size + 1 entries.
  std::vector<int64_t> readers;  // Output elements, increasing within each element's run.
};

// Per runtime input (input_sizes[i] elements), who reads each element. A source naming an
// input or element out of range is a bug of the node that made it: the result is empty then.
std::vector<ElementReaders> Readers(const std::vector<int64_t>& sources,
                                    const std::vector<int64_t>& input_sizes);
#endif

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ELEMENT_SOURCES_H_
