#include "worker/nn/batch_sample.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {
namespace {

constexpr char kPayload[] = "type.dptrain/batch_sample";

absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& value) { out.SetPayload(url, value); });
  return out;
}

}  // namespace

std::string BatchSampleText(int64_t k) { return absl::StrCat("sample ", k, " of the batch"); }

absl::Status AtBatchSample(absl::Status status, int64_t k) {
  status.SetPayload(kPayload, absl::Cord(absl::StrCat(k)));
  return status;
}

std::optional<int64_t> BatchSampleOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayload);
  int64_t k = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &k)) return std::nullopt;
  return k;
}

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return WithMessage(status, absl::StrCat(prefix, status.message()));
}

absl::Status ShiftBatchSample(const absl::Status& status, int64_t offset) {
  const std::optional<int64_t> k = BatchSampleOf(status);
  if (!k.has_value() || offset == 0) return status;
  // The first mention outside quotes: a quoted name (a node's, a table's) may hold the words.
  std::string message(status.message());
  const std::string old_text = BatchSampleText(*k);
  bool quoted = false;
  for (size_t i = 0; i < message.size(); ++i) {
    if (message[i] == '\'') quoted = !quoted;
    if (!quoted && message.compare(i, old_text.size(), old_text) == 0) {
      message.replace(i, old_text.size(), BatchSampleText(*k + offset));
      break;
    }
  }
  return AtBatchSample(WithMessage(status, message), *k + offset);
}

absl::Status NameDataSample(const absl::Status& status,
                            const std::function<int64_t(int64_t)>& data_index,
                            absl::string_view what) {
  const std::optional<int64_t> k = BatchSampleOf(status);
  if (!k.has_value()) return status;
  return WithMessage(status, absl::StrCat(status.message(), "; ", BatchSampleText(*k),
                                          " is sample ", data_index(*k), " of ", what));
}

}  // namespace nn
}  // namespace dptrain
