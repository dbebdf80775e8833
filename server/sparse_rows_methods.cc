#include "server/sparse_rows_methods.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/sparse_frames.h"

namespace dptrain {

// One call: reads the request frame, answers with one frame (or the error), deletes itself
// when gRPC is done with it.
class SparseRowsReactor final : public grpc::ServerGenericBidiReactor {
 public:
  SparseRowsReactor(SparseRowsMethods* methods, grpc::GenericCallbackServerContext* context,
                    bool push)
      : methods_(methods), context_(context), push_(push) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "sparse rows: the call ended before its request frame"));
      return;
    }
    methods_->bytes_received_ += static_cast<int64_t>(in_.Length());
    if (!push_) {
      Answer(Pull());
      return;
    }
    if (++methods_->pushes_ > methods_->max_pushes_) {
      --methods_->pushes_;
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("sparse rows: ", methods_->max_pushes_,
                                       " pushes are being served already")));
      return;
    }
    std::thread([this] {
      const absl::Status pushed = Push();
      --methods_->pushes_;
      Answer(pushed);  // The last use of `this`: gRPC may delete the call right after.
    }).detach();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Pull() {
    auto frame = SparseFrame::Parse(in_);
    if (!frame.ok()) return frame.status();
    std::vector<int64_t> ids;
    if (auto s = ReadSparseFrame(*frame, 0, ids, nullptr); !s.ok()) return s;
    // The rows go straight into the answer's slice, unless its bytes are not float-aligned
    // (gRPC promises no alignment): then through a copy.
    grpc::Slice payload;
    std::vector<float> staging;
    const absl::Status pulled = methods_->service_->PullRows(
        frame->header().caller(), frame->header().table(), ids,
        [&payload, &staging](size_t values) {
          payload = NewPayload(values * sizeof(float));
          char* bytes = MutableData(payload);
          if (reinterpret_cast<uintptr_t>(bytes) % alignof(float) == 0) {
            return absl::MakeSpan(reinterpret_cast<float*>(bytes), values);
          }
          staging.resize(values);
          return absl::MakeSpan(staging);
        });
    if (!pulled.ok()) return pulled;
    if (!staging.empty()) {
      std::memcpy(MutableData(payload), staging.data(), staging.size() * sizeof(float));
    }
    proto::SparseFrameHeader header;
    header.set_rows(static_cast<int64_t>(ids.size()));
    out_ = FrameOwning(header, std::move(payload));
    return absl::OkStatus();
  }

  absl::Status Push() {
    auto frame = SparseFrame::Parse(in_);
    if (!frame.ok()) return frame.status();
    const proto::SparseFrameHeader& h = frame->header();
    // The ids first tell the row count; the values are the rest (the table checks rows x dim).
    const size_t rows = h.rows() < 0 ? 0 : static_cast<size_t>(h.rows());
    const size_t value_bytes = frame->payload_size() - std::min(frame->payload_size(), rows * 8);
    if (value_bytes % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse push of table '", h.table(), "': ", value_bytes,
                       " gradient bytes are not a whole number of fp32"));
    }
    const int dim = rows == 0 ? 0 : static_cast<int>(value_bytes / sizeof(float) / rows);
    std::vector<int64_t> ids;
    // Not zeroed first: every value is read from the frame.
    const size_t values = rows * static_cast<size_t>(dim);
    std::unique_ptr<float[]> buffer(new float[values]);
    const absl::Span<float> grads(buffer.get(), values);
    if (auto s = ReadSparseFrame(*frame, dim, ids, grads); !s.ok()) return s;
    in_.Clear();
    return methods_->service_->PushRows(
        h.caller(), h.table(), h.step(), ids, grads,
        methods_->service_->PushDeadline(absl::FromChrono(context_->deadline())));
  }

  void Answer(const absl::Status& status) {
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    if (push_) out_ = FrameOwning(proto::SparseFrameHeader(), grpc::Slice());
    methods_->bytes_sent_ += static_cast<int64_t>(out_.Length());
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
  }

  SparseRowsMethods* const methods_;
  grpc::GenericCallbackServerContext* const context_;
  const bool push_;
  grpc::ByteBuffer in_, out_;
};

void SparseRowsMethods::AddTo(GenericMethods& methods) {
  methods.Add(kSparsePullMethod, [this](grpc::GenericCallbackServerContext* context) {
    return new SparseRowsReactor(this, context, /*push=*/false);
  });
  methods.Add(kSparsePushMethod, [this](grpc::GenericCallbackServerContext* context) {
    return new SparseRowsReactor(this, context, /*push=*/true);
  });
}

}  // namespace dptrain
