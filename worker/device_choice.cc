#include "worker/device_choice.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dptrain {
namespace {

std::string Gpus(int n) { return absl::StrCat(n, n == 1 ? " GPU" : " GPUs"); }

}  // namespace

absl::StatusOr<DeviceSpec> ParseDeviceFlag(absl::string_view flag) {
  DeviceSpec spec;
  spec.flag = std::string(flag);
  if (flag == "auto") return spec;
  if (flag == "cpu") {
    spec.kind = DeviceKind::kCpu;
    return spec;
  }
  spec.kind = DeviceKind::kCuda;
  if (flag == "cuda") return spec;
  absl::string_view n = flag;
  if (absl::ConsumePrefix(&n, "cuda:")) {
    const bool negative = absl::ConsumePrefix(&n, "-");
    bool digits = !n.empty() && n.size() <= 9;  // Up to 999999999: no overflow.
    for (char c : n) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    int index = 0;
    if (digits && absl::SimpleAtoi(n, &index)) {
      if (negative) {
        return absl::InvalidArgumentError(absl::StrCat("--device=", flag, ": N must be >= 0"));
      }
      spec.gpu = index;
      return spec;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", flag, ": expected auto, cpu, cuda or cuda:N"));
}

absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceSpec& spec, std::optional<int> local_rank,
                                          int visible_gpus) {
  if (visible_gpus < 0) {
    return absl::InvalidArgumentError(absl::StrCat(visible_gpus, " visible GPUs: must be >= 0"));
  }
  if (local_rank.has_value() && *local_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("local rank ", *local_rank, ": must be >= 0"));
  }
  if (spec.kind == DeviceKind::kCpu) return DeviceChoice{std::nullopt, "--device=cpu"};
  if (visible_gpus == 0) {
    if (spec.kind == DeviceKind::kAuto) return DeviceChoice{std::nullopt, "no GPU is visible"};
    return absl::FailedPreconditionError(
        absl::StrCat("--device=", spec.flag, ": no GPU is visible"));
  }
  if (spec.gpu.has_value()) {
    if (*spec.gpu >= visible_gpus) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device=", spec.flag, ": only ", Gpus(visible_gpus),
                       visible_gpus == 1 ? " is" : " are", " visible"));
    }
    return DeviceChoice{*spec.gpu, absl::StrCat("--device=", spec.flag)};
  }
  if (!local_rank.has_value()) {
    return DeviceChoice{0, absl::StrCat("no local rank, ", Gpus(visible_gpus), " visible")};
  }
  return DeviceChoice{*local_rank % visible_gpus, absl::StrCat("local rank ", *local_rank, ", ",
                                                               Gpus(visible_gpus), " visible")};
}

}  // namespace dptrain
