#include "worker/data/sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/mix.h"

namespace dptrain {
namespace {

// Uniform in [0, bound) without modulo bias. std::mt19937_64 is fully specified by the standard,
// unlike std::uniform_int_distribution, so this is the same everywhere.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound.
  while (true) {
    const uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& options)
    : options_(options),
      num_samples_((options.dataset_size + options.world_size - 1) / options.world_size) {}

absl::StatusOr<DistributedSampler> DistributedSampler::Create(const SamplerOptions& options) {
  if (options.dataset_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: dataset_size must be >= 1, got ", options.dataset_size));
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: world_size must be >= 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: rank ", options.rank, " is not in [0, ", options.world_size, ")"));
  }
  return DistributedSampler(options);
}

std::vector<int64_t> DistributedSampler::GlobalIndices(int64_t epoch) const {
  const int64_t n = options_.dataset_size;
  std::vector<int64_t> order(total_size());
  std::iota(order.begin(), order.begin() + n, int64_t{0});
  if (options_.shuffle) {
    std::mt19937_64 gen(Mix64(options_.seed ^ Mix64(static_cast<uint64_t>(epoch))));
    for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates.
      std::swap(order[i], order[UniformBelow(gen, static_cast<uint64_t>(i) + 1)]);
    }
  }
  for (int64_t j = n; j < total_size(); ++j) order[j] = order[j % n];
  return order;
}

std::vector<int64_t> DistributedSampler::EpochIndices(int64_t epoch) const {
  const std::vector<int64_t> global = GlobalIndices(epoch);
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t j = options_.rank; j < total_size(); j += options_.world_size) {
    mine.push_back(global[j]);
  }
  return mine;
}

int64_t NumBatches(int64_t num_samples, int batch_size) {
  return (num_samples + batch_size - 1) / batch_size;
}

}  // namespace dptrain
