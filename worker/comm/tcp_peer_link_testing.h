// For the TCP link's tests (tcp_peer_link_test, ring_auth_test): links over loopback, the
// clean all-reduce they are compared against, and a raw peer that speaks the wire format by
// hand (a stranger, a broken or a hostile peer).
#ifndef DPTRAIN_WORKER_COMM_TCP_PEER_LINK_TESTING_H_
#define DPTRAIN_WORKER_COMM_TCP_PEER_LINK_TESTING_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/captured_log.h"
#include "common/in_memory_link.h"
#include "common/ring_allreduce.h"
#include "gtest/gtest.h"
#include "worker/comm/ring_auth.h"
#include "worker/comm/tcp_peer_link.h"

namespace dptrain {

// Links of ranks 0..n-1 over loopback; `ports`, if set, receives each rank's listening port.
inline std::vector<std::unique_ptr<TcpPeerLink>> MakeLinks(int n, absl::Duration timeout,
                                                           TcpPeerLinkOptions o = {},
                                                           std::vector<int>* ports = nullptr) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  o.timeout = timeout;
  for (int r = 0; r < n; ++r) {
    auto l = TcpListener::Listen(0, "127.0.0.1");
    EXPECT_TRUE(l.ok()) << l.status();
    o.addresses.push_back(absl::StrCat("127.0.0.1:", (*l)->port()));
    if (ports != nullptr) ports->push_back((*l)->port());
    listeners.push_back(*std::move(l));
  }
  std::vector<std::unique_ptr<TcpPeerLink>> links;
  for (int r = 0; r < n; ++r) {
    o.rank = r;
    auto link = TcpPeerLink::Create(o, std::move(listeners[r]));
    EXPECT_TRUE(link.ok()) << link.status();
    links.push_back(*std::move(link));
  }
  return links;
}

inline std::vector<float> Input(int rank, int64_t n) {
  std::mt19937 gen(7 + rank);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// The ring all-reduce of Input(r, size) over `links`, checked bit for bit against the same
// collective over the in-memory link.
inline void ExpectCleanAllReduce(std::vector<std::unique_ptr<TcpPeerLink>>& links, int64_t size,
                                 const RingOptions& o) {
  const int n = static_cast<int>(links.size());
  std::vector<std::vector<float>> tcp(n), memory(n);
  for (int r = 0; r < n; ++r) tcp[r] = memory[r] = Input(r, size);
  InMemoryHub hub(n, absl::Seconds(20));
  std::vector<absl::Status> tcp_status(n), memory_status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { tcp_status[r] = RingAllReduce(*links[r], absl::MakeSpan(tcp[r]), o); });
    threads.emplace_back(
        [&, r] { memory_status[r] = RingAllReduce(hub.link(r), absl::MakeSpan(memory[r]), o); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(tcp_status[r].ok()) << tcp_status[r];
    ASSERT_TRUE(memory_status[r].ok()) << memory_status[r];
    EXPECT_EQ(std::memcmp(tcp[r].data(), memory[0].data(), size * sizeof(float)), 0) << r;
  }
}

// --- Strangers, broken peers and hostile peers, with raw sockets. ---

// A raw TCP connection to 127.0.0.1:port that speaks the link's wire format by hand.
class RawPeer {
 public:
  explicit RawPeer(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawPeer() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  void Send(const void* data, size_t n) {
    EXPECT_EQ(send(fd_, data, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }
  // The same, to a link that may already have dropped this connection.
  void SendAnyway(const void* data, size_t n) { (void)send(fd_, data, n, MSG_NOSIGNAL); }
  // A plain hello as TcpPeerLink writes it without a token (job "dptrain" unless told).
  void Hello(uint32_t rank, const std::string& job = "dptrain") {
    const ring_auth::Hello hello{ring_auth::kPlainMagic, rank, ring_auth::HashJob(job)};
    Send(&hello, sizeof(hello));
  }
  // Exactly n bytes within 20 s, else false.
  bool Receive(void* data, size_t n) {
    char* p = static_cast<char*>(data);
    for (size_t done = 0; done < n;) {
      pollfd ready{fd_, POLLIN, 0};
      if (poll(&ready, 1, 20000) != 1) return false;
      const ssize_t r = recv(fd_, p + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }
  // The connector's side of the keyed handshake (ring_auth.h) with `token`, claiming `rank`
  // of the link whose rank is `acceptor`: whether the link answered with a valid proof.
  bool KeyedHello(uint32_t rank, uint32_t acceptor, const std::string& token,
                  const std::string& job = "dptrain") {
    ring_auth::Challenge challenge;
    if (!Receive(&challenge, sizeof(challenge))) return false;
    ring_auth::Session session{job, rank, acceptor, challenge.nonce, {}};
    session.connector_nonce.fill(7);
    const ring_auth::Hello hello{ring_auth::kKeyedMagic, rank, ring_auth::HashJob(job)};
    // The link may drop the connection at the hello already (another job).
    SendAnyway(&hello, sizeof(hello));
    SendAnyway(session.connector_nonce.data(), session.connector_nonce.size());
    const Digest proof = ring_auth::ConnectorProof(token, session);
    SendAnyway(proof.data(), proof.size());
    ring_auth::Verdict verdict;
    if (!Receive(&verdict, sizeof(verdict)) || verdict.magic != ring_auth::kVerdictMagic ||
        verdict.code != static_cast<uint32_t>(ring_auth::VerdictCode::kAccepted)) {
      return false;
    }
    Digest answer;
    return Receive(answer.data(), answer.size()) &&
           DigestsEqual(answer, ring_auth::AcceptorProof(token, session));
  }
  // The link's verdict on a plain hello (ring_auth.h), or -1 if none came.
  int PlainVerdict() {
    ring_auth::Verdict verdict;
    if (!Receive(&verdict, sizeof(verdict)) || verdict.magic != ring_auth::kVerdictMagic) {
      return -1;
    }
    return static_cast<int>(verdict.code);
  }
  // `dropped`: the link may already have dropped this connection (no send is checked).
  void Frame(uint64_t tag, const std::vector<float>& payload, bool dropped = false) {
    const uint64_t header[2] = {tag, payload.size() * sizeof(float)};
    const size_t bytes = payload.size() * sizeof(float);
    if (dropped) {
      SendAnyway(header, sizeof(header));
      if (bytes > 0) SendAnyway(payload.data(), bytes);
      return;
    }
    Send(header, sizeof(header));
    if (bytes > 0) Send(payload.data(), bytes);
  }
  // Whether the link closed this connection within a bounded wait (20 s): EOF, or a reset
  // when it closed with our bytes unread. What the link wrote before (a challenge) is
  // skipped.
  bool ClosedByLink() {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (absl::Now() < give_up) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 1000) != 1) continue;
      char bytes[256];
      const ssize_t r = recv(fd_, bytes, sizeof(bytes), 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
      if (r < 0) return false;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

// Links of n ranks whose log lines are captured.
struct LoggedLinks {
  LoggedLinks(int n, TcpPeerLinkOptions options) {
    options.log = log.sink();
    links = MakeLinks(n, absl::Seconds(20), options, &ports);
  }
  CapturedLog log;
  std::vector<int> ports;
  std::vector<std::unique_ptr<TcpPeerLink>> links;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_TCP_PEER_LINK_TESTING_H_
