#include "common/faulty_link.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dptrain {

FaultyLink::FaultyLink(PeerLink& base, std::vector<LinkFault> plan)
    : base_(base), plan_(std::move(plan)), matches_(plan_.size(), 0) {}

FaultyLink::~FaultyLink() {
  std::vector<std::thread> delayed;
  {
    absl::MutexLock lock(&mu_);
    delayed.swap(delayed_);
  }
  for (std::thread& t : delayed) t.join();
}

const LinkFault* FaultyLink::Match(bool send, int peer) {
  absl::MutexLock lock(&mu_);
  const LinkFault* fired = nullptr;
  for (size_t i = 0; i < plan_.size(); ++i) {
    const LinkFault& f = plan_[i];
    if ((f.kind == LinkFault::Kind::kFailRecv) == send) continue;
    if (f.peer >= 0 && f.peer != peer) continue;
    const int64_t n = matches_[i]++;  // Counted even when an earlier fault fires.
    if (fired == nullptr && (f.occurrence < 0 || f.occurrence == n)) fired = &f;
  }
  return fired;
}

void FaultyLink::Note(std::string what) {
  absl::MutexLock lock(&mu_);
  injected_.push_back(std::move(what));
}

std::vector<std::string> FaultyLink::injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

absl::Status FaultyLink::Send(int peer, uint64_t tag, absl::Span<const float> data) {
  const LinkFault* f = Match(/*send=*/true, peer);
  if (f == nullptr) return base_.Send(peer, tag, data);
  const std::string who = absl::StrCat("rank ", rank());
  const std::string what = absl::StrCat(" rank ", peer, " (tag ", tag, ")");
  switch (f->kind) {
    case LinkFault::Kind::kFailSend:
      Note(absl::StrCat(who, " failed its send to", what));
      return f->status.ok() ? absl::UnavailableError(
                                  absl::StrCat(who, ": send to rank ", peer,
                                               " failed: connection reset by peer (injected)"))
                            : f->status;
    case LinkFault::Kind::kDrop:
      Note(absl::StrCat(who, " dropped its send to", what));
      return absl::OkStatus();
    case LinkFault::Kind::kTruncate:
      Note(absl::StrCat(who, " truncated its send to", what, " to ", f->keep_elements, " of ",
                        data.size(), " elements"));
      return base_.Send(peer, tag, data.subspan(0, f->keep_elements));
    case LinkFault::Kind::kDelay: {
      Note(absl::StrCat(who, " delayed its send to", what, " by ", absl::FormatDuration(f->delay)));
      std::vector<float> copy(data.begin(), data.end());
      absl::MutexLock lock(&mu_);
      delayed_.emplace_back([this, peer, tag, delay = f->delay, copy = std::move(copy)] {
        absl::SleepFor(delay);
        // The collective that sent it may have given up by now: the late message is then
        // left in the peer's mailbox, as a late packet would be.
        (void)base_.Send(peer, tag, copy);
      });
      return absl::OkStatus();
    }
    case LinkFault::Kind::kFailRecv:
      break;  // Never matched by a send.
  }
  return base_.Send(peer, tag, data);
}

absl::Status FaultyLink::InjectedRecvFailure(int peer, uint64_t tag) {
  const LinkFault* f = Match(/*send=*/false, peer);
  if (f == nullptr) return absl::OkStatus();
  Note(absl::StrCat("rank ", rank(), " failed its receive from rank ", peer, " (tag ", tag, ")"));
  return f->status.ok() ? absl::UnavailableError(
                              absl::StrCat("rank ", peer, " closed its connection (injected)"))
                        : f->status;
}

absl::Status FaultyLink::Recv(int peer, uint64_t tag, absl::Span<float> out) {
  if (absl::Status s = InjectedRecvFailure(peer, tag); !s.ok()) return s;
  return base_.Recv(peer, tag, out);
}

absl::Status FaultyLink::RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) {
  if (absl::Status s = InjectedRecvFailure(peer, tag); !s.ok()) return s;
  return base_.RecvAdd(peer, tag, inout, scale);
}

}  // namespace dptrain
