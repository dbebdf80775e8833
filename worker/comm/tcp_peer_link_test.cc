// The TCP link over loopback: the ring all-reduce gives the same bits as over the in-memory
// link (so in-place delivery of expected messages changes nothing), and an expectation that
// is withdrawn, mismatched or never met never writes into the caller's memory.
#include "worker/comm/tcp_peer_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/captured_log.h"
#include "common/in_memory_link.h"
#include "common/ring_allreduce.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Links of ranks 0..n-1 over loopback; `ports`, if set, receives each rank's listening port.
std::vector<std::unique_ptr<TcpPeerLink>> MakeLinks(int n, absl::Duration timeout,
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

std::vector<float> Input(int rank, int64_t n) {
  std::mt19937 gen(7 + rank);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// The ring all-reduce of Input(r, size) over `links`, checked bit for bit against the same
// collective over the in-memory link.
void ExpectCleanAllReduce(std::vector<std::unique_ptr<TcpPeerLink>>& links, int64_t size,
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

TEST(TcpPeerLinkTest, RingAllReduceMatchesTheInMemoryLinkBitForBit) {
  for (int n : {2, 3, 4}) {
    for (int64_t size : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      SCOPED_TRACE(absl::StrCat("n ", n, " size ", size));
      RingOptions o;
      o.chunk_elements = 997;  // Many chunks, none aligned with the segments.
      o.tag_base = 5;
      auto links = MakeLinks(n, absl::Seconds(20));
      ExpectCleanAllReduce(links, size, o);
    }
  }
}

TEST(TcpPeerLinkTest, BroadcastDeliversRootsData) {
  const int n = 3;
  auto links = MakeLinks(n, absl::Seconds(20));
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) data[r] = Input(r, 5000);
  RingOptions o;
  o.chunk_elements = 333;
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { status[r] = RingBroadcast(*links[r], absl::MakeSpan(data[r]), 1, o); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(data[r], data[1]);
  }
}

TEST(TcpPeerLinkTest, ExpectedMessagesLandInPlaceOrNotAtAll) {
  auto links = MakeLinks(2, absl::Seconds(2));
  TcpPeerLink& a = *links[0];
  TcpPeerLink& b = *links[1];
  const std::vector<float> message = {1, 2, 3, 4};

  // Expected with add and scale: dest = (dest + message) * 0.5.
  std::vector<float> dest = {1, 1, 1, 1};
  a.Expect(1, 10, {absl::MakeSpan(dest), /*add=*/true, 0.5f});
  ASSERT_TRUE(b.Send(0, 10, message).ok());
  ASSERT_TRUE(a.RecvAdd(1, 10, absl::MakeSpan(dest), 0.5f).ok());
  EXPECT_EQ(dest, (std::vector<float>{1, 1.5f, 2, 2.5f}));

  // Withdrawn before it arrives: the memory is untouched; the message waits in the mailbox.
  std::vector<float> withdrawn = {9, 9, 9, 9};
  a.Expect(1, 11, {absl::MakeSpan(withdrawn), false, 1.0f});
  EXPECT_TRUE(a.Unexpect(1, 11));
  ASSERT_TRUE(b.Send(0, 11, message).ok());
  std::vector<float> later(4);
  ASSERT_TRUE(a.Recv(1, 11, absl::MakeSpan(later)).ok());
  EXPECT_EQ(later, message);
  EXPECT_EQ(withdrawn, (std::vector<float>{9, 9, 9, 9}));

  // Expected with another size: not written in place; Recv reports the mismatch.
  std::vector<float> small = {7, 7};
  a.Expect(1, 12, {absl::MakeSpan(small), false, 1.0f});
  ASSERT_TRUE(b.Send(0, 12, message).ok());
  EXPECT_EQ(a.Recv(1, 12, absl::MakeSpan(small)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(small, (std::vector<float>{7, 7}));

  // Never sent: the Recv times out naming the rank, and the expectation can be withdrawn.
  std::vector<float> never(4, 0.0f);
  a.Expect(1, 13, {absl::MakeSpan(never), false, 1.0f});
  absl::Status s = a.Recv(1, 13, absl::MakeSpan(never));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_TRUE(a.Unexpect(1, 13));
}

// A collective that fails (a rank never takes part) withdraws what it expected: a message
// arriving after it returned goes to the mailbox, not into the caller's buffer.
TEST(TcpPeerLinkTest, FailedCollectiveLeavesNoExpectationBehind) {
  auto links = MakeLinks(2, absl::Milliseconds(300));
  RingOptions o;
  o.chunk_elements = 4;
  std::vector<float> data(8, 1.0f);
  EXPECT_FALSE(RingAllReduce(*links[0], absl::MakeSpan(data), o).ok());  // Rank 1 is silent.
  const std::vector<float> after = data;
  // Rank 1 now sends what rank 0 expected in the reduce-scatter (segment 1 = elements 4..7).
  const std::vector<float> late(4, 100.0f);
  ASSERT_TRUE(links[1]->Send(0, /*tag of step 0, chunk 0*/ 0, late).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(data, after);
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
  // A hello as TcpPeerLink writes it (job "dptrain" unless told).
  void Hello(uint32_t rank, const std::string& job = "dptrain") {
    uint64_t h = 14695981039346656037ull;  // FNV-1a, as the link hashes the job id.
    for (unsigned char c : job) h = (h ^ c) * 1099511628211ull;
    struct {
      uint32_t magic, rank;
      uint64_t job;
    } hello{0x44505452, rank, h};
    Send(&hello, sizeof(hello));
  }
  void Frame(uint64_t tag, const std::vector<float>& payload) {
    const uint64_t header[2] = {tag, payload.size() * sizeof(float)};
    Send(header, sizeof(header));
    if (!payload.empty()) Send(payload.data(), payload.size() * sizeof(float));
  }
  // Whether the link closed this connection within a bounded wait: EOF, or a reset when
  // it closed with our bytes unread.
  bool ClosedByLink() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 20000) != 1) return false;
    char byte;
    const ssize_t r = recv(fd_, &byte, 1, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
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

constexpr char kRefusedSecondClaim[] =
    "claimed rank 2, which is already connected (one live connection per rank)";

// Review items 2 and 3: once the real peers are connected, a stranger that claims a
// connected rank (and then closes, sends a truncated frame, or sends a frame with exactly
// the tag the next all-reduce expects) is refused at its hello and logged; strangers with a
// wrong or partial hello are logged and dropped. None marks a real peer dead or gets a byte
// merged: the all-reduce is bit-identical to the clean run.
TEST(TcpPeerLinkTrustTest, StrangersAndSecondClaimsNeverTouchTheRing) {
  LoggedLinks ring(3, TcpPeerLinkOptions());
  auto& [log, ports, links] = ring;
  RingOptions o;
  o.chunk_elements = 64;
  o.tag_base = 1;
  ExpectCleanAllReduce(links, 1000, o);  // Every rank is now connected to its right.

  // Rank 0's left neighbour is rank 2: the strangers claim it.
  o.tag_base = 2;
  const uint64_t first_tag = o.tag_base << 40;  // Reduce-scatter, stage 0, chunk 0.
  std::vector<std::unique_ptr<RawPeer>> strangers;
  for (int kind = 0; kind < 5; ++kind) {
    auto p = std::make_unique<RawPeer>(ports[0]);
    switch (kind) {
      case 0:  // Claims rank 2, then closes.
        p->Hello(2);
        p->Close();
        break;
      case 1: {  // Claims rank 2, then a truncated frame header.
        p->Hello(2);
        const uint64_t half = first_tag;
        p->Send(&half, sizeof(half));
        p->Close();
        break;
      }
      case 2:  // Claims rank 2 and sends the frame the all-reduce expects, full of garbage.
        p->Hello(2);
        p->Frame(first_tag, std::vector<float>(o.chunk_elements, 1e30f));
        break;
      case 3:  // Another job's hello.
        p->Hello(2, "some other job");
        break;
      case 4: {  // Half a hello, then gone.
        const uint32_t magic = 0x44505452;
        p->Send(&magic, sizeof(magic));
        p->Close();
        break;
      }
    }
    strangers.push_back(std::move(p));
  }
  ASSERT_TRUE(log.WaitFor(kRefusedSecondClaim, 3));
  ASSERT_TRUE(log.WaitFor("dropped: not a hello of this job"));
  ASSERT_TRUE(log.WaitFor("dropped: closed or timed out before a whole hello"));
  EXPECT_TRUE(strangers[2]->ClosedByLink());
  EXPECT_TRUE(log.Count("tcp link rank 0: connection from 127.0.0.1:") == 5) << log.Count("");
  ExpectCleanAllReduce(links, 1000, o);
}

// Review item 4: a frame header is bounded by max_message_bytes before anything is
// allocated. From a connection that delivered nothing yet (a stranger that claimed a free
// rank) it is dropped without marking the rank dead, so the real peer still connects; from
// the rank's live connection (a hostile or broken peer) the rank is closed: its Recv fails
// at once instead of waiting.
TEST(TcpPeerLinkTrustTest, OversizedFramesAreRefusedBeforeAllocation) {
  TcpPeerLinkOptions options;
  options.max_message_bytes = 4096;
  LoggedLinks pair(2, options);
  auto& [log, ports, links] = pair;
  {
    RawPeer stranger(ports[0]);
    stranger.Hello(1);
    const uint64_t header[2] = {7, uint64_t{2} << 30};  // Declares 2 GiB.
    stranger.Send(header, sizeof(header));
    EXPECT_TRUE(stranger.ClosedByLink());
  }
  ASSERT_TRUE(log.WaitFor(
      "dropped: claimed rank 1 but ended before any frame (a frame declares 2147483648 bytes, "
      "more than the 4096 allowed)"));
  // The real rank 1 connects and is heard.
  const std::vector<float> message = {1, 2, 3};
  ASSERT_TRUE(links[1]->Send(0, 7, message).ok());
  std::vector<float> got(3);
  ASSERT_TRUE(links[0]->Recv(1, 7, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, message);

  // The same from rank 1 of a fresh pair, after a frame went through.
  LoggedLinks fresh(2, options);
  RawPeer hostile(fresh.ports[0]);
  hostile.Hello(1);
  hostile.Frame(7, message);
  const uint64_t header[2] = {8, uint64_t{2} << 30};
  hostile.Send(header, sizeof(header));
  EXPECT_TRUE(hostile.ClosedByLink());
  ASSERT_TRUE(fresh.log.WaitFor(
      "rank 1 dropped: a frame declares 2147483648 bytes, more than the 4096 allowed"));
  ASSERT_TRUE(fresh.links[0]->Recv(1, 7, absl::MakeSpan(got)).ok());
  EXPECT_EQ(fresh.links[0]->Recv(1, 8, absl::MakeSpan(got)).code(), absl::StatusCode::kUnavailable);
}

// Review item 4: connections that never say hello are bounded in number (and in time).
TEST(TcpPeerLinkTrustTest, PendingHandshakesAreBounded) {
  TcpPeerLinkOptions options;
  options.max_pending_handshakes = 2;
  LoggedLinks pair(2, options);
  auto& [log, ports, links] = pair;
  RawPeer silent1(ports[0]), silent2(ports[0]), third(ports[0]);
  EXPECT_TRUE(third.ClosedByLink());
  ASSERT_TRUE(log.WaitFor("refused: 2 connections are already awaiting their handshake"));
  silent1.Close();
  silent2.Close();
  ASSERT_TRUE(log.WaitFor("dropped: closed or timed out before a whole hello", 2));
  // The real peer gets in once the silent ones are gone.
  const std::vector<float> message = {4, 5};
  ASSERT_TRUE(links[1]->Send(0, 3, message).ok());
  std::vector<float> got(2);
  ASSERT_TRUE(links[0]->Recv(1, 3, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, message);

  // A silent connection is dropped after handshake_timeout.
  options.handshake_timeout = absl::Milliseconds(100);
  LoggedLinks fresh(2, options);
  RawPeer silent(fresh.ports[0]);
  EXPECT_TRUE(silent.ClosedByLink());
  EXPECT_TRUE(fresh.log.WaitFor("dropped: closed or timed out before a whole hello"));
}

// --bind_address: a listener bound to loopback reports that address; anything but a
// numeric IPv4 address is refused with a clear error, not bound to every interface.
TEST(TcpListenerTest, BindsWhereToldAndRefusesBadAddresses) {
  auto l = TcpListener::Listen(0, "127.0.0.1");
  ASSERT_TRUE(l.ok()) << l.status();
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname((*l)->fd(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  EXPECT_EQ(ntohl(addr.sin_addr.s_addr), INADDR_LOOPBACK);
  EXPECT_GT((*l)->port(), 0);
  for (const char* bad : {"localhost", "300.1.1.1", ""}) {
    auto refused = TcpListener::Listen(0, bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace dptrain
