// The TCP link over loopback: the ring all-reduce gives the same bits as over the in-memory
// link (so in-place delivery of expected messages changes nothing), and an expectation that
// is withdrawn, mismatched or never met never writes into the caller's memory.
#include "worker/comm/tcp_peer_link.h"

#include "absl/strings/match.h"
#include "worker/comm/tcp_peer_link_testing.h"

namespace dptrain {
namespace {

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

// --- Strangers, broken peers and hostile peers (RawPeer: tcp_peer_link_testing.h). ---

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
        p->SendAnyway(&half, sizeof(half));  // The link may have dropped it already.
        p->Close();
        break;
      }
      case 2:  // Claims rank 2 and sends the frame the all-reduce expects, full of garbage.
        p->Hello(2);
        p->Frame(first_tag, std::vector<float>(o.chunk_elements, 1e30f), /*dropped=*/true);
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

// Issue 30 item 3: in plaintext a stranger claims rank 1 before the real rank 1 arrives and
// holds the claim until the real one connects, then closes. Rank 0 refuses the real rank 1
// while the claim stands; the real one hears that its rank is busy (every hello gets an
// answer), retries, and gets in once the stranger is gone: the job finishes with the clean
// run's result. A stranger that holds the claim and sends nothing gives it back after
// handshake_timeout.
TEST(TcpPeerLinkTrustTest, AStrangerHoldingAFreeRankCannotStallThePlainRing) {
  TcpPeerLinkOptions options;
  options.handshake_timeout = absl::Seconds(2);
  LoggedLinks pair(2, options);
  auto& [log, ports, links] = pair;
  auto stranger = std::make_unique<RawPeer>(ports[0]);
  stranger->Hello(1);
  ASSERT_EQ(stranger->PlainVerdict(), 0);  // Accepted: rank 1 was free.
  RingOptions o;
  o.chunk_elements = 64;
  o.tag_base = 1;
  std::thread closer([&] {
    // Once rank 0 refused the real rank 1, the stranger lets go.
    EXPECT_TRUE(log.WaitFor("claimed rank 1, which is already connected"));
    stranger->Close();
  });
  ExpectCleanAllReduce(links, 1000, o);
  closer.join();
  EXPECT_TRUE(log.WaitFor("already has a connection claiming rank 1"));
  EXPECT_TRUE(log.WaitFor("; trying again"));

  // The same stranger that never lets go: it is dropped after handshake_timeout, and the
  // real peer's retries get in.
  LoggedLinks fresh(2, options);
  RawPeer holder(fresh.ports[0]);
  holder.Hello(1);
  ASSERT_EQ(holder.PlainVerdict(), 0);
  ExpectCleanAllReduce(fresh.links, 1000, o);
  EXPECT_TRUE(fresh.log.WaitFor("dropped: claimed rank 1 but sent no frame within 2s"));
  EXPECT_TRUE(holder.ClosedByLink());

  // A hello of another job is answered with a refusal, not silence.
  RawPeer other(fresh.ports[0]);
  other.Hello(1, "some other job");
  EXPECT_EQ(other.PlainVerdict(), static_cast<int>(ring_auth::VerdictCode::kRefused));
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
