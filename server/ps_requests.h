// Decoding of the ParameterServer requests (proto/ps.proto) into the shard's plain C++ types:
// views, not copies, of the tensor bytes. Pure functions, shared by the gRPC adapter
// (ps_service.cc) and the fuzz target that feeds the shard decoded hostile requests
// (tests/fuzz/init_request_fuzzer.cc). Nothing is validated here: the shard does that.
#ifndef DPTRAIN_SERVER_PS_REQUESTS_H_
#define DPTRAIN_SERVER_PS_REQUESTS_H_

#include <vector>

#include "proto/ps.pb.h"
#include "server/model_limits.h"
#include "server/parameter_shard.h"

namespace dptrain {

// The model an InitRequest or PullRequest declares.
template <typename Request>
ModelDescription DescriptionOf(const Request& request) {
  ModelDescription model;
  model.num_shards = request.num_shards();
  model.max_chunk_elements = request.max_chunk_elements();
  model.tensors.reserve(request.tensors_size());
  for (const proto::TensorSpec& t : request.tensors()) {
    model.tensors.push_back({t.name(), t.num_elements()});
  }
  return model;
}

// Views of `chunks`' bytes, valid while the request lives. With `widened`, gradients pushed
// in 16 bits (--wire_dtype=bf16|fp16) are widened to fp32 into it (the views point there, so
// it must outlive them too); without, or for another dtype, they stay as sent (the shard
// refuses what it does not store). InvalidArgument for a 16-bit chunk of an odd byte count.
absl::StatusOr<std::vector<ChunkView>> ViewsOf(
    const google::protobuf::RepeatedPtrField<proto::Chunk>& chunks,
    std::vector<std::vector<float>>* widened = nullptr);

// `view` as fp32 when it holds 16-bit values: widened into `storage`, which the returned
// view points to. Other dtypes are returned as they are.
absl::StatusOr<ChunkView> WidenedToFp32(const ChunkView& view, std::vector<float>& storage);

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PS_REQUESTS_H_
