// The frames of the sparse tables' row path (proto/ps.proto, SparseRows): a worker's pull
// and push of some rows, and a shard's answer, as raw bytes after a SparseFrameHeader, built
// and read with one copy each way (no protobuf in the bytes' way). Shared by the worker's
// SparseClient and the shard's SparseRowsMethods.
#ifndef DPTRAIN_COMMON_SPARSE_FRAMES_H_
#define DPTRAIN_COMMON_SPARSE_FRAMES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tensor_frame.h"
#include "proto/ps.pb.h"

namespace dptrain {

inline constexpr char kSparsePullMethod[] = "/dptrain.proto.SparseRows/Pull";
inline constexpr char kSparsePushMethod[] = "/dptrain.proto.SparseRows/Push";

using SparseFrame = ReceivedFrameOf<proto::SparseFrameHeader>;

// A frame of `header` (its `rows` set to ids.size()) with the ids and, if `values` is not
// empty, dim = values.size() / ids.size() fp32 values per id: row k of `values` is
// values[order[k] * dim ...] when `order` is given (a scatter of some rows of a larger array,
// copied once, into the frame), values[k * dim ...] otherwise.
grpc::ByteBuffer SparseRowsFrame(proto::SparseFrameHeader header, absl::Span<const int64_t> ids,
                                 absl::Span<const float> values, int dim,
                                 absl::Span<const size_t> order = {});

// The ids of `frame` (its header's `rows`) into `ids` and, with `values` not null, the
// rest of the payload into `values` (it must be rows x dim fp32). InvalidArgument if the
// payload is not that size.
absl::Status ReadSparseFrame(const SparseFrame& frame, int dim, std::vector<int64_t>& ids,
                             std::vector<float>* values);
// The same into `values`, which must hold exactly rows x dim fp32 (not resized: a buffer
// that need not be zeroed first).
absl::Status ReadSparseFrame(const SparseFrame& frame, int dim, std::vector<int64_t>& ids,
                             absl::Span<float> values);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SPARSE_FRAMES_H_
