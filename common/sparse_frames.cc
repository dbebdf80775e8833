#include "common/sparse_frames.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

grpc::ByteBuffer SparseRowsFrame(proto::SparseFrameHeader header, absl::Span<const int64_t> ids,
                                 absl::Span<const float> values, int dim,
                                 absl::Span<const size_t> order) {
  header.set_rows(static_cast<int64_t>(ids.size()));
  const size_t id_bytes = ids.size() * sizeof(int64_t);
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  const size_t value_bytes = values.empty() ? 0 : ids.size() * row_bytes;
  grpc::Slice payload = NewPayload(id_bytes + value_bytes);
  char* out = MutableData(payload);
  if (id_bytes > 0) std::memcpy(out, ids.data(), id_bytes);
  out += id_bytes;
  if (value_bytes > 0) {
    if (order.empty()) {
      std::memcpy(out, values.data(), value_bytes);
    } else {
      for (size_t k = 0; k < ids.size(); ++k) {
        std::memcpy(out + k * row_bytes, values.data() + order[k] * dim, row_bytes);
      }
    }
  }
  return FrameOwning(header, std::move(payload));
}

namespace {

// Checks the payload size and reads the ids; the values (if any) are left in `reader`.
absl::Status ReadSparseIds(const SparseFrame& frame, int dim, bool with_values,
                           std::vector<int64_t>& ids, FramePayload::Reader& reader,
                           size_t& value_bytes) {
  const int64_t rows = frame.header().rows();
  const size_t size = frame.payload_size();
  const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int64_t);
  value_bytes =
      !with_values ? 0 : static_cast<size_t>(rows) * static_cast<size_t>(dim) * sizeof(float);
  if (rows < 0 || dim < 0 || rows > static_cast<int64_t>(size) || size != id_bytes + value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse frame of table '", frame.header().table(), "': ", size, " payload bytes for ", rows,
        " ids", !with_values ? "" : absl::StrCat(" and their rows of ", dim, " fp32")));
  }
  ids.resize(static_cast<size_t>(rows));
  reader.Read(reinterpret_cast<char*>(ids.data()), id_bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadSparseFrame(const SparseFrame& frame, int dim, std::vector<int64_t>& ids,
                             std::vector<float>* values) {
  FramePayload::Reader reader = frame.PayloadReader();
  size_t value_bytes = 0;
  if (auto s = ReadSparseIds(frame, dim, values != nullptr, ids, reader, value_bytes); !s.ok()) {
    return s;
  }
  if (values != nullptr) {
    values->resize(value_bytes / sizeof(float));
    reader.Read(reinterpret_cast<char*>(values->data()), value_bytes);
  }
  return absl::OkStatus();
}

absl::Status ReadSparseFrame(const SparseFrame& frame, int dim, std::vector<int64_t>& ids,
                             absl::Span<float> values) {
  FramePayload::Reader reader = frame.PayloadReader();
  size_t value_bytes = 0;
  if (auto s = ReadSparseIds(frame, dim, true, ids, reader, value_bytes); !s.ok()) return s;
  if (value_bytes != values.size() * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse frame of table '", frame.header().table(), "': ", value_bytes,
                     " value bytes for a buffer of ", values.size(), " fp32"));
  }
  reader.Read(reinterpret_cast<char*>(values.data()), value_bytes);
  return absl::OkStatus();
}

}  // namespace dptrain
