// The frames of the tensor stream (proto/ps.proto, TensorStream): a FrameHeader and a
// chunk's bytes in one gRPC ByteBuffer, built and read without copying the bytes through
// protobuf. Shared by the worker's PS client and the server's stream service.
#ifndef DPTRAIN_COMMON_TENSOR_FRAME_H_
#define DPTRAIN_COMMON_TENSOR_FRAME_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/ps.pb.h"

namespace dptrain {

// The full method name of the tensor stream.
inline constexpr char kTensorStreamMethod[] = "/dptrain.proto.TensorStream/PushPull";
// The trailing metadata of a stream that a shard refused because its rank already had as many
// open as allowed (RESOURCE_EXHAUSTED): nothing of it was counted, and the client may send the
// step again after backing off this many milliseconds (the value).
inline constexpr char kStreamBusyKey[] = "dptrain-busy-retry-ms";

// A frame whose payload is `payload` itself, not a copy: the memory must stay valid and
// unchanged until the call that writes the frame has finished.
grpc::ByteBuffer FrameReferencing(const proto::FrameHeader& header, absl::string_view payload);

// A frame that owns its payload: `payload` was filled by the caller (see NewPayload).
grpc::ByteBuffer FrameOwning(const proto::FrameHeader& header, grpc::Slice payload);

// A writable slice of `bytes` bytes for FrameOwning.
grpc::Slice NewPayload(size_t bytes);
inline char* MutableData(grpc::Slice& slice) {
  return reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
}

// A received frame. The payload stays in the message's slices (no copy) until asked for.
class ReceivedFrame {
 public:
  // DataLoss for a frame too short for its header or with a header that does not parse.
  static absl::StatusOr<ReceivedFrame> Parse(grpc::ByteBuffer& buffer);

  const proto::FrameHeader& header() const { return header_; }
  size_t payload_size() const { return payload_size_; }
  // Copies the payload to `out` (payload_size() bytes).
  void CopyPayload(char* out) const;
  // The payload as one range: a view into the message if it arrived in one slice, else a
  // copy kept in this frame. Valid while the frame lives.
  absl::string_view ContiguousPayload();

 private:
  proto::FrameHeader header_;
  std::vector<grpc::Slice> slices_;
  size_t first_slice_ = 0;   // Where the payload starts: slices_[first_slice_] ...
  size_t first_offset_ = 0;  // ... at this byte.
  size_t payload_size_ = 0;
  std::string joined_;  // ContiguousPayload's copy, if one was needed.
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_TENSOR_FRAME_H_
