#include "common/in_memory_link.h"

#include "absl/strings/str_cat.h"

namespace dptrain {

class InMemoryHub::Link : public PeerLink {
 public:
  Link(InMemoryHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size_; }

  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override {
    if (peer < 0 || peer >= hub_->world_size_) return absl::InvalidArgumentError("bad peer");
    absl::MutexLock lock(&hub_->mu_);
    auto [it, inserted] =
        hub_->mailbox_.emplace(Key{rank_, peer, tag}, std::vector<float>(data.begin(), data.end()));
    if (!inserted) return absl::AlreadyExistsError(absl::StrCat("tag ", tag, " sent twice"));
    ++hub_->messages_;
    return absl::OkStatus();
  }

  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override {
    const Key key{peer, rank_, tag};
    absl::MutexLock lock(&hub_->mu_);
    auto arrived = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(hub_->mu_) {
      return hub_->mailbox_.count(key) > 0;
    };
    if (!hub_->mu_.AwaitWithTimeout(absl::Condition(&arrived), hub_->timeout_)) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": nothing from rank ", peer,
                                                      " (tag ", tag, ") within ",
                                                      absl::FormatDuration(hub_->timeout_)));
    }
    auto it = hub_->mailbox_.find(key);
    if (it->second.size() != out.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message of ", it->second.size(), " elements, expected ", out.size()));
    }
    std::copy(it->second.begin(), it->second.end(), out.begin());
    hub_->mailbox_.erase(it);
    return absl::OkStatus();
  }

 private:
  InMemoryHub* const hub_;
  const int rank_;
};

InMemoryHub::InMemoryHub(int world_size, absl::Duration timeout)
    : world_size_(world_size), timeout_(timeout) {
  for (int r = 0; r < world_size; ++r) links_.push_back(std::make_unique<Link>(this, r));
}

InMemoryHub::~InMemoryHub() = default;

PeerLink& InMemoryHub::link(int rank) { return *links_[rank]; }

int64_t InMemoryHub::messages() const {
  absl::MutexLock lock(&mu_);
  return messages_;
}

}  // namespace dptrain
