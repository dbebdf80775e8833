#include "worker/comm/tcp_peer_link.h"

#include <arpa/inet.h>
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
#include "common/job_token.h"
#include "worker/comm/ring_auth.h"
#include "worker/comm/ring_wire.h"

namespace dptrain {
namespace {

using ring_auth::Challenge;
using ring_auth::Hello;

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

// Whether `fd` has bytes to read (or its end) before `deadline`.
bool AwaitReadable(int fd, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd ready{fd, POLLIN, 0};
    const int polled =
        poll(&ready, 1,
             static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30)));
    if (polled > 0) return true;
    if (polled == 0 || errno != EINTR) return false;
  }
}

// Reads exactly n bytes before `deadline`: false on EOF, an error or the deadline.
bool ReadFullBy(int fd, void* buffer, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(buffer);
  size_t done = 0;
  while (done < n) {
    if (!AwaitReadable(fd, deadline)) return false;
    const ssize_t r = read(fd, p + done, n - done);
    if (r > 0) {
      done += static_cast<size_t>(r);
    } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
      return false;
    }
  }
  return true;
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

// An unexpected payload of n bytes (n within the link's bound). Up to kEagerBytes it is
// allocated at once; beyond, the buffer doubles only once the bytes so far have arrived,
// so a header alone never reserves more than kEagerBytes. nullopt if the stream broke.
constexpr size_t kEagerBytes = size_t{1} << 20;

std::optional<MessageBytes> ReadPayload(int fd, size_t n) {
  MessageBytes m = MessageBytes::Allocate(std::min(n, kEagerBytes));
  size_t have = 0;
  while (have < n) {
    if (have == m.size) {
      MessageBytes bigger = MessageBytes::Allocate(std::min(n, m.size * 2));
      std::memcpy(bigger.data.get(), m.data.get(), have);
      m = std::move(bigger);
    }
    if (ReadFull(fd, m.data.get() + have, m.size - have) != 1) return std::nullopt;
    have = m.size;
  }
  return m;
}

std::string PeerName(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  char text[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  }
  return absl::StrCat(text, ":", ntohs(addr.sin_port));
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

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(int port,
                                                                 const std::string& host) {
  in_addr bind_to{};
  if (inet_pton(AF_INET, host.c_str(), &bind_to) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bind address '", host, "' is not a numeric IPv4 address"));
  }
  std::unique_ptr<TcpListener> l(new TcpListener());
  l->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return Errno("socket");
  const int one = 1;
  setsockopt(l->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = bind_to;
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
    : options_(options),
      job_hash_(ring_auth::HashJob(options.job_id)),
      listener_(std::move(listener)) {
  for (size_t i = 0; i < options.addresses.size(); ++i) {
    outgoing_.push_back(std::make_unique<Outgoing>());
  }
  holder_.assign(options.addresses.size(), -1);
}

absl::StatusOr<std::unique_ptr<TcpPeerLink>> TcpPeerLink::Create(
    const TcpPeerLinkOptions& options, std::unique_ptr<TcpListener> listener) {
  const int n = static_cast<int>(options.addresses.size());
  if (n < 1 || options.rank < 0 || options.rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " not in [0, ", n, ")"));
  }
  if (options.max_message_bytes < 1 || options.max_pending_handshakes < 1 ||
      options.log == nullptr) {
    return absl::InvalidArgumentError(
        "max_message_bytes and max_pending_handshakes must be positive, and log set");
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
    if (pending_handshakes_.load() >= options_.max_pending_handshakes) {
      Log(PeerName(fd), absl::StrCat("refused: ", options_.max_pending_handshakes,
                                     " connections are already awaiting their handshake"));
      close(fd);
      continue;
    }
    ++pending_handshakes_;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    absl::MutexLock lock(&readers_mu_);
    reader_fds_.push_back(fd);
    readers_.emplace_back([this, fd] { ReadLoop(fd); });
  }
}

void TcpPeerLink::ReadLoop(int fd) {
  // Named now: once the peer closed (or reset, when a verdict met its closed socket) the
  // address is gone.
  const std::string peer = PeerName(fd);
  absl::StatusOr<int> from = Handshake(fd);
  --pending_handshakes_;
  if (!from.ok()) {  // A stranger: it never speaks for a rank.
    Log(peer, absl::StrCat("dropped: ", from.status().message()));
    CloseReader(fd);
    return;
  }
  // A real peer connects to send: its first frame follows the handshake at once. A connection
  // that claimed the rank and sends nothing (a stranger holding it against the real peer,
  // which meanwhile retries) gives it back after handshake_timeout.
  if (!AwaitReadable(fd, absl::Now() + options_.handshake_timeout)) {
    Log(peer, absl::StrCat("dropped: claimed rank ", *from, " but sent no frame within ",
                           absl::FormatDuration(options_.handshake_timeout)));
    {
      absl::MutexLock lock(&readers_mu_);
      holder_[*from] = -1;
    }
    CloseReader(fd);
    return;
  }
  bool delivered = false;
  const absl::Status end = ReadFrames(fd, *from, delivered);
  if (!delivered) {
    // It proved nothing: free the rank for the real peer, which may still connect.
    Log(peer, absl::StrCat("dropped: claimed rank ", *from, " but ended before any frame",
                           end.ok() ? "" : absl::StrCat(" (", end.message(), ")")));
    {
      absl::MutexLock lock(&readers_mu_);
      holder_[*from] = -1;
    }
    CloseReader(fd);
    return;
  }
  if (!end.ok()) Log(peer, absl::StrCat("rank ", *from, " dropped: ", end.message()));
  inbox_.MarkClosed(*from);  // Its one live connection ended: it will send nothing more.
  CloseReader(fd);
}

absl::StatusOr<int> TcpPeerLink::Handshake(int fd) {
  const absl::Time deadline = absl::Now() + options_.handshake_timeout;
  const std::string& token = options_.job_token;
  Challenge challenge{ring_auth::kChallengeMagic, static_cast<uint32_t>(options_.rank), {}};
  if (!token.empty()) {
    if (auto s = RandomBytes(absl::MakeSpan(challenge.nonce)); !s.ok()) return s;
    iovec iov{&challenge, sizeof(challenge)};
    if (!WriteFull(fd, &iov, 1)) return absl::UnavailableError("closed before the challenge");
  }
  char hello[kRingHelloBytes];
  if (!ReadFullBy(fd, hello, sizeof(hello), deadline)) {
    return absl::UnavailableError("closed or timed out before a whole hello");
  }
  // Every whole hello gets a verdict (best effort: the peer may be gone).
  auto refuse = [fd](ring_auth::VerdictCode code, absl::Status why) {
    const ring_auth::Verdict verdict{ring_auth::kVerdictMagic, static_cast<uint32_t>(code)};
    iovec iov{const_cast<ring_auth::Verdict*>(&verdict), sizeof(verdict)};
    (void)WriteFull(fd, &iov, 1);
    return why;
  };
  const absl::StatusOr<int> claimed = ParseRingHello(absl::string_view(hello, sizeof(hello)),
                                                     job_hash_, world_size(), !token.empty());
  if (!claimed.ok()) return refuse(ring_auth::VerdictCode::kRefused, claimed.status());
  const int rank = *claimed;
  ring_auth::Session session;
  if (!token.empty()) {
    session.job_id = options_.job_id;
    session.connector_rank = static_cast<uint32_t>(rank);
    session.acceptor_rank = static_cast<uint32_t>(options_.rank);
    session.acceptor_nonce = challenge.nonce;
    Digest proof;
    if (!ReadFullBy(fd, session.connector_nonce.data(), session.connector_nonce.size(), deadline) ||
        !ReadFullBy(fd, proof.data(), proof.size(), deadline)) {
      return refuse(
          ring_auth::VerdictCode::kRefused,
          absl::UnavailableError(absl::StrCat(
              "claimed rank ", rank, " but closed or timed out before its job-token proof")));
    }
    if (!DigestsEqual(proof, ring_auth::ConnectorProof(token, session))) {
      return refuse(ring_auth::VerdictCode::kRefused,
                    absl::UnauthenticatedError(
                        absl::StrCat("claimed rank ", rank, " with a wrong job-token proof")));
    }
  }
  {
    absl::MutexLock lock(&readers_mu_);
    if (holder_[rank] >= 0) {
      return refuse(ring_auth::VerdictCode::kRankBusy,
                    absl::AlreadyExistsError(absl::StrCat(
                        "claimed rank ", rank,
                        ", which is already connected (one live connection per rank)")));
    }
    holder_[rank] = fd;
  }
  const ring_auth::Verdict accepted{ring_auth::kVerdictMagic,
                                    static_cast<uint32_t>(ring_auth::VerdictCode::kAccepted)};
  Digest answer;
  iovec iov[2] = {{const_cast<ring_auth::Verdict*>(&accepted), sizeof(accepted)},
                  {answer.data(), answer.size()}};
  if (!token.empty()) answer = ring_auth::AcceptorProof(token, session);
  if (!WriteFull(fd, iov, token.empty() ? 1 : 2)) {
    absl::MutexLock lock(&readers_mu_);
    holder_[rank] = -1;
    return absl::UnavailableError(
        absl::StrCat("claimed rank ", rank, " but closed before this rank's answer"));
  }
  return rank;
}

absl::Status TcpPeerLink::ReadFrames(int fd, int from, bool& delivered) {
  std::vector<char> scratch(kAddPieceBytes);
  while (true) {
    char bytes[kRingFrameHeaderBytes];
    const int r = ReadFull(fd, bytes, sizeof(bytes));
    if (r == 0) return absl::OkStatus();
    if (r != 1) return absl::DataLossError("truncated frame header");
    const absl::StatusOr<RingFrameHeader> header =
        ParseRingFrameHeader(absl::string_view(bytes, sizeof(bytes)), options_.max_message_bytes);
    if (!header.ok()) return header.status();
    const uint64_t tag = header->tag, length = header->payload_bytes;
    if (std::optional<Posting> posting = inbox_.Claim(from, tag, length)) {
      const bool ok = ReadInto(fd, *posting, scratch);
      inbox_.Delivered(from, tag, ok);
      if (!ok) return absl::DataLossError("truncated frame");
    } else {
      std::optional<MessageBytes> payload = ReadPayload(fd, length);
      if (!payload.has_value()) return absl::DataLossError("truncated frame");
      if (auto s = inbox_.Deposit(from, tag, *std::move(payload)); !s.ok()) return s;
    }
    received_ += static_cast<int64_t>(sizeof(bytes) + length);
    delivered = true;
  }
}

void TcpPeerLink::CloseReader(int fd) {
  {
    absl::MutexLock lock(&readers_mu_);
    reader_fds_.erase(std::find(reader_fds_.begin(), reader_fds_.end(), fd));
  }
  close(fd);
}

void TcpPeerLink::Log(absl::string_view peer, absl::string_view what) const {
  options_.log(
      absl::StrCat("tcp link rank ", options_.rank, ": connection from ", peer, " ", what));
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
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Status result;
  while (true) {
    int fd = -1;
    while (true) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
      if (fd >= 0) close(fd);
      fd = -1;
      if (absl::Now() > deadline) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (fd < 0) {
      result = Errno(absl::StrCat("cannot connect to rank ", peer, " at ", address));
      break;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bool busy = false;
    result = ConnectorHandshake(fd, peer, busy);
    if (result.ok()) {
      out.fd = fd;
      break;
    }
    close(fd);
    // Another connection holds this rank at the peer: a stranger that claimed it first (it
    // gives it back when it delivers no frame), or our own earlier one still closing.
    if (!busy || absl::Now() + backoff > deadline) break;
    options_.log(
        absl::StrCat("tcp link rank ", options_.rank, ": ", result.message(), "; trying again"));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  freeaddrinfo(found);
  return result;
}

absl::Status TcpPeerLink::ReadVerdict(int fd, int peer, absl::Time deadline, bool& busy) const {
  const std::string& address = options_.addresses[peer];
  const bool keyed = !options_.job_token.empty();
  ring_auth::Verdict verdict;
  if (!ReadFullBy(fd, &verdict, sizeof(verdict), deadline)) {
    return keyed ? absl::UnauthenticatedError(
                       absl::StrCat("rank ", peer, " at ", address,
                                    " refused this rank's job-token proof or closed (a different "
                                    "--job_token_file? its log says why)"))
                 : absl::UnavailableError(absl::StrCat(
                       "rank ", peer, " at ", address,
                       " closed the connection or did not answer this rank's hello within ",
                       absl::FormatDuration(options_.handshake_timeout), " (its log says why)"));
  }
  if (!keyed && verdict.magic == ring_auth::kChallengeMagic) {
    return absl::UnauthenticatedError(
        absl::StrCat("rank ", peer, " at ", address,
                     " runs with a job token (--job_token_file) and this rank without one"));
  }
  if (verdict.magic != ring_auth::kVerdictMagic) {
    return absl::UnauthenticatedError(
        absl::StrCat("the process at ", address, " is not rank ", peer, " of this ring"));
  }
  switch (static_cast<ring_auth::VerdictCode>(verdict.code)) {
    case ring_auth::VerdictCode::kAccepted:
      return absl::OkStatus();
    case ring_auth::VerdictCode::kRankBusy:
      busy = true;
      return absl::UnavailableError(
          absl::StrCat("rank ", peer, " at ", address, " already has a connection claiming rank ",
                       options_.rank, " (a stranger's, or an earlier one of this rank)"));
    case ring_auth::VerdictCode::kRefused:
      return keyed ? absl::UnauthenticatedError(absl::StrCat(
                         "rank ", peer, " at ", address,
                         " refused this rank's job-token proof (a different --job_token_file? "
                         "its log says why)"))
                   : absl::FailedPreconditionError(absl::StrCat(
                         "rank ", peer, " at ", address,
                         " refused this rank's hello (another --job_id or world size? its log "
                         "says why)"));
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "rank ", peer, " at ", address, " answered with an unknown verdict ", verdict.code));
}

absl::Status TcpPeerLink::ConnectorHandshake(int fd, int peer, bool& busy) {
  const std::string& token = options_.job_token;
  const std::string& address = options_.addresses[peer];
  const absl::Time deadline = absl::Now() + options_.handshake_timeout;
  Hello hello{token.empty() ? ring_auth::kPlainMagic : ring_auth::kKeyedMagic,
              static_cast<uint32_t>(options_.rank), job_hash_};
  ring_auth::Session session;
  iovec iov[2] = {{&hello, sizeof(hello)},
                  {session.connector_nonce.data(), session.connector_nonce.size()}};
  if (token.empty()) {
    if (!WriteFull(fd, iov, 1)) return Errno(absl::StrCat("hello to rank ", peer));
    return ReadVerdict(fd, peer, deadline, busy);
  }
  if (auto s = RandomBytes(absl::MakeSpan(session.connector_nonce)); !s.ok()) return s;
  if (!WriteFull(fd, iov, 2)) return Errno(absl::StrCat("hello to rank ", peer));
  Challenge challenge;
  if (!ReadFullBy(fd, &challenge, sizeof(challenge), deadline)) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", peer, " at ", address,
        " closed the connection or sent no job-token challenge "
        "within ",
        absl::FormatDuration(options_.handshake_timeout),
        " (does it run without --job_token_file? its log says why it dropped the connection)"));
  }
  if (challenge.magic != ring_auth::kChallengeMagic ||
      challenge.rank != static_cast<uint32_t>(peer)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the process at ", address, " is not rank ", peer, " of this ring"));
  }
  session.job_id = options_.job_id;
  session.connector_rank = static_cast<uint32_t>(options_.rank);
  session.acceptor_rank = static_cast<uint32_t>(peer);
  session.acceptor_nonce = challenge.nonce;
  Digest proof = ring_auth::ConnectorProof(token, session);
  iovec proof_iov{proof.data(), proof.size()};
  if (!WriteFull(fd, &proof_iov, 1)) return Errno(absl::StrCat("proof to rank ", peer));
  if (auto s = ReadVerdict(fd, peer, deadline, busy); !s.ok()) return s;
  Digest answer;
  if (!ReadFullBy(fd, answer.data(), answer.size(), deadline) ||
      !DigestsEqual(answer, ring_auth::AcceptorProof(token, session))) {
    return absl::UnauthenticatedError(absl::StrCat("the process at ", address,
                                                   " failed the job-token check as rank ", peer,
                                                   ": nothing was sent to it"));
  }
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
  char header[kRingFrameHeaderBytes];
  EncodeRingFrameHeader({tag, data.size() * sizeof(float)}, header);
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

absl::Status TcpPeerLink::RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) {
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
    return absl::DeadlineExceededError(absl::StrCat("rank ", options_.rank, ": ", s.message(),
                                                    " within ",
                                                    absl::FormatDuration(options_.timeout)));
  }
  return s;
}

}  // namespace dptrain
