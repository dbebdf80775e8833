#include "worker/comm/sparse_client.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/sparse_frames.h"
#include "common/sparse_rows.h"

namespace dptrain {

absl::StatusOr<std::unique_ptr<SparseClient>> SparseClient::Create(const SparseClientOptions& o) {
  if (o.shard_addresses.empty()) {
    return absl::InvalidArgumentError(
        "sparse tables live on the parameter-server shards: give their addresses (DPTRAIN_PS)");
  }
  std::unique_ptr<SparseClient> client(new SparseClient(o));
  for (const std::string& address : o.shard_addresses) {
    std::shared_ptr<grpc::Channel> channel = MakeChannel(address, *o.credentials);
    client->stubs_.push_back(proto::SparseTables::NewStub(channel));
    client->raw_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
  return client;
}

absl::Status SparseClient::ForShards(
    const std::vector<bool>& work, const std::string& what,
    const std::function<grpc::Status(int, grpc::ClientContext&)>& call) {
  const int n = static_cast<int>(stubs_.size());
  std::vector<grpc::Status> results(n);
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) {
    if (!work[s]) continue;
    threads.emplace_back([&, s] {
      const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
      absl::Duration backoff = absl::Milliseconds(50);
      while (true) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
        results[s] = call(s, context);
        if (results[s].error_code() != grpc::StatusCode::UNAVAILABLE ||
            absl::Now() + backoff > give_up) {
          break;
        }
        absl::SleepFor(backoff);
        backoff = std::min(2 * backoff, absl::Seconds(1));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < n; ++s) {
    if (!results[s].ok()) {
      return FromGrpcStatus(
          results[s], absl::StrCat(what, " on shard ", s, " at ", options_.shard_addresses[s]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SparseClient::Declare(const proto::SparseTableSpec& table) {
  const int n = static_cast<int>(stubs_.size());
  std::vector<proto::SparseDeclareResponse> responses(n);
  proto::SparseDeclareRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  *request.mutable_table() = table;
  auto s = ForShards(std::vector<bool>(n, true),
                     absl::StrCat("declaring sparse table '", table.name(), "'"),
                     [&](int shard, grpc::ClientContext& context) {
                       return stubs_[shard]->Declare(&context, request, &responses[shard]);
                     });
  if (!s.ok()) return s;
  for (int shard = 1; shard < n; ++shard) {
    if (responses[shard].step() != responses[0].step()) {
      return absl::FailedPreconditionError(
          absl::StrCat("sparse table '", table.name(), "' is at step ", responses[0].step(),
                       " on shard 0 and ", responses[shard].step(), " on shard ", shard));
    }
  }
  return responses[0].step();
}

grpc::Status SparseClient::RawCall(int shard, grpc::ClientContext& context, const char* method,
                                   const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  absl::Notification done;
  grpc::Status status;
  raw_stubs_[shard]->UnaryCall(&context, method, grpc::StubOptions(), &request, response,
                               [&](grpc::Status s) {
                                 status = std::move(s);
                                 done.Notify();
                               });
  done.WaitForNotification();
  return status;
}

proto::SparseFrameHeader SparseClient::Header(const std::string& table) const {
  proto::SparseFrameHeader h;
  h.mutable_caller()->set_job_id(options_.job_id);
  h.mutable_caller()->set_rank(options_.rank);
  h.set_table(table);
  return h;
}

absl::Status SparseClient::Pull(const std::string& table, int dim, absl::Span<const int64_t> ids,
                                absl::Span<float> out) {
  const int n = static_cast<int>(stubs_.size());
  if (out.size() != ids.size() * dim) {
    return absl::InvalidArgumentError("sparse pull: the output does not hold ids x dim values");
  }
  std::vector<std::vector<int64_t>> shard_ids(n);
  std::vector<std::vector<size_t>> positions(n);  // Where each shard's rows go in `out`.
  std::vector<bool> work(n, false);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse table '", table, "': id ", ids[i], " is negative"));
    }
    const int s = RowShard(ids[i], n);
    shard_ids[s].push_back(ids[i]);
    positions[s].push_back(i);
    work[s] = true;
  }
  const size_t row_bytes = dim * sizeof(float);
  // Each shard's answer is scattered on its own thread as soon as it arrives (the shards'
  // rows go to disjoint places of `out`).
  return ForShards(
      work, absl::StrCat("sparse pull of table '", table, "'"),
      [&](int s, grpc::ClientContext& context) {
        const grpc::ByteBuffer request = SparseRowsFrame(Header(table), shard_ids[s], {}, dim);
        grpc::ByteBuffer response;
        grpc::Status called = RawCall(s, context, kSparsePullMethod, request, &response);
        if (!called.ok()) return called;
        auto frame = SparseFrame::Parse(response);
        if (!frame.ok()) return ToGrpcStatus(frame.status());
        if (frame->payload_size() != positions[s].size() * row_bytes) {
          return grpc::Status(grpc::StatusCode::DATA_LOSS,
                              absl::StrCat("answered with ", frame->payload_size(), " bytes for ",
                                           positions[s].size(), " rows"));
        }
        // Each row from the answer's slices straight to its place (one copy).
        FramePayload::Reader reader = frame->PayloadReader();
        for (size_t position : positions[s]) {
          reader.Read(reinterpret_cast<char*>(out.data() + position * dim), row_bytes);
        }
        return grpc::Status::OK;
      });
}

absl::Status SparseClient::Push(const std::string& table, int dim, int64_t step,
                                absl::Span<const int64_t> ids, absl::Span<const float> grads) {
  const int n = static_cast<int>(stubs_.size());
  if (grads.size() != ids.size() * dim) {
    return absl::InvalidArgumentError("sparse push: the gradients are not ids x dim values");
  }
  std::vector<std::vector<int64_t>> shard_ids(n);
  std::vector<std::vector<size_t>> rows_of(n);  // Each shard's rows of `grads`.
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse table '", table, "': id ", ids[i], " is negative"));
    }
    const int s = RowShard(ids[i], n);
    shard_ids[s].push_back(ids[i]);
    rows_of[s].push_back(i);
  }
  return ForShards(
      std::vector<bool>(n, true), absl::StrCat("sparse push of table '", table, "', step ", step),
      [&](int s, grpc::ClientContext& context) {
        proto::SparseFrameHeader h = Header(table);
        h.set_step(step);
        // A copy, not a frame referring to `grads`: a cancelled call's data may still be in
        // the transport's buffers when the call returns and the caller frees `grads`.
        const grpc::ByteBuffer request = SparseRowsFrame(h, shard_ids[s], grads, dim, rows_of[s]);
        grpc::ByteBuffer response;
        return RawCall(s, context, kSparsePushMethod, request, &response);
      });
}

}  // namespace dptrain

namespace dptrain {

absl::StatusOr<std::vector<int64_t>> SparseClient::Steps(const std::string& table) {
  const int n = static_cast<int>(stubs_.size());
  std::vector<proto::SparseStatusResponse> responses(n);
  auto s = ForShards(
      std::vector<bool>(n, true), absl::StrCat("status of sparse table '", table, "'"),
      [&](int shard, grpc::ClientContext& context) {
        return stubs_[shard]->Status(&context, proto::SparseStatusRequest(), &responses[shard]);
      });
  if (!s.ok()) return s;
  std::vector<int64_t> steps(n, -1);
  for (int shard = 0; shard < n; ++shard) {
    for (const proto::SparseTableStatus& t : responses[shard].tables()) {
      if (t.table().name() == table) steps[shard] = t.step();
    }
    if (steps[shard] < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard, " at ", options_.shard_addresses[shard], " does not hold sparse table '",
          table, "' (restarted without a checkpoint of it?)"));
    }
  }
  return steps;
}

absl::Status SparseClient::Rollback(const std::string& table, int64_t step) {
  const int n = static_cast<int>(stubs_.size());
  proto::SparseRollbackRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_table(table);
  request.set_step(step);
  return ForShards(std::vector<bool>(n, true),
                   absl::StrCat("rolling sparse table '", table, "' back to step ", step),
                   [&](int shard, grpc::ClientContext& context) {
                     proto::SparseRollbackResponse response;
                     return stubs_[shard]->Rollback(&context, request, &response);
                   });
}

}  // namespace dptrain
