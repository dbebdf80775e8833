#include "worker/comm/tcp_peer_link.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dptrain {
namespace {

constexpr uint32_t kMagic = 0x44505452;  // "DPTR"
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;

uint64_t HashJob(const std::string& job) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : job) h = (h ^ c) * 1099511628211ull;
  return h;
}

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Reads exactly n bytes. Returns 1 on success, 0 on EOF before the first byte, -1 on error
// or EOF in the middle.
int ReadFull(int fd, void* buffer, size_t n) {
  char* p = static_cast<char*>(buffer);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = read(fd, p + done, n - done);
    if (r > 0) {
      done += static_cast<size_t>(r);
    } else if (r == 0) {
      return done == 0 ? 0 : -1;
    } else if (errno != EINTR) {
      return -1;
    }
  }
  return 1;
}

// An expected message's payload, read straight into its destination; an added one goes
// through `scratch` a piece at a time, so the bytes are added while still in cache.
constexpr size_t kAddPieceBytes = 64 << 10;

bool ReadInto(int fd, const Posting& posting, std::vector<char>& scratch) {
  float* dest = posting.dest.data();
  const size_t n = posting.dest.size();
  if (!posting.add) return n == 0 || ReadFull(fd, dest, n * sizeof(float)) == 1;
  const size_t per_piece = scratch.size() / sizeof(float);
  for (size_t done = 0; done < n; done += per_piece) {
    const size_t count = std::min(per_piece, n - done);
    if (ReadFull(fd, scratch.data(), count * sizeof(float)) != 1) return false;
    AddScaled(dest + done, scratch.data(), count, posting.scale);
  }
  return true;
}

bool WriteFull(int fd, iovec* iov, int count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(int port) {
  std::unique_ptr<TcpListener> l(new TcpListener());
  l->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return Errno("socket");
  const int one = 1;
  setsockopt(l->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(l->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("bind port ", port));
  }
  if (listen(l->fd_, 64) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  getsockname(l->fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  l->port_ = ntohs(addr.sin_port);
  return l;
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

TcpPeerLink::TcpPeerLink(const TcpPeerLinkOptions& options, std::unique_ptr<TcpListener> listener)
    : options_(options), job_hash_(HashJob(options.job_id)), listener_(std::move(listener)) {
  for (size_t i = 0; i < options.addresses.size(); ++i) {
    outgoing_.push_back(std::make_unique<Outgoing>());
  }
}

absl::StatusOr<std::unique_ptr<TcpPeerLink>> TcpPeerLink::Create(
    const TcpPeerLinkOptions& options, std::unique_ptr<TcpListener> listener) {
  const int n = static_cast<int>(options.addresses.size());
  if (n < 1 || options.rank < 0 || options.rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " not in [0, ", n, ")"));
  }
  std::unique_ptr<TcpPeerLink> link(new TcpPeerLink(options, std::move(listener)));
  link->acceptor_ = std::thread([l = link.get()] { l->AcceptLoop(); });
  return link;
}

TcpPeerLink::~TcpPeerLink() {
  stopping_ = true;
  acceptor_.join();
  for (auto& out : outgoing_) {
    if (out->fd >= 0) {
      shutdown(out->fd, SHUT_WR);  // The peer's reader sees a clean end of stream.
      close(out->fd);
    }
  }
  std::vector<std::thread> readers;
  {
    absl::MutexLock lock(&readers_mu_);
    for (int fd : reader_fds_) shutdown(fd, SHUT_RDWR);
    readers.swap(readers_);
  }
  for (auto& t : readers) t.join();
  inbox_.Close();
}

void TcpPeerLink::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listener_->fd(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listener_->fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    absl::MutexLock lock(&readers_mu_);
    reader_fds_.push_back(fd);
    readers_.emplace_back([this, fd] { ReadLoop(fd); });
  }
}

void TcpPeerLink::ReadLoop(int fd) {
  struct {
    uint32_t magic, rank;
    uint64_t job;
  } hello;
  if (ReadFull(fd, &hello, sizeof(hello)) != 1 || hello.magic != kMagic ||
      hello.job != job_hash_ || hello.rank >= static_cast<uint32_t>(world_size())) {
    close(fd);  // Not one of ours: drop it.
    return;
  }
  const int from = static_cast<int>(hello.rank);
  std::vector<char> scratch(kAddPieceBytes);
  while (true) {
    uint64_t header[2];
    const int r = ReadFull(fd, header, sizeof(header));
    if (r != 1 || header[1] > kMaxMessageBytes) break;
    if (std::optional<Posting> posting = inbox_.Claim(from, header[0], header[1])) {
      const bool ok = ReadInto(fd, *posting, scratch);
      inbox_.Delivered(from, header[0], ok);
      if (!ok) break;
      received_ += static_cast<int64_t>(sizeof(header) + header[1]);
      continue;
    }
    MessageBytes payload = MessageBytes::Allocate(header[1]);
    if (header[1] > 0 && ReadFull(fd, payload.data.get(), payload.size) != 1) break;
    received_ += static_cast<int64_t>(sizeof(header) + payload.size);
    if (!inbox_.Deposit(from, header[0], std::move(payload)).ok()) break;
  }
  inbox_.MarkClosed(from);
  close(fd);
}

absl::Status TcpPeerLink::Connect(int peer, Outgoing& out) {
  const std::string& address = options_.addresses[peer];
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer address '", address, "'"));
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve rank ", peer, " at ", address));
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  int fd = -1;
  while (true) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
    if (fd >= 0) close(fd);
    fd = -1;
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  freeaddrinfo(found);
  if (fd < 0) return Errno(absl::StrCat("cannot connect to rank ", peer, " at ", address));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  struct {
    uint32_t magic, rank;
    uint64_t job;
  } hello{kMagic, static_cast<uint32_t>(options_.rank), job_hash_};
  iovec iov{&hello, sizeof(hello)};
  if (!WriteFull(fd, &iov, 1)) {
    close(fd);
    return Errno(absl::StrCat("hello to rank ", peer));
  }
  out.fd = fd;
  return absl::OkStatus();
}

absl::Status TcpPeerLink::Send(int peer, uint64_t tag, absl::Span<const float> data) {
  if (peer < 0 || peer >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("no rank ", peer));
  }
  Outgoing& out = *outgoing_[peer];
  absl::MutexLock lock(&out.mu);
  if (out.fd < 0) {
    if (auto s = Connect(peer, out); !s.ok()) return s;
  }
  uint64_t header[2] = {tag, data.size() * sizeof(float)};
  iovec iov[2] = {{header, sizeof(header)},
                  {const_cast<float*>(data.data()), data.size() * sizeof(float)}};
  if (!WriteFull(out.fd, iov, data.empty() ? 1 : 2)) {
    return Errno(absl::StrCat("send to rank ", peer, " at ", options_.addresses[peer]));
  }
  sent_ += static_cast<int64_t>(sizeof(header) + data.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status TcpPeerLink::Recv(int peer, uint64_t tag, absl::Span<float> out) {
  return Explain(inbox_.TakeInto(peer, tag, out, absl::Now() + options_.timeout));
}

absl::Status TcpPeerLink::RecvAdd(int peer, uint64_t tag, absl::Span<float> inout,
                                  float scale) {
  return Explain(inbox_.TakeAdd(peer, tag, inout, scale, absl::Now() + options_.timeout));
}

void TcpPeerLink::Expect(int peer, uint64_t tag, const Posting& posting) {
  inbox_.Post(peer, tag, posting);
}

bool TcpPeerLink::Unexpect(int peer, uint64_t tag) {
  if (inbox_.Unpost(peer, tag, absl::Now() + options_.timeout)) return true;
  // A peer stalled half way through a message into the caller's memory: cut every incoming
  // connection (this link is broken anyway) so that the reader lets go of it.
  {
    absl::MutexLock lock(&readers_mu_);
    for (int fd : reader_fds_) shutdown(fd, SHUT_RDWR);
  }
  return inbox_.Unpost(peer, tag, absl::InfiniteFuture());
}

absl::Status TcpPeerLink::Explain(absl::Status s) const {
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", options_.rank, ": ", s.message(), " within ", absl::FormatDuration(options_.timeout)));
  }
  return s;
}

}  // namespace dptrain
