// Fuzzes a shard's handling of hostile requests as ps_service.cc decodes them: the bytes of an
// InitRequest (also read as the PullRequest with the same fields) and of a PushPullRequest,
// decoded by server/ps_requests and handed to ParameterShard::Init, Pull, PushPull and a
// repeated Init.
// Input: [config byte: policy, optimizer, shard count][u16 LE n][n bytes InitRequest][the
// rest: PushPullRequest]. One worker, so no call ever has a reason to wait; every deadline
// is now.
// Checks: only the documented statuses (never UNKNOWN, never a wait); an accepted Init's
// weights come back bit for bit from Pull; an accepted step answers version step + 1
// under BSP; a repeated Init is accepted.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "google/protobuf/stubs/logging.h"
#include "proto/ps.pb.h"
#include "server/parameter_shard.h"
#include "server/ps_requests.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace dptrain;  // NOLINT: a fuzz target's one function.

bool Documented(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsAlreadyExists(s) ||
         absl::IsOutOfRange(s);
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 it refuses to parse: millions of lines.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t config = data[0];
  const size_t n = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
  proto::InitRequest init;
  proto::PullRequest pull;
  proto::PushPullRequest push;
  if (!init.ParseFromArray(data + 3, static_cast<int>(n)) ||
      !pull.ParseFromArray(data + 3, static_cast<int>(n)) ||
      !push.ParseFromArray(data + 3 + n, static_cast<int>(size - 3 - n))) {
    return 0;
  }

  ParameterShardOptions options;
  options.policy = static_cast<SyncPolicy>(config % 3);
  options.optimizer.name = (config / 3) % 2 == 0 ? "sgd" : "adam";
  options.optimizer.momentum = 0.9f;
  options.num_shards = 1 + (config / 6) % 2;
  options.shard = options.num_shards - 1;
  options.num_workers = 1;
  options.step_timeout = absl::Seconds(1);
  options.log = [](absl::string_view) {};
  absl::StatusOr<std::unique_ptr<ParameterShard>> created = ParameterShard::Create(options);
  FUZZ_CHECK(created.ok());
  ParameterShard& shard = **created;

  const std::vector<ChunkView> views = *ViewsOf(init.chunks());  // Cannot fail unwidened.
  absl::StatusOr<int64_t> version =
      shard.Init(init.caller().job_id(), init.caller().rank(), DescriptionOf(init), views);
  if (!version.ok()) {
    FUZZ_CHECK(Documented(version.status()));
  } else {
    FUZZ_CHECK(*version == 0);
    std::map<std::pair<int, int>, std::string> sent;
    for (const ChunkView& v : views) sent[{v.tensor_id, v.chunk_index}] = std::string(v.data);
    size_t pulled = 0;
    absl::StatusOr<int64_t> pull_version =
        shard.Pull(pull.caller().job_id(), pull.caller().rank(), DescriptionOf(pull), absl::Now(),
                   [&](const ChunkSpec& spec, absl::Span<const float> weights) {
                     const std::string& bytes = sent[{spec.tensor_id, spec.chunk_index}];
                     FUZZ_CHECK(bytes.size() == weights.size() * sizeof(float));
                     FUZZ_CHECK(weights.empty() ||
                                std::memcmp(bytes.data(), weights.data(), bytes.size()) == 0);
                     ++pulled;
                   });
    FUZZ_CHECK(pull_version.ok() && *pull_version == 0);
    FUZZ_CHECK(pulled == views.size());
  }

  int64_t staleness = 0;
  bool skipped = false;
  // As the service decodes a push: 16-bit chunks widened (an odd byte count is refused).
  std::vector<std::vector<float>> widened;
  absl::StatusOr<std::vector<ChunkView>> pushed = ViewsOf(push.chunks(), &widened);
  if (!pushed.ok()) {
    FUZZ_CHECK(pushed.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  absl::StatusOr<int64_t> stepped = shard.PushPull(
      push.caller().job_id(), push.caller().rank(), push.step(), *pushed, absl::Now(),
      [](const ChunkSpec&, absl::Span<const float>) {}, &staleness, push.overflow(), &skipped);
  if (!stepped.ok()) {
    FUZZ_CHECK(Documented(stepped.status()));
  } else {
    FUZZ_CHECK(version.ok());
    // A shard that owns no chunk (a model smaller than the shard count) has no version to
    // give: it answers 0, and workers never call it (PsClient skips it).
    if (options.policy == SyncPolicy::kBsp && shard.num_chunks() > 0) {
      FUZZ_CHECK(*stepped == push.step() + 1);
    }
    FUZZ_CHECK(staleness == 0);
  }

  if (version.ok()) {
    absl::StatusOr<int64_t> again =
        shard.Init(init.caller().job_id(), init.caller().rank(), DescriptionOf(init), views);
    FUZZ_CHECK(again.ok());
  }
  return 0;
}
