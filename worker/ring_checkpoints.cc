#include "worker/ring_checkpoints.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

constexpr char kPolicy[] = "allreduce";  // ShardCheckpoint::policy of a ring checkpoint.

// Why `cp` cannot resume this job, or OK.
absl::Status CheckFits(const ShardCheckpoint& cp, const RingCheckpointOptions& o) {
  auto unfit = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint of step ", cp.step, " is ", why,
                     ": start this job with "
                     "another --save_dir, or resume it with the flags it was started with"));
  };
  if (cp.policy != kPolicy) return unfit(absl::StrCat("a ", cp.policy, " shard's, not a ring's"));
  if (cp.job_id != o.job_id) return unfit(absl::StrCat("of job '", cp.job_id, "'"));
  if (cp.world_size != o.world_size) {
    return unfit(
        absl::StrCat("of a world size of ", cp.world_size, ", this job has ", o.world_size));
  }
  if (cp.optimizer != o.optimizer) return unfit(absl::StrCat("of optimizer ", cp.optimizer));
  bool same_model =
      cp.model.tensors.size() == o.tensors.size() && cp.chunks.size() == o.tensors.size();
  for (size_t i = 0; same_model && i < o.tensors.size(); ++i) {
    const TensorInfo& t = cp.model.tensors[i];
    same_model = t.name == o.tensors[i].name && t.num_elements == o.tensors[i].num_elements &&
                 cp.chunks[i].tensor_id == static_cast<int>(i) &&
                 static_cast<int64_t>(cp.chunks[i].weights.size()) == t.num_elements;
  }
  if (!same_model) return unfit("of another model");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingCheckpointer>> RingCheckpointer::Create(
    const RingCheckpointOptions& options, ShardedRingStore* store) {
  Collectives c;
  c.snapshot = [store](int64_t step, nn::Model& model) {
    return store->Snapshot(step, model.buffer_values());
  };
  c.resume = [store](const RingSnapshot& snapshot, nn::Model& model) {
    return store->Resume(snapshot, static_cast<int64_t>(model.weights().size()),
                         absl::MakeSpan(model.buffer_values()));
  };
  c.resume_step = [store] { return store->resume_step(); };
  return Create(options, std::move(c));
}

absl::StatusOr<std::unique_ptr<RingCheckpointer>> RingCheckpointer::Create(
    const RingCheckpointOptions& options, AllReduceSync* sync) {
  const bool root = options.rank == 0;
  Collectives c;
  c.snapshot = [sync, root](int64_t step, nn::Model& model) -> absl::StatusOr<RingSnapshot> {
    RingSnapshot snapshot;
    snapshot.step = step;
    if (root) {  // Every replica holds the same state; rank 0 writes it.
      auto state = model.ExportOptimizerState();
      if (!state.ok()) return state.status();
      snapshot.optimizer = *std::move(state);
    }
    auto rank_buffers = sync->GatherRankBuffers(step, model.buffer_values());
    if (!rank_buffers.ok()) return rank_buffers.status();
    snapshot.rank_buffers = *std::move(rank_buffers);
    return snapshot;
  };
  c.resume = [sync](const RingSnapshot& snapshot, nn::Model& model) {
    RingSnapshot got = snapshot;
    if (auto s = sync->BroadcastSnapshot(got, static_cast<int64_t>(model.weights().size()),
                                         absl::MakeSpan(model.buffer_values()));
        !s.ok()) {
      return s;
    }
    return model.ImportOptimizerState(std::move(got.optimizer));
  };
  c.resume_step = [sync] { return sync->resume_step(); };
  return Create(options, std::move(c));
}

absl::StatusOr<std::unique_ptr<RingCheckpointer>> RingCheckpointer::Create(
    const RingCheckpointOptions& options, Collectives collectives) {
  if (options.every < 0) return absl::InvalidArgumentError("--save_every must be >= 0");
  std::optional<CheckpointDir> dir;
  if (options.rank == 0) {
    CheckpointDirOptions d;
    d.dir = options.dir;
    d.fs = options.fs;
    auto opened = CheckpointDir::Open(d);
    if (!opened.ok()) return opened.status();
    dir = *std::move(opened);
  }
  return std::unique_ptr<RingCheckpointer>(
      new RingCheckpointer(options, std::move(collectives), std::move(dir)));
}

absl::Status RingCheckpointer::Resume(nn::Model& model, std::string* description) {
  RingSnapshot snapshot;
  if (dir_.has_value()) {
    auto cp = dir_->LoadNewest();
    if (absl::IsNotFound(cp.status())) {
      return absl::NotFoundError(
          absl::StrCat("--resume: no checkpoint in '", options_.dir, "' to resume from"));
    }
    if (!cp.ok()) return cp.status();
    if (auto s = CheckFits(*cp, options_); !s.ok()) return s;
    // One chunk per tensor, in order (CheckFits): the weights and the state, back to back.
    auto weights = model.weights().begin();
    const auto full = snapshot.optimizer.vectors();
    for (ChunkCheckpoint& c : cp->chunks) {
      weights = std::copy(c.weights.begin(), c.weights.end(), weights);
      const auto part = c.state.vectors();
      for (size_t i = 0; i < full.size(); ++i) {
        if (part[i]->empty() != cp->chunks.front().state.vectors()[i]->empty()) {
          return absl::InvalidArgumentError("the checkpoint's optimizer state is incomplete");
        }
        full[i]->insert(full[i]->end(), part[i]->begin(), part[i]->end());
      }
    }
    snapshot.optimizer.steps = cp->chunks.empty() ? 0 : cp->chunks.front().state.steps;
    snapshot.step = cp->step;
    snapshot.rank_buffers = std::move(cp->buffers);
    *description = absl::StrCat("restored step ", cp->step, " from ", dir_->PathOf(cp->step));
  }
  if (auto s = collectives_.resume(snapshot, model); !s.ok()) return s;
  if (!dir_.has_value()) {
    *description =
        absl::StrCat("resumes at rank 0's checkpoint of step ", collectives_.resume_step());
  }
  return absl::OkStatus();
}

absl::Status RingCheckpointer::AfterStep(int64_t next_step, nn::Model& model) {
  if (options_.every <= 0 || next_step % options_.every != 0) return absl::OkStatus();
  auto snapshot = collectives_.snapshot(next_step, model);
  if (!snapshot.ok()) return snapshot.status();
  if (!dir_.has_value()) return absl::OkStatus();
  ShardCheckpoint cp;
  cp.job_id = options_.job_id;
  cp.model.tensors = options_.tensors;
  cp.optimizer = options_.optimizer;
  cp.policy = kPolicy;
  cp.step = next_step;
  cp.world_size = options_.world_size;
  cp.buffers = std::move(snapshot->rank_buffers);
  const std::vector<float>& weights = model.weights();
  const auto full = snapshot->optimizer.vectors();
  int64_t offset = 0;
  for (size_t t = 0; t < options_.tensors.size(); ++t) {
    const int64_t n = options_.tensors[t].num_elements;
    ChunkCheckpoint& c = cp.chunks.emplace_back();
    c.tensor_id = static_cast<int>(t);
    c.version = next_step;
    c.weights.assign(weights.begin() + offset, weights.begin() + offset + n);
    const auto part = c.state.vectors();
    for (size_t i = 0; i < full.size(); ++i) {
      if (!full[i]->empty())
        part[i]->assign(full[i]->begin() + offset, full[i]->begin() + offset + n);
    }
    c.state.steps = snapshot->optimizer.steps;
    offset += n;
  }
  if (absl::Status s = dir_->Write(cp); !s.ok()) {
    std::cerr << "rank 0: checkpoint of step " << next_step << " failed: " << s.message()
              << "; training goes on" << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace dptrain
