#include "worker/data/holdout.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

// The values of samples `indices` of a store of `per_sample` values each, back to back.
template <typename T>
std::vector<T> Gather(const std::vector<T>& store, int64_t per_sample,
                      const std::vector<int64_t>& indices) {
  std::vector<T> out;
  if (store.empty()) return out;
  out.reserve(indices.size() * per_sample);
  for (int64_t i : indices) {
    out.insert(out.end(), store.begin() + i * per_sample, store.begin() + (i + 1) * per_sample);
  }
  return out;
}

// `meta` (a data set whose stores were moved out) with the samples `indices` of the stores.
Dataset Part(const Dataset& meta, const std::vector<int64_t>& indices,
             const std::vector<float>& images, const std::vector<uint8_t>& bytes,
             const std::vector<nn::Label>& labels, const std::vector<float>& targets) {
  Dataset out = meta;
  out.size = static_cast<int64_t>(indices.size());
  out.images = Gather(images, meta.image_size(), indices);
  out.bytes = Gather(bytes, meta.image_size(), indices);
  out.labels = Gather(labels, 1, indices);
  out.targets = Gather(targets, meta.targets_per_sample, indices);
  return out;
}

}  // namespace

absl::StatusOr<HeldOut> HoldOut(Dataset data, double fraction, uint64_t seed) {
  if (!(fraction > 0 && fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fraction to hold out must be in (0, 1), got ", fraction));
  }
  if (data.source != nullptr) {
    return absl::InvalidArgumentError(
        "a training set read as needed cannot be split (nothing is held): load it "
        "(--data_loading=load), or save a test split");
  }
  if (!data.consistent() || !data.scores_consistent()) {
    return absl::InvalidArgumentError("the data set's arrays do not match its size");
  }
  const int64_t n = data.size;
  const int64_t test_n = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n)));
  if (test_n >= n) {
    return absl::InvalidArgumentError(absl::StrCat("holding out ", test_n, " of ", n,
                                                   " sample(s) (ceil of ", fraction,
                                                   " of them) "
                                                   "leaves none to train on"));
  }
  // Fisher-Yates with a fixed generator: the same split on every rank and machine.
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed ^ 0x7e57f2ac710aULL);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  std::vector<int64_t> test_indices(order.begin(), order.begin() + test_n);
  std::vector<int64_t> train_indices(order.begin() + test_n, order.end());
  std::sort(test_indices.begin(), test_indices.end());
  std::sort(train_indices.begin(), train_indices.end());
  const std::vector<float> images = std::move(data.images);
  const std::vector<uint8_t> bytes = std::move(data.bytes);
  const std::vector<nn::Label> labels = std::move(data.labels);
  const std::vector<float> targets = std::move(data.targets);
  data.images.clear();
  data.bytes.clear();
  data.labels.clear();
  data.targets.clear();
  HeldOut out;
  out.train = Part(data, train_indices, images, bytes, labels, targets);
  out.test = Part(data, test_indices, images, bytes, labels, targets);
  return out;
}

}  // namespace dptrain
