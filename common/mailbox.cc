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

absl::StatusOr<MessageBytes> Mailbox::Take(int from, uint64_t tag, size_t bytes,
                                           absl::Time deadline) {
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
  MessageBytes message = std::move(it->second);
  messages_.erase(it);
  if (message.size != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message from rank ", from, " has ",
                                                   message.size, " bytes, expected ", bytes));
  }
  return message;
}

absl::Status Mailbox::TakeInto(int from, uint64_t tag, absl::Span<float> out,
                               absl::Time deadline) {
  auto message = Take(from, tag, out.size() * sizeof(float), deadline);
  if (!message.ok()) return message.status();
  if (message->size > 0) std::memcpy(out.data(), message->data.get(), message->size);
  return absl::OkStatus();
}

absl::Status Mailbox::TakeAdd(int from, uint64_t tag, absl::Span<float> inout,
                              absl::Time deadline) {
  auto message = Take(from, tag, inout.size() * sizeof(float), deadline);
  if (!message.ok()) return message.status();
  // The bytes came from the network: copy element-wise rather than assume alignment.
  const char* in = message->data.get();
  float* out = inout.data();
  for (size_t i = 0; i < inout.size(); ++i) {
    float x;
    std::memcpy(&x, in + i * sizeof(float), sizeof(float));
    out[i] += x;
  }
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
