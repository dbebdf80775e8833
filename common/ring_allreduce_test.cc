#include "common/ring_allreduce.h"

#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/in_memory_link.h"
#include "common/rank_threads.h"
#include "common/wire_dtype.h"
#include "common/wire_link.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Runs fn(rank) on world_size threads and returns their statuses (a hang aborts).
template <typename Fn>
std::vector<absl::Status> Spawn(int world_size, Fn fn) {
  return RunRanks(world_size, absl::Seconds(60), fn);
}

std::vector<float> Input(int rank, int64_t n) { return RandomFloats(1000 + rank, n); }

struct Case {
  int world_size;
  int64_t n;
  int64_t chunk;
};

class RingAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(RingAllReduceTest, EveryRankGetsTheMeanBitIdentically) {
  const Case c = GetParam();
  InMemoryHub hub(c.world_size, absl::Seconds(10));
  std::vector<std::vector<float>> data(c.world_size);
  for (int r = 0; r < c.world_size; ++r) data[r] = Input(r, c.n);
  // float64 reference of the mean.
  std::vector<double> mean(c.n, 0.0);
  for (int r = 0; r < c.world_size; ++r) {
    for (int64_t i = 0; i < c.n; ++i) mean[i] += data[r][i] / c.world_size;
  }
  RingOptions o;
  o.chunk_elements = c.chunk;
  auto statuses = Spawn(
      c.world_size, [&](int r) { return RingAllReduce(hub.link(r), absl::MakeSpan(data[r]), o); });
  for (int r = 0; r < c.world_size; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(data[r], data[0]) << "rank " << r << " differs from rank 0";
  }
  for (int64_t i = 0; i < c.n; ++i) EXPECT_NEAR(data[0][i], mean[i], 1e-6) << i;
}

// The two halves apart (the sharded update between them): after the reduce-scatter each
// rank's owned segment is bit-identical to what the full all-reduce gives there; after the
// all-gather of the (changed) owned segments every rank holds every owner's values.
TEST_P(RingAllReduceTest, ReduceScatterThenAllGatherEqualsAllReduce) {
  const Case c = GetParam();
  InMemoryHub hub(c.world_size, absl::Seconds(10));
  std::vector<std::vector<float>> whole(c.world_size), halves(c.world_size);
  for (int r = 0; r < c.world_size; ++r) whole[r] = halves[r] = Input(r, c.n);
  RingOptions o;
  o.chunk_elements = c.chunk;
  auto statuses = Spawn(
      c.world_size, [&](int r) { return RingAllReduce(hub.link(r), absl::MakeSpan(whole[r]), o); });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  statuses = Spawn(c.world_size, [&](int r) {
    if (auto s = RingReduceScatter(hub.link(r), absl::MakeSpan(halves[r]), o); !s.ok()) return s;
    const Range mine = SegmentRange(c.n, c.world_size, RingOwnedSegment(r, c.world_size));
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      if (halves[r][i] != whole[0][i]) return absl::InternalError(absl::StrCat("element ", i));
      halves[r][i] += static_cast<float>(r);  // The owner's update.
    }
    return RingAllGather(hub.link(r), absl::MakeSpan(halves[r]), o);
  });
  for (int r = 0; r < c.world_size; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
  for (int owner = 0; owner < c.world_size; ++owner) {
    const Range seg = SegmentRange(c.n, c.world_size, RingOwnedSegment(owner, c.world_size));
    for (int r = 0; r < c.world_size; ++r) {
      for (int64_t i = seg.begin; i < seg.end; ++i) {
        ASSERT_EQ(halves[r][i], whole[0][i] + static_cast<float>(owner))
            << "rank " << r << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingAllReduceTest,
                         ::testing::Values(Case{1, 10, 4}, Case{2, 10, 4}, Case{3, 10, 4},
                                           Case{4, 3, 4}, Case{5, 1, 1}, Case{3, 0, 4},
                                           Case{4, 1001, 7}, Case{8, 4096, 100},
                                           Case{3, 100, 1000}));

TEST(RingAllReduceTest, SumWithoutAveraging) {
  InMemoryHub hub(3, absl::Seconds(10));
  std::vector<std::vector<float>> data = {{1, 2}, {10, 20}, {100, 200}};
  RingOptions o;
  o.average = false;
  auto statuses =
      Spawn(3, [&](int r) { return RingAllReduce(hub.link(r), absl::MakeSpan(data[r]), o); });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(statuses[r].ok());
    EXPECT_EQ(data[r], (std::vector<float>{111, 222}));
  }
}

TEST(RingAllReduceTest, MovesTwoNMinusOneOverNOfTheBuffer) {
  const int n = 4;
  const int64_t size = 4000, chunk = 100;
  InMemoryHub hub(n, absl::Seconds(10));
  std::vector<std::vector<float>> data(n, std::vector<float>(size, 1.0f));
  RingOptions o;
  o.chunk_elements = chunk;
  Spawn(n, [&](int r) { return RingAllReduce(hub.link(r), absl::MakeSpan(data[r]), o); });
  // Each rank sends 2(N-1) segments of size/N elements, in chunks.
  EXPECT_EQ(hub.messages(), n * 2 * (n - 1) * (size / n / chunk));
}

// A 16-bit wire (NarrowingLink): every rank still ends bit-identical (the owner keeps the
// rounded value it sends), within the format's rounding of the fp32 result, in half the
// bytes; bf16 and fp16, several ring sizes and uneven chunks.
TEST(RingAllReduceTest, SixteenBitWireStaysBitIdenticalAndNearTheFp32Mean) {
  for (DType wire : {DType::kBf16, DType::kFp16}) {
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(wire), " ", n, " ranks"));
      const int64_t size = 1001;
      std::vector<std::vector<float>> narrow(n), wide(n);
      for (int r = 0; r < n; ++r) narrow[r] = wide[r] = Input(r, size);
      RingOptions o;
      o.chunk_elements = 97;
      InMemoryHub narrow_hub(n, absl::Seconds(10)), wide_hub(n, absl::Seconds(10));
      auto statuses = Spawn(n, [&](int r) {
        NarrowingLink link(narrow_hub.link(r), wire);
        return RingAllReduce(link, absl::MakeSpan(narrow[r]), o);
      });
      for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
      Spawn(n, [&](int r) { return RingAllReduce(wide_hub.link(r), absl::MakeSpan(wide[r]), o); });
      double diff = 0, norm = 0;
      for (int r = 0; r < n; ++r) EXPECT_EQ(narrow[r], narrow[0]) << "rank " << r;
      for (int64_t i = 0; i < size; ++i) {
        // Every value is one the wire can carry, as the other ranks received it.
        std::vector<float> v = {narrow[0][i]};
        RoundToWire(wire, absl::MakeSpan(v));
        ASSERT_EQ(v[0], narrow[0][i]) << i;
        diff += (narrow[0][i] - double{wide[0][i]}) * (narrow[0][i] - double{wide[0][i]});
        norm += double{wide[0][i]} * wide[0][i];
      }
      // Up to n - 1 rounded partial sums and the rounded result, each within the unit
      // roundoff (bf16 2^-8, fp16 2^-11) of its value.
      const double unit = wire == DType::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      EXPECT_LE(std::sqrt(diff / norm), n * unit);
      EXPECT_GT(diff, 0) << "the wire must really be 16-bit";
      int64_t narrow_bytes = 0, wide_bytes = 0;
      for (int r = 0; r < n; ++r) {
        narrow_bytes += narrow_hub.link(r).bytes_sent();
        wide_bytes += wide_hub.link(r).bytes_sent();
      }
      EXPECT_GT(wide_bytes, 0);
      EXPECT_LE(narrow_bytes, wide_bytes / 2 + 64 * n * n) << "half the bytes (odd chunks: +2)";
    }
  }
}

TEST(RingAllReduceTest, MissingRankFailsInsteadOfHanging) {
  InMemoryHub hub(3, absl::Milliseconds(200));
  std::vector<std::vector<float>> data(3, std::vector<float>(30, 1.0f));
  auto statuses = Spawn(3, [&](int r) -> absl::Status {
    if (r == 2) return absl::OkStatus();  // Rank 2 never takes part.
    return RingAllReduce(hub.link(r), absl::MakeSpan(data[r]), RingOptions{});
  });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(RingBroadcastTest, EveryRankGetsTheRootsData) {
  for (int n : {1, 2, 3, 5}) {
    for (int root = 0; root < n; ++root) {
      InMemoryHub hub(n, absl::Seconds(10));
      std::vector<std::vector<float>> data(n);
      for (int r = 0; r < n; ++r) data[r] = Input(r, 57);
      const std::vector<float> expected = data[root];
      RingOptions o;
      o.chunk_elements = 10;
      auto statuses = Spawn(
          n, [&](int r) { return RingBroadcast(hub.link(r), absl::MakeSpan(data[r]), root, o); });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(data[r], expected) << "n=" << n << " root=" << root << " rank=" << r;
      }
    }
  }
}

TEST(RingTest, SegmentRangesCoverTheBuffer) {
  for (int64_t n : {0, 1, 5, 17, 100}) {
    for (int parts : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int s = 0; s < parts; ++s) {
        Range r = SegmentRange(n, parts, s);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.size(), n / parts);
        EXPECT_LE(r.size(), n / parts + 1);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(RingTest, RejectsBadOptions) {
  InMemoryHub hub(2, absl::Seconds(1));
  std::vector<float> v(4);
  RingOptions o;
  o.chunk_elements = 0;
  EXPECT_EQ(RingAllReduce(hub.link(0), absl::MakeSpan(v), o).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingBroadcast(hub.link(0), absl::MakeSpan(v), 5, RingOptions{}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dptrain
