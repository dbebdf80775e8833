// The ring all-reduce over real TCP links (loopback) broken on purpose by FaultyLink: the
// statuses the in-memory tests assert (common/faulty_link_test) hold over TcpPeerLink too,
// where an expected message is written in place by the link's reader thread.
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/faulty_link.h"
#include "common/rank_threads.h"
#include "common/ring_allreduce.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_peer_link.h"

namespace dptrain {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(1);

// An all-reduce of 3 ranks over loopback TCP, rank r's link wrapped with plans[r]. Returns the
// statuses; fails the test if it took longer than `limit` (aborts it 5 s later: a hang).
std::vector<absl::Status> AllReduceOverTcp(std::vector<std::vector<LinkFault>> plans,
                                           absl::Duration limit) {
  constexpr int kWorld = 3;
  plans.resize(kWorld);
  TcpPeerLinkOptions o;
  o.timeout = kTimeout;
  o.log = [](absl::string_view) {};
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int r = 0; r < kWorld; ++r) {
    auto l = TcpListener::Listen(0, "127.0.0.1");
    EXPECT_TRUE(l.ok()) << l.status();
    o.addresses.push_back(absl::StrCat("127.0.0.1:", (*l)->port()));
    listeners.push_back(*std::move(l));
  }
  std::vector<std::unique_ptr<TcpPeerLink>> tcp;
  std::vector<std::unique_ptr<FaultyLink>> links;
  for (int r = 0; r < kWorld; ++r) {
    o.rank = r;
    auto link = TcpPeerLink::Create(o, std::move(listeners[r]));
    EXPECT_TRUE(link.ok()) << link.status();
    tcp.push_back(*std::move(link));
    links.push_back(std::make_unique<FaultyLink>(*tcp.back(), plans[r]));
  }
  std::vector<std::vector<float>> data(kWorld);
  for (int r = 0; r < kWorld; ++r) data[r] = RandomFloats(3 + r, 300);
  absl::Duration elapsed;
  std::vector<absl::Status> statuses = RunRanks(
      kWorld, limit + absl::Seconds(5),
      [&](int r) { return RingAllReduce(*links[r], absl::MakeSpan(data[r]), {}); }, &elapsed);
  EXPECT_LT(elapsed, limit);
  return statuses;
}

TEST(FaultyTcpLinkTest, TruncatedMessageIsInvalidArgumentNamingTheSender) {
  // Rank 0's first message to rank 1 (100 floats, expected in place) arrives with 3.
  auto s = AllReduceOverTcp({{LinkFault::Truncate(1, 3, 0)}}, 3 * kTimeout + absl::Seconds(2));
  EXPECT_TRUE(absl::IsInvalidArgument(s[1])) << s[1];
  EXPECT_TRUE(absl::StrContains(s[1].message(), "message from rank 0 has 12 bytes, expected 400"))
      << s[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[2])) << s[2];
}

TEST(FaultyTcpLinkTest, DroppedLastMessageTimesOutOnlyItsReceiver) {
  auto s = AllReduceOverTcp({{}, {}, {LinkFault::Drop(0, 3)}}, kTimeout + absl::Seconds(2));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
  EXPECT_TRUE(absl::StrContains(s[0].message(), "rank 0: timed out waiting for data from rank 2"))
      << s[0];
  EXPECT_TRUE(absl::StrContains(s[0].message(), "within 1s")) << s[0];
  EXPECT_TRUE(s[1].ok()) << s[1];
  EXPECT_TRUE(s[2].ok()) << s[2];
}

TEST(FaultyTcpLinkTest, FailedSendIsUnavailableNamingThePeer) {
  auto s = AllReduceOverTcp({{}, {LinkFault::FailSend(2, 0)}}, 3 * kTimeout + absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(s[1])) << s[1];
  EXPECT_TRUE(absl::StrContains(s[1].message(), "send to rank 2")) << s[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[2])) << s[2];
  EXPECT_TRUE(absl::StrContains(s[2].message(), "from rank 1")) << s[2];
}

}  // namespace
}  // namespace dptrain
