#include "server/ps_requests.h"

namespace dptrain {

std::vector<ChunkView> ViewsOf(const google::protobuf::RepeatedPtrField<proto::Chunk>& chunks) {
  std::vector<ChunkView> views;
  views.reserve(chunks.size());
  for (const proto::Chunk& c : chunks) {
    views.push_back({c.key().tensor_id(), c.key().chunk_index(), static_cast<DType>(c.dtype()),
                     c.data()});
  }
  return views;
}

}  // namespace dptrain
