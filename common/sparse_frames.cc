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

absl::Status ReadSparseFrame(const SparseFrame& frame, int dim, std::vector<int64_t>& ids,
                             std::vector<float>* values) {
  const int64_t rows = frame.header().rows();
  const size_t size = frame.payload_size();
  const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int64_t);
  const size_t value_bytes =
      values == nullptr ? 0 : static_cast<size_t>(rows) * static_cast<size_t>(dim) * sizeof(float);
  if (rows < 0 || dim < 0 || rows > static_cast<int64_t>(size) || size != id_bytes + value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse frame of table '", frame.header().table(), "': ", size, " payload bytes for ", rows,
        " ids", values == nullptr ? "" : absl::StrCat(" and their rows of ", dim, " fp32")));
  }
  FramePayload::Reader reader = frame.PayloadReader();
  ids.resize(static_cast<size_t>(rows));
  reader.Read(reinterpret_cast<char*>(ids.data()), id_bytes);
  if (values != nullptr) {
    values->resize(static_cast<size_t>(rows) * dim);
    reader.Read(reinterpret_cast<char*>(values->data()), value_bytes);
  }
  return absl::OkStatus();
}

}  // namespace dptrain
