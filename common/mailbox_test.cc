#include "common/mailbox.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

MessageBytes Floats(std::vector<float> v) { return MessageBytes::Copy(v.data(), v.size() * 4); }

TEST(MailboxTest, TakeCopiesOrAddsAndScales) {
  Mailbox box;
  ASSERT_TRUE(box.Deposit(1, 5, Floats({1, 2})).ok());
  EXPECT_EQ(box.Deposit(1, 5, Floats({1, 2})).code(), absl::StatusCode::kAlreadyExists);
  std::vector<float> out(2);
  ASSERT_TRUE(box.TakeInto(1, 5, absl::MakeSpan(out), Soon()).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2}));
  ASSERT_TRUE(box.Deposit(1, 6, Floats({3, 4})).ok());
  ASSERT_TRUE(box.TakeAdd(1, 6, absl::MakeSpan(out), 0.5f, Soon()).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 3}));
  ASSERT_TRUE(box.Deposit(1, 7, Floats({3})).ok());
  EXPECT_EQ(box.TakeInto(1, 7, absl::MakeSpan(out), Soon()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(box.TakeInto(1, 8, absl::MakeSpan(out), absl::Now()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A reader that claims a posting writes in place; the Take then only consumes the delivery.
TEST(MailboxTest, PostedMessageIsDeliveredInPlace) {
  Mailbox box;
  std::vector<float> dest = {1, 1};
  box.Post(2, 9, {absl::MakeSpan(dest), /*add=*/false, 1.0f});
  EXPECT_FALSE(box.Claim(2, 9, 4).has_value());  // Wrong size: not claimed.
  std::optional<Posting> p = box.Claim(2, 9, 8);
  ASSERT_TRUE(p.has_value());
  p->dest[0] = 5;
  p->dest[1] = 6;
  box.Delivered(2, 9, true);
  ASSERT_TRUE(box.TakeInto(2, 9, absl::MakeSpan(dest), Soon()).ok());
  EXPECT_EQ(dest, (std::vector<float>{5, 6}));
  // A message already here is not posted: Take copies it.
  ASSERT_TRUE(box.Deposit(2, 10, Floats({7, 8})).ok());
  box.Post(2, 10, {absl::MakeSpan(dest), false, 1.0f});
  EXPECT_FALSE(box.Claim(2, 10, 8).has_value());
  ASSERT_TRUE(box.TakeInto(2, 10, absl::MakeSpan(dest), Soon()).ok());
  EXPECT_EQ(dest, (std::vector<float>{7, 8}));
}

// Unpost waits for a delivery in progress, so the memory is free once it returns.
TEST(MailboxTest, UnpostWaitsForADeliveryInProgress) {
  Mailbox box;
  std::vector<float> dest(2);
  box.Post(1, 3, {absl::MakeSpan(dest), false, 1.0f});
  ASSERT_TRUE(box.Claim(1, 3, 8).has_value());
  std::atomic<bool> delivered{false};
  std::thread reader([&] {
    absl::SleepFor(absl::Milliseconds(100));
    delivered = true;
    box.Delivered(1, 3, true);
  });
  EXPECT_TRUE(box.Unpost(1, 3, Soon()));
  EXPECT_TRUE(delivered);
  reader.join();
  // Not claimed in time: false.
  box.Post(1, 4, {absl::MakeSpan(dest), false, 1.0f});
  ASSERT_TRUE(box.Claim(1, 4, 8).has_value());
  EXPECT_FALSE(box.Unpost(1, 4, absl::Now() + absl::Milliseconds(50)));
}

// A sender whose connection broke half way through a delivery: the Take fails, never hangs.
TEST(MailboxTest, BrokenDeliveryFailsTheTake) {
  Mailbox box;
  std::vector<float> dest(2);
  box.Post(1, 3, {absl::MakeSpan(dest), false, 1.0f});
  ASSERT_TRUE(box.Claim(1, 3, 8).has_value());
  box.Delivered(1, 3, false);
  box.MarkClosed(1);
  EXPECT_EQ(box.TakeInto(1, 3, absl::MakeSpan(dest), Soon()).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dptrain
