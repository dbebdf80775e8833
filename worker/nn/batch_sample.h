// A batch refused at one of its samples (an id that is not a row of an embedding table, a
// packed sequence of length 0): the error says "sample K of the batch" (BatchSampleText) and
// carries K, so that whoever made the batch can name the sample of its data set; and, where a
// batch was run in pieces, the piece's sample becomes the batch's.
#ifndef DPTRAIN_WORKER_NN_BATCH_SAMPLE_H_
#define DPTRAIN_WORKER_NN_BATCH_SAMPLE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dptrain {
namespace nn {

// "sample K of the batch".
std::string BatchSampleText(int64_t k);

// `status` (whose message says BatchSampleText(k)) carrying k.
absl::Status AtBatchSample(absl::Status status, int64_t k);

// The sample an error carries, or nullopt.
std::optional<int64_t> BatchSampleOf(const absl::Status& status);

// `status` with its message's prefix `prefix` added and its payloads kept (what a wrapper
// that names the node adds).
absl::Status Prefixed(const absl::Status& status, absl::string_view prefix);

// A piece of a batch that began at sample `offset`: its sample k is the batch's k + offset, in
// the message and the payload. Any other status is returned as it is.
absl::Status ShiftBatchSample(const absl::Status& status, int64_t offset);

// The error of a batch whose sample k is `data_index(k)` of the set `what` ("the training
// set"): the message gains "; sample K of the batch is sample I of <what>". Any other status
// is returned as it is.
absl::Status NameDataSample(const absl::Status& status,
                            const std::function<int64_t(int64_t)>& data_index,
                            absl::string_view what);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_BATCH_SAMPLE_H_
