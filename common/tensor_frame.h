// The frames of the tensor stream and of the sparse rows (proto/ps.proto, TensorStream and
// SparseRows): a header message and raw bytes in one gRPC ByteBuffer, built and read without
// copying the bytes through protobuf. Shared by the worker's clients and the server.
#ifndef DPTRAIN_COMMON_TENSOR_FRAME_H_
#define DPTRAIN_COMMON_TENSOR_FRAME_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
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
// unchanged until the call that writes the frame has finished. `header` is any protobuf
// message (the tensor stream's FrameHeader, the sparse rows' SparseFrameHeader).
grpc::ByteBuffer FrameReferencing(const google::protobuf::MessageLite& header,
                                  absl::string_view payload);

// A frame that owns its payload: `payload` was filled by the caller (see NewPayload).
grpc::ByteBuffer FrameOwning(const google::protobuf::MessageLite& header, grpc::Slice payload);

// A writable slice of `bytes` bytes for FrameOwning.
grpc::Slice NewPayload(size_t bytes);
inline char* MutableData(grpc::Slice& slice) {
  return reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
}

// The payload of a received frame. It stays in the message's slices (no copy) until asked
// for.
class FramePayload {
 public:
  size_t payload_size() const { return payload_size_; }
  // Copies the payload to `out` (payload_size() bytes).
  void CopyPayload(char* out) const;
  // The payload as one range: a view into the message if it arrived in one slice, else a
  // copy kept in this frame. Valid while the frame lives.
  absl::string_view ContiguousPayload();

  // Reads slices front to back, across their boundaries (one copy per read).
  class Reader {
   public:
    explicit Reader(const std::vector<grpc::Slice>& slices, size_t slice = 0, size_t offset = 0)
        : slices_(slices), slice_(slice), offset_(offset) {}
    // The next `n` bytes to `out`; false (with `out` partly written) past the end.
    bool Read(char* out, size_t n);
    size_t slice() const { return slice_; }
    size_t offset() const { return offset_; }

   private:
    const std::vector<grpc::Slice>& slices_;
    size_t slice_, offset_;
  };
  // A reader at the payload's first byte. Valid while the frame lives.
  Reader PayloadReader() const { return Reader(slices_, first_slice_, first_offset_); }

 protected:
  // Splits `buffer` into `header` and the payload; DataLoss for a frame too short for its
  // header or with a header that does not parse.
  absl::Status ParseInto(grpc::ByteBuffer& buffer, google::protobuf::MessageLite& header);

 private:
  std::vector<grpc::Slice> slices_;
  size_t first_slice_ = 0;   // Where the payload starts: slices_[first_slice_] ...
  size_t first_offset_ = 0;  // ... at this byte.
  size_t payload_size_ = 0;
  std::string joined_;  // ContiguousPayload's copy, if one was needed.
};

// A received frame with a header of type `Header`.
template <typename Header>
class ReceivedFrameOf : public FramePayload {
 public:
  // DataLoss for a frame too short for its header or with a header that does not parse.
  static absl::StatusOr<ReceivedFrameOf> Parse(grpc::ByteBuffer& buffer) {
    ReceivedFrameOf frame;
    if (absl::Status s = frame.ParseInto(buffer, frame.header_); !s.ok()) return s;
    return frame;
  }
  const Header& header() const { return header_; }

 private:
  Header header_;
};

// A frame of the tensor stream.
using ReceivedFrame = ReceivedFrameOf<proto::FrameHeader>;

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_TENSOR_FRAME_H_
