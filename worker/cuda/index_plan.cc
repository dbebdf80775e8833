#include "worker/cuda/index_plan.h"

#include "common/status_macros.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<IndexPlan>> MakeIndexPlan(DeviceContext& ctx,
                                                         const std::vector<int64_t>& indices,
                                                         const std::vector<int64_t>& sizes) {
  const std::vector<graph::ElementReaders> readers = graph::Readers(indices, sizes);
  if (readers.size() != sizes.size()) {
    return absl::InternalError("a node's indices lie outside its inputs");
  }
  auto plan = std::make_unique<IndexPlan>();
  plan->outputs = static_cast<int64_t>(indices.size());
  DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, indices, plan->indices));
  plan->inputs.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    plan->inputs[i].size = sizes[i];
    DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, readers[i].offsets, plan->inputs[i].offsets));
    DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, readers[i].readers, plan->inputs[i].readers));
  }
  return plan;
}

}  // namespace cuda
}  // namespace dptrain
