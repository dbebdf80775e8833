#include "server/ps_requests.h"

#include "absl/strings/str_cat.h"
#include "common/wire_dtype.h"

namespace dptrain {

absl::StatusOr<ChunkView> WidenedToFp32(const ChunkView& view, std::vector<float>& storage) {
  if (view.dtype != DType::kBf16 && view.dtype != DType::kFp16) return view;
  if (absl::Status s = Widen(view.dtype, view.data, storage); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", ChunkKeyString(view.tensor_id, view.chunk_index), ": ", s.message()));
  }
  ChunkView wide = view;
  wide.dtype = DType::kFp32;
  wide.data = absl::string_view(reinterpret_cast<const char*>(storage.data()),
                                storage.size() * sizeof(float));
  return wide;
}

absl::StatusOr<std::vector<ChunkView>> ViewsOf(
    const google::protobuf::RepeatedPtrField<proto::Chunk>& chunks,
    std::vector<std::vector<float>>* widened) {
  std::vector<ChunkView> views;
  views.reserve(chunks.size());
  if (widened != nullptr) {
    widened->clear();
    widened->resize(chunks.size());  // Never reallocated below: the views stay valid.
  }
  for (int i = 0; i < chunks.size(); ++i) {
    const proto::Chunk& c = chunks[i];
    ChunkView view{c.key().tensor_id(), c.key().chunk_index(), static_cast<DType>(c.dtype()),
                   c.data()};
    if (widened != nullptr) {
      absl::StatusOr<ChunkView> wide = WidenedToFp32(view, (*widened)[i]);
      if (!wide.ok()) return wide.status();
      view = *wide;
    }
    views.push_back(view);
  }
  return views;
}

}  // namespace dptrain
