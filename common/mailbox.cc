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

void AddScaled(float* out, const char* in, size_t n, float scale) {
  // Restrict-qualified and in one pass, so that the compiler vectorises it; (a + b) * s
  // rounds twice, exactly as adding and then scaling did.
  float* __restrict o = out;
  const char* __restrict p = in;
  if (scale == 1.0f) {
    for (size_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, p + i * sizeof(float), sizeof(float));
      o[i] += x;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, p + i * sizeof(float), sizeof(float));
    o[i] = (o[i] + x) * scale;
  }
}

absl::Status Mailbox::AwaitArrival(const Key& key, absl::Time deadline) {
  auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || messages_.count(key) > 0 || delivered_.count(key) > 0 ||
           (closed_senders_.count(key.first) > 0 && claimed_.count(key) == 0);
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("timed out waiting for data from rank ",
                                                    key.first, " (tag ", key.second, ")"));
  }
  if (closed_) return absl::UnavailableError("mailbox closed");
  if (messages_.count(key) == 0 && delivered_.count(key) == 0) {
    return absl::UnavailableError(absl::StrCat("rank ", key.first,
                                               " closed its connection before sending tag ",
                                               key.second));
  }
  return absl::OkStatus();
}

absl::StatusOr<MessageBytes> Mailbox::Take(int from, uint64_t tag, size_t bytes,
                                           absl::Time deadline) {
  const Key key(from, tag);
  absl::MutexLock lock(&mu_);
  posted_.erase(key);  // The message is taken here, not delivered.
  if (auto s = AwaitArrival(key, deadline); !s.ok()) return s;
  if (delivered_.erase(key) > 0) return MessageBytes{};  // Already where it belongs.
  auto it = messages_.find(key);
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
  const Key key(from, tag);
  {
    absl::MutexLock lock(&mu_);
    if (auto s = AwaitArrival(key, deadline); !s.ok()) return s;
    if (delivered_.erase(key) > 0) return absl::OkStatus();
  }
  auto message = Take(from, tag, out.size() * sizeof(float), deadline);
  if (!message.ok()) return message.status();
  if (message->size > 0) std::memcpy(out.data(), message->data.get(), message->size);
  return absl::OkStatus();
}

absl::Status Mailbox::TakeAdd(int from, uint64_t tag, absl::Span<float> inout, float scale,
                              absl::Time deadline) {
  const Key key(from, tag);
  {
    absl::MutexLock lock(&mu_);
    if (auto s = AwaitArrival(key, deadline); !s.ok()) return s;
    if (delivered_.erase(key) > 0) return absl::OkStatus();
  }
  auto message = Take(from, tag, inout.size() * sizeof(float), deadline);
  if (!message.ok()) return message.status();
  AddScaled(inout.data(), message->data.get(), inout.size(), scale);
  return absl::OkStatus();
}

void Mailbox::Post(int from, uint64_t tag, const Posting& posting) {
  const Key key(from, tag);
  absl::MutexLock lock(&mu_);
  if (messages_.count(key) > 0 || closed_) return;
  posted_[key] = posting;
}

bool Mailbox::Unpost(int from, uint64_t tag, absl::Time deadline) {
  const Key key(from, tag);
  absl::MutexLock lock(&mu_);
  posted_.erase(key);
  auto idle = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return claimed_.count(key) == 0;
  };
  const bool ended = mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  delivered_.erase(key);
  return ended;
}

std::optional<Posting> Mailbox::Claim(int from, uint64_t tag, size_t bytes) {
  const Key key(from, tag);
  absl::MutexLock lock(&mu_);
  auto it = posted_.find(key);
  if (it == posted_.end() || it->second.dest.size() * sizeof(float) != bytes) return std::nullopt;
  Posting posting = it->second;
  posted_.erase(it);
  claimed_.insert(key);
  return posting;
}

void Mailbox::Delivered(int from, uint64_t tag, bool ok) {
  const Key key(from, tag);
  absl::MutexLock lock(&mu_);
  claimed_.erase(key);
  if (ok) delivered_.insert(key);
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
