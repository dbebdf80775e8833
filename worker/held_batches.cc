#include "worker/held_batches.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

// Why `train` cannot be held (with `augment`), or "" when it can.
std::string WhyNotHeld(const AugmentOptions& augment, const Dataset& train) {
  if (!train.byte_storage || train.source != nullptr) {
    return train.source != nullptr ? "the training set is read as needed (--data_loading=stream, "
                                     "or auto for a large set; --data_loading=load holds it)"
                                   : absl::StrCat("the training set holds ", train.kind(),
                                                  " as floats, not image bytes");
  }
  if (train.regression()) return "the training set holds target values (regression)";
  if (augment.resized_crop_min_scale > 0) {
    return "the random resized crop runs on the host only";
  }
  return "";
}

}  // namespace

absl::StatusOr<DataOnDevice> ParseDataOnDevice(absl::string_view flag) {
  if (flag == "off") return DataOnDevice::kOff;
  if (flag == "auto") return DataOnDevice::kAuto;
  if (flag == "on") return DataOnDevice::kOn;
  return absl::InvalidArgumentError(
      absl::StrCat("--data_on_device=", flag, ": expected auto, on or off"));
}

absl::StatusOr<bool> HoldTrainingSet(DataOnDevice mode, const AugmentOptions& augment,
                                     const Dataset& train, nn::Model& model,
                                     std::ostream* progress) {
  if (mode == DataOnDevice::kOff) return false;
  auto refuse = [&](const std::string& why) -> absl::StatusOr<bool> {
    if (mode == DataOnDevice::kOn) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data_on_device=on: ", why, " (--data_on_device=auto or off)"));
    }
    if (progress != nullptr && model.CanHoldData()) {
      *progress << "training batches are gathered on the host: " << why << std::endl;
    }
    return false;
  };
  if (!model.CanHoldData()) {
    return refuse(absl::StrCat(model.name(), " on this device reads batches the host gathers"));
  }
  if (const std::string why = WhyNotHeld(augment, train); !why.empty()) return refuse(why);
  nn::HeldData held;
  held.size = train.size;
  held.channels = train.channels;
  held.rows = train.rows;
  held.cols = train.cols;
  held.bytes = absl::MakeConstSpan(train.bytes);
  held.labels = absl::MakeConstSpan(train.labels);
  held.mean = train.norm_mean;
  held.inv_std = train.norm_inv_std;
  held.fill = augment.fill;
  const absl::Status s = model.HoldTrainingData(held);
  if (s.ok()) {
    if (progress != nullptr) {
      *progress << "training set held in the model's device memory: " << train.size << " images of "
                << train.image_size() << " bytes; each step sends only its samples' indices"
                << std::endl;
    }
    return true;
  }
  if (absl::IsResourceExhausted(s)) return refuse(std::string(s.message()));
  return s;
}

std::vector<nn::HeldSample> HeldSamples(const AugmentOptions& augment, uint64_t key,
                                        absl::Span<const int64_t> indices) {
  std::vector<nn::HeldSample> samples(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    nn::HeldSample& s = samples[i];
    s.index = indices[i];
    if (!augment.enabled()) continue;
    const AugmentChoice c = ChooseAugment(augment, key, indices[i]);
    s.shift_y = c.offset_y - augment.crop_padding;
    s.shift_x = c.offset_x - augment.crop_padding;
    s.flip = c.flip ? 1 : 0;
  }
  return samples;
}

}  // namespace dptrain
