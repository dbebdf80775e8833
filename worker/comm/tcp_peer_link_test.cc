// The TCP link over loopback: the ring all-reduce gives the same bits as over the in-memory
// link (so in-place delivery of expected messages changes nothing), and an expectation that
// is withdrawn, mismatched or never met never writes into the caller's memory.
#include "worker/comm/tcp_peer_link.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/in_memory_link.h"
#include "common/ring_allreduce.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

std::vector<std::unique_ptr<TcpPeerLink>> MakeLinks(int n, absl::Duration timeout) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  TcpPeerLinkOptions o;
  o.timeout = timeout;
  for (int r = 0; r < n; ++r) {
    auto l = TcpListener::Listen(0);
    EXPECT_TRUE(l.ok()) << l.status();
    o.addresses.push_back(absl::StrCat("127.0.0.1:", (*l)->port()));
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

TEST(TcpPeerLinkTest, RingAllReduceMatchesTheInMemoryLinkBitForBit) {
  for (int n : {2, 3, 4}) {
    for (int64_t size : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      RingOptions o;
      o.chunk_elements = 997;  // Many chunks, none aligned with the segments.
      o.tag_base = 5;
      std::vector<std::vector<float>> tcp(n), memory(n);
      for (int r = 0; r < n; ++r) tcp[r] = memory[r] = Input(r, size);
      auto links = MakeLinks(n, absl::Seconds(20));
      InMemoryHub hub(n, absl::Seconds(20));
      std::vector<absl::Status> tcp_status(n), memory_status(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        threads.emplace_back(
            [&, r] { tcp_status[r] = RingAllReduce(*links[r], absl::MakeSpan(tcp[r]), o); });
        threads.emplace_back([&, r] {
          memory_status[r] = RingAllReduce(hub.link(r), absl::MakeSpan(memory[r]), o);
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(tcp_status[r].ok()) << tcp_status[r];
        ASSERT_TRUE(memory_status[r].ok()) << memory_status[r];
        EXPECT_EQ(tcp[r], memory[0]) << "n " << n << " size " << size << " rank " << r;
      }
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

}  // namespace
}  // namespace dptrain
