#include "common/mailbox.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::Status Mailbox::Deposit(int from, uint64_t tag, MessageBytes data) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("mailbox closed");
  auto [it, inserted] = messages_.emplace(std::make_pair(from, tag), std::move(data));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("a message from rank ", from, " with tag ", tag, " is already waiting"));
  }
  return absl::OkStatus();
}

absl::Status Mailbox::Take(int from, uint64_t tag, absl::Span<float> out, absl::Time deadline) {
  const auto key = std::make_pair(from, tag);
  absl::MutexLock lock(&mu_);
  auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || messages_.count(key) > 0 || closed_senders_.count(key.first) > 0;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("timed out waiting for data from rank ", from, " (tag ", tag, ")"));
  }
  if (closed_) return absl::UnavailableError("mailbox closed");
  auto it = messages_.find(key);
  if (it == messages_.end()) {
    return absl::UnavailableError(
        absl::StrCat("rank ", from, " closed its connection before sending tag ", tag));
  }
  if (it->second.size != out.size() * sizeof(float)) {
    const size_t got = it->second.size;
    messages_.erase(it);
    return absl::InvalidArgumentError(absl::StrCat("message from rank ", from, " has ", got,
                                                   " bytes, expected ", out.size() * 4));
  }
  std::memcpy(out.data(), it->second.data.get(), it->second.size);
  messages_.erase(it);
  return absl::OkStatus();
}

void Mailbox::MarkClosed(int from) {
  absl::MutexLock lock(&mu_);
  closed_senders_.insert(from);
}

void Mailbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace dptrain
