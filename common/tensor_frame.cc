#include "common/tensor_frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

grpc::Slice HeaderSlice(const google::protobuf::MessageLite& header) {
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

grpc::ByteBuffer FrameReferencing(const google::protobuf::MessageLite& header,
                                  absl::string_view payload) {
  grpc::Slice slices[2] = {HeaderSlice(header),
                           grpc::Slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, payload.empty() ? 1 : 2);
}

grpc::ByteBuffer FrameOwning(const google::protobuf::MessageLite& header, grpc::Slice payload) {
  grpc::Slice slices[2] = {HeaderSlice(header), std::move(payload)};
  return grpc::ByteBuffer(slices, slices[1].size() == 0 ? 1 : 2);
}

absl::Status FramePayload::ParseInto(grpc::ByteBuffer& buffer,
                                     google::protobuf::MessageLite& parsed) {
  slices_.clear();
  joined_.clear();
  if (grpc::Status s = buffer.Dump(&slices_); !s.ok()) {
    return absl::DataLossError(absl::StrCat("tensor frame unreadable: ", s.error_message()));
  }
  Reader reader(slices_);
  auto read = [&reader](char* out, size_t n) { return reader.Read(out, n); };
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
  if (!read(header.data(), length) || !parsed.ParseFromString(header)) {
    return absl::DataLossError("tensor frame header does not parse");
  }
  first_slice_ = reader.slice();
  first_offset_ = reader.offset();
  payload_size_ = total - 4 - length;
  return absl::OkStatus();
}

void FramePayload::CopyPayload(char* out) const {
  size_t offset = first_offset_;
  for (size_t i = first_slice_; i < slices_.size(); ++i) {
    const size_t n = slices_[i].size() - offset;
    std::memcpy(out, slices_[i].begin() + offset, n);
    out += n;
    offset = 0;
  }
}

absl::string_view FramePayload::ContiguousPayload() {
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

bool FramePayload::Reader::Read(char* out, size_t n) {
  while (n > 0 && slice_ < slices_.size()) {
    const grpc::Slice& s = slices_[slice_];
    const size_t take = std::min(n, s.size() - offset_);
    std::memcpy(out, s.begin() + offset_, take);
    out += take;
    n -= take;
    offset_ += take;
    if (offset_ == s.size()) {
      ++slice_;
      offset_ = 0;
    }
  }
  return n == 0;
}

}  // namespace dptrain
