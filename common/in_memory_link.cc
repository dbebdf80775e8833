#include "common/in_memory_link.h"

namespace dptrain {

class InMemoryHub::Link : public PeerLink {
 public:
  Link(InMemoryHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(hub_->inboxes_.size()); }

  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override {
    if (peer < 0 || peer >= world_size()) return absl::InvalidArgumentError("bad peer");
    ++hub_->messages_;
    sent_ += static_cast<int64_t>(data.size() * sizeof(float));
    return hub_->inboxes_[peer].Deposit(
        rank_, tag, MessageBytes::Copy(data.data(), data.size() * sizeof(float)));
  }

  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override {
    absl::Status s =
        hub_->inboxes_[rank_].TakeInto(peer, tag, out, absl::Now() + hub_->timeout_);
    if (s.ok()) received_ += static_cast<int64_t>(out.size() * sizeof(float));
    return s;
  }

  absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) override {
    absl::Status s =
        hub_->inboxes_[rank_].TakeAdd(peer, tag, inout, scale, absl::Now() + hub_->timeout_);
    if (s.ok()) received_ += static_cast<int64_t>(inout.size() * sizeof(float));
    return s;
  }

  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  InMemoryHub* const hub_;
  const int rank_;
  std::atomic<int64_t> sent_{0}, received_{0};
};

InMemoryHub::InMemoryHub(int world_size, absl::Duration timeout)
    : timeout_(timeout), inboxes_(world_size) {
  for (int r = 0; r < world_size; ++r) links_.push_back(std::make_unique<Link>(this, r));
}

InMemoryHub::~InMemoryHub() = default;

PeerLink& InMemoryHub::link(int rank) { return *links_[rank]; }

}  // namespace dptrain
