// The training set on the model's device (nn::Model::HoldTrainingData, --data_on_device): whether
// the trainer hands it over once, and what each step then sends instead of its batch: the
// samples' indices with their crop shifts and flips (worker/nn/held_data.h), chosen as
// AugmentBatch chooses them (worker/data/transforms.h), so a step sees the same values either way.
#ifndef DPTRAIN_WORKER_HELD_BATCHES_H_
#define DPTRAIN_WORKER_HELD_BATCHES_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/data/dataset.h"
#include "worker/data/transforms.h"
#include "worker/nn/held_data.h"
#include "worker/nn/model.h"

namespace dptrain {

// off: batches are gathered on the host (the default); auto: the set goes to the model's
// device where it can (HoldTrainingSet); on: it must.
enum class DataOnDevice { kOff, kAuto, kOn };

// "off", "auto" or "on"; InvalidArgument naming the flag otherwise.
absl::StatusOr<DataOnDevice> ParseDataOnDevice(absl::string_view flag);

// Hands `train` to `model` where `mode` allows it and both can: a model that holds data
// (nn::Model::CanHoldData), a set of images held in memory as bytes (Dataset's byte storage:
// IDX, CIFAR, an ImageFolder or uint8 .npy loaded whole) with class labels, no random resized
// crop. Returns whether it is held (saying so on `progress`, which may be null). Under kAuto what
// prevents it is no error: false, and for a model that could hold data one line on `progress`
// saying why; under kOn it is FailedPrecondition naming it (the model's other refusals of the
// data are errors either way).
absl::StatusOr<bool> HoldTrainingSet(DataOnDevice mode, const AugmentOptions& augment,
                                     const Dataset& train, nn::Model& model,
                                     std::ostream* progress);

// The held samples of one step: per data set index, its crop shift and flip (ChooseAugment
// under `key`; none where augmentation is off).
std::vector<nn::HeldSample> HeldSamples(const AugmentOptions& augment, uint64_t key,
                                        absl::Span<const int64_t> indices);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_HELD_BATCHES_H_
