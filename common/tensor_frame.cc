#include "common/tensor_frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

grpc::Slice HeaderSlice(const proto::FrameHeader& header) {
  const size_t n = header.ByteSizeLong();
  grpc::Slice slice = NewPayload(4 + n);
  char* p = MutableData(slice);
  const uint32_t length = static_cast<uint32_t>(n);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(p + 4));
  return slice;
}

}  // namespace

grpc::Slice NewPayload(size_t bytes) {
  return grpc::Slice(grpc_slice_malloc(bytes), grpc::Slice::STEAL_REF);
}

grpc::ByteBuffer FrameReferencing(const proto::FrameHeader& header, absl::string_view payload) {
  grpc::Slice slices[2] = {HeaderSlice(header),
                           grpc::Slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, payload.empty() ? 1 : 2);
}

grpc::ByteBuffer FrameOwning(const proto::FrameHeader& header, grpc::Slice payload) {
  grpc::Slice slices[2] = {HeaderSlice(header), std::move(payload)};
  return grpc::ByteBuffer(slices, slices[1].size() == 0 ? 1 : 2);
}

absl::StatusOr<ReceivedFrame> ReceivedFrame::Parse(grpc::ByteBuffer& buffer) {
  ReceivedFrame frame;
  if (grpc::Status s = buffer.Dump(&frame.slices_); !s.ok()) {
    return absl::DataLossError(absl::StrCat("tensor frame unreadable: ", s.error_message()));
  }
  // Reads `n` bytes at the cursor, across slices.
  size_t slice = 0, offset = 0;
  auto read = [&](char* out, size_t n) {
    while (n > 0 && slice < frame.slices_.size()) {
      const grpc::Slice& s = frame.slices_[slice];
      const size_t take = std::min(n, s.size() - offset);
      std::memcpy(out, s.begin() + offset, take);
      out += take;
      n -= take;
      offset += take;
      if (offset == s.size()) {
        ++slice;
        offset = 0;
      }
    }
    return n == 0;
  };
  const size_t total = buffer.Length();
  unsigned char length_bytes[4];
  if (total < 4 || !read(reinterpret_cast<char*>(length_bytes), 4)) {
    return absl::DataLossError(absl::StrCat("tensor frame of ", total, " bytes has no header"));
  }
  const uint32_t length = length_bytes[0] | (length_bytes[1] << 8) | (length_bytes[2] << 16) |
                          (uint32_t{length_bytes[3]} << 24);
  if (length > total - 4) {
    return absl::DataLossError(absl::StrCat("tensor frame header of ", length,
                                            " bytes does not fit in a frame of ", total));
  }
  std::string header(length, '\0');
  if (!read(header.data(), length) || !frame.header_.ParseFromString(header)) {
    return absl::DataLossError("tensor frame header does not parse");
  }
  frame.first_slice_ = slice;
  frame.first_offset_ = offset;
  frame.payload_size_ = total - 4 - length;
  return frame;
}

void ReceivedFrame::CopyPayload(char* out) const {
  size_t offset = first_offset_;
  for (size_t i = first_slice_; i < slices_.size(); ++i) {
    const size_t n = slices_[i].size() - offset;
    std::memcpy(out, slices_[i].begin() + offset, n);
    out += n;
    offset = 0;
  }
}

absl::string_view ReceivedFrame::ContiguousPayload() {
  if (payload_size_ == 0) return {};
  if (slices_[first_slice_].size() - first_offset_ == payload_size_) {
    return absl::string_view(
        reinterpret_cast<const char*>(slices_[first_slice_].begin() + first_offset_),
        payload_size_);
  }
  if (joined_.size() != payload_size_) {
    joined_.resize(payload_size_);
    CopyPayload(joined_.data());
  }
  return joined_;
}

}  // namespace dptrain
