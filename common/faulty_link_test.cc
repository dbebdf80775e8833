// The ring collectives over links that fail on purpose (FaultyLink over the in-memory hub):
// each fault ends every rank with a precise Status naming the rank at fault, within the
// link's timeout, and faults that only slow messages down change no bit of the result.
// Every test is bounded: RunRanks (common/rank_threads.h) aborts the test binary if a rank
// has not returned within its limit, so a hang fails loudly.
#include "common/faulty_link.h"

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/in_memory_link.h"
#include "common/rank_threads.h"
#include "common/ring_allreduce.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

constexpr absl::Duration kTimeout = absl::Milliseconds(400);  // Of every Recv.

std::vector<float> Input(int rank, int64_t n) { return RandomFloats(500 + rank, n); }

// world_size ranks over one in-memory hub, rank r's link wrapped in a FaultyLink with
// plans[r] (none: no fault).
struct Ring {
  Ring(int world_size, std::vector<std::vector<LinkFault>> plans, absl::Duration timeout = kTimeout)
      : hub(world_size, timeout) {
    plans.resize(world_size);
    for (int r = 0; r < world_size; ++r) {
      links.push_back(std::make_unique<FaultyLink>(hub.link(r), std::move(plans[r])));
    }
  }
  InMemoryHub hub;
  std::vector<std::unique_ptr<FaultyLink>> links;
};

// The statuses of a ring all-reduce of Input(r, n) over `ring` (in `data`, if set).
std::vector<absl::Status> AllReduce(Ring& ring, int64_t n, const RingOptions& o,
                                    absl::Duration* elapsed = nullptr,
                                    std::vector<std::vector<float>>* data = nullptr) {
  const int world = static_cast<int>(ring.links.size());
  std::vector<std::vector<float>> local(world);
  if (data == nullptr) data = &local;
  data->resize(world);
  for (int r = 0; r < world; ++r) (*data)[r] = Input(r, n);
  return RunRanks(
      world, 4 * kTimeout + absl::Seconds(5),
      [&](int r) { return RingAllReduce(*ring.links[r], absl::MakeSpan((*data)[r]), o); }, elapsed);
}

bool Says(const absl::Status& s, absl::string_view text) {
  return absl::StrContains(s.message(), text);
}

TEST(FaultyLinkTest, FailedSendIsUnavailableNamingThePeerAndTheOthersTimeOutNamingTheirs) {
  // Rank 1's first send to rank 2 fails, as on a reset connection.
  Ring ring(3, {{}, {LinkFault::FailSend(2, 0)}});
  absl::Duration elapsed;
  auto s = AllReduce(ring, 30, {}, &elapsed);
  EXPECT_TRUE(absl::IsUnavailable(s[1])) << s[1];
  EXPECT_TRUE(Says(s[1], "rank 1: send to rank 2 failed")) << s[1];
  // Rank 2 never hears from rank 1; rank 0 then never hears from rank 2 again.
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[2])) << s[2];
  EXPECT_TRUE(Says(s[2], "from rank 1")) << s[2];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
  EXPECT_TRUE(Says(s[0], "from rank 2")) << s[0];
  EXPECT_LT(elapsed, 2 * kTimeout + absl::Seconds(1));
  EXPECT_EQ(ring.links[1]->injected().size(), 1u);
}

TEST(FaultyLinkTest, TruncatedMessageIsInvalidArgumentNamingTheSender) {
  // 30 elements, 3 ranks: segments of 10; rank 0's first message to rank 1 loses 9 of them.
  Ring ring(3, {{LinkFault::Truncate(1, 1, 0)}});
  auto s = AllReduce(ring, 30, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s[1])) << s[1];
  EXPECT_TRUE(Says(s[1], "message from rank 0 has 4 bytes, expected 40")) << s[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[2])) << s[2];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
}

TEST(FaultyLinkTest, DroppedMessageIsDeadlineExceededAfterTheTimeoutNamingTheSender) {
  // 3 ranks, one chunk per segment: each rank sends 4 messages (2 reduce-scatter, 2
  // all-gather stages). Rank 2's last one to rank 0 is lost: rank 0 waits for it in vain,
  // the others have everything they need.
  Ring ring(3, {{}, {}, {LinkFault::Drop(0, 3)}});
  absl::Duration elapsed;
  auto s = AllReduce(ring, 30, {}, &elapsed);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
  EXPECT_TRUE(Says(s[0], "timed out waiting for data from rank 2")) << s[0];
  EXPECT_TRUE(s[1].ok()) << s[1];
  EXPECT_TRUE(s[2].ok()) << s[2];
  EXPECT_GE(elapsed, kTimeout);
  EXPECT_LT(elapsed, kTimeout + absl::Seconds(1));
}

TEST(FaultyLinkTest, AnEarlyDropStopsTheRingDownstreamOfIt) {
  // Rank 2's second message to rank 0 (reduce-scatter): rank 0 cannot go on, so rank 1 never
  // gets rank 0's all-gather and rank 2 never gets rank 1's: each names its left neighbour.
  Ring ring(3, {{}, {}, {LinkFault::Drop(0, 1)}});
  absl::Duration elapsed;
  auto s = AllReduce(ring, 30, {}, &elapsed);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s[r])) << s[r];
    EXPECT_TRUE(Says(s[r], absl::StrCat("from rank ", (r + 2) % 3))) << s[r];
  }
  EXPECT_LT(elapsed, 2 * kTimeout + absl::Seconds(1));
}

TEST(FaultyLinkTest, FailedReceiveIsReturnedAsItIs) {
  Ring ring(3, {{LinkFault::FailRecv(2, 0)}});
  auto s = AllReduce(ring, 30, {});
  EXPECT_TRUE(absl::IsUnavailable(s[0])) << s[0];
  EXPECT_EQ(s[0].message(), "rank 2 closed its connection (injected)");
  EXPECT_FALSE(s[1].ok());
  EXPECT_FALSE(s[2].ok());
}

TEST(FaultyLinkTest, AnInjectedStatusIsPassedThroughUnchanged) {
  Ring ring(2, {{},
                {LinkFault{LinkFault::Kind::kFailSend, 0, 0, absl::ZeroDuration(), 0,
                           absl::PermissionDeniedError("custom")}}});
  auto s = AllReduce(ring, 10, {});
  EXPECT_EQ(s[1], absl::PermissionDeniedError("custom"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
}

TEST(FaultyLinkTest, DelayedAndReorderedMessagesChangeNoBit) {
  // Many small chunks; every message of every rank is late by up to 20 ms, rank 1's first one
  // by 60 ms so that later ones overtake it. All well within the timeout.
  constexpr int kWorld = 4;
  constexpr int64_t kSize = 1001;
  RingOptions o;
  o.chunk_elements = 37;
  std::vector<std::vector<LinkFault>> plans(kWorld);
  plans[1].push_back(LinkFault::Delay(-1, absl::Milliseconds(60), 0));
  for (int r = 0; r < kWorld; ++r) {
    for (int i = 0; i < 40; ++i) {
      plans[r].push_back(LinkFault::Delay(-1, absl::Milliseconds((7 * i + 3 * r) % 21), i));
    }
  }
  Ring slow(kWorld, plans, absl::Seconds(5)), clean(kWorld, {}, absl::Seconds(5));
  std::vector<std::vector<float>> late, prompt;
  auto s = AllReduce(slow, kSize, o, nullptr, &late);
  auto c = AllReduce(clean, kSize, o, nullptr, &prompt);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(s[r].ok()) << r << ": " << s[r];
    ASSERT_TRUE(c[r].ok()) << r << ": " << c[r];
    EXPECT_EQ(late[r], prompt[r]) << "rank " << r;
  }
  EXPECT_GT(slow.links[1]->injected().size(), 10u);
}

TEST(FaultyLinkTest, DelayBeyondTheTimeoutIsDeadlineExceededAndTheLateMessageHarmsNothing) {
  Ring ring(2, {{LinkFault::Delay(1, 2 * kTimeout, 0)}});
  auto s = AllReduce(ring, 10, {});
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[1])) << s[1];
  EXPECT_TRUE(Says(s[1], "from rank 0")) << s[1];
  // ~Ring waits for the late message to be delivered into a mailbox nobody reads.
}

TEST(FaultyLinkTest, BroadcastWithADroppedForwardFailsOnlyDownstream) {
  // Root 0 -> 1 -> 2 -> 3: rank 1 drops what it forwards to rank 2.
  Ring ring(4, {{}, {LinkFault::Drop(2)}});
  std::vector<std::vector<float>> data(4);
  for (int r = 0; r < 4; ++r) data[r] = Input(r, 50);
  RingOptions o;
  o.chunk_elements = 16;
  auto s = RunRanks(4, 4 * kTimeout + absl::Seconds(5), [&](int r) {
    return RingBroadcast(*ring.links[r], absl::MakeSpan(data[r]), 0, o);
  });
  EXPECT_TRUE(s[0].ok()) << s[0];
  EXPECT_TRUE(s[1].ok()) << s[1];
  EXPECT_EQ(data[1], data[0]);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[2])) << s[2];
  EXPECT_TRUE(Says(s[2], "from rank 1")) << s[2];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[3])) << s[3];
  EXPECT_TRUE(Says(s[3], "from rank 2")) << s[3];
}

TEST(FaultyLinkTest, FailedAllGatherAfterASuccessfulReduceScatter) {
  // The sharded update's second half fails: rank 2's first all-gather send to rank 0.
  constexpr int kWorld = 3;
  Ring ring(kWorld, {});
  std::vector<std::vector<float>> data(kWorld);
  for (int r = 0; r < kWorld; ++r) data[r] = Input(r, 30);
  auto s = RunRanks(kWorld, 4 * kTimeout + absl::Seconds(5), [&](int r) {
    return RingReduceScatter(*ring.links[r], absl::MakeSpan(data[r]), {});
  });
  for (const absl::Status& st : s) ASSERT_TRUE(st.ok()) << st;
  Ring failing(kWorld, {{}, {}, {LinkFault::FailSend(0, 0)}});
  s = RunRanks(kWorld, 4 * kTimeout + absl::Seconds(5), [&](int r) {
    return RingAllGather(*failing.links[r], absl::MakeSpan(data[r]), {});
  });
  EXPECT_TRUE(absl::IsUnavailable(s[2])) << s[2];
  EXPECT_TRUE(Says(s[2], "send to rank 0")) << s[2];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[0])) << s[0];
  EXPECT_TRUE(absl::IsDeadlineExceeded(s[1])) << s[1];
}

TEST(FaultyLinkTest, OccurrenceSelectsTheNthMatchingMessageOnly) {
  InMemoryHub hub(2, kTimeout);
  FaultyLink link(hub.link(0), {LinkFault::Drop(1, 1)});
  const float x[1] = {1};
  for (uint64_t tag = 0; tag < 3; ++tag) ASSERT_TRUE(link.Send(1, tag, x).ok());
  float got[1];
  EXPECT_TRUE(hub.link(1).Recv(0, 0, absl::MakeSpan(got)).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(hub.link(1).Recv(0, 1, absl::MakeSpan(got))));
  EXPECT_TRUE(hub.link(1).Recv(0, 2, absl::MakeSpan(got)).ok());
  EXPECT_EQ(link.injected(), std::vector<std::string>{"rank 0 dropped its send to rank 1 (tag 1)"});
}

}  // namespace
}  // namespace dptrain
