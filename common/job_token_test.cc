// The job token file's rules, and the crypto under the token checks: HMAC-SHA256 against
// RFC 4231, SHA-256 against FIPS 180-2, the constant-time comparison, random nonces.
#include "common/job_token.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/test_certs.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

std::string Hex(const Digest& d) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), 32));
}

TEST(JobTokenTest, Rfc4231AndFips180Vectors) {
  // RFC 4231 test case 2.
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // RFC 4231 test case 6: a key longer than the block.
  EXPECT_EQ(Hex(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(Hex(Sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(JobTokenTest, DigestsEqualComparesEveryByte) {
  const Digest a = Sha256("a");
  Digest b = a;
  EXPECT_TRUE(DigestsEqual(a, b));
  for (size_t i : {size_t{0}, size_t{17}, size_t{31}}) {
    b = a;
    b[i] ^= 1;
    EXPECT_FALSE(DigestsEqual(a, b)) << i;
  }
}

TEST(JobTokenTest, NoncesAreFresh) {
  std::array<uint8_t, 32> a{}, b{};
  ASSERT_TRUE(RandomBytes(absl::MakeSpan(a)).ok());
  ASSERT_TRUE(RandomBytes(absl::MakeSpan(b)).ok());
  EXPECT_NE(a, b);
}

TEST(JobTokenTest, TokenFileRules) {
  // What tools/make_certs.sh writes: 64 hex digits and a newline.
  auto made = ReadJobTokenFile(TestCertPath("job_token"));
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->size(), 64u);
  auto padded = ReadJobTokenFile(TestFile("padded", "  0123456789abcdef0123\n\n"));
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(*padded, "0123456789abcdef0123");

  auto missing = ReadJobTokenFile("/nonexistent/token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "cannot read '/nonexistent/token': No such file or directory");
  struct Bad {
    const char* name;
    std::string text;
    const char* says;
  };
  for (const Bad& bad : {Bad{"empty", "", "is empty"}, Bad{"blank", " \n\t\n", "is empty"},
                         Bad{"short", "abc123\n", "has 6 characters, fewer than 16"},
                         Bad{"spaces", "0123456789 abcdef0123", "printable ASCII without spaces"},
                         Bad{"binary", "0123456789abcdef\x01", "printable ASCII without spaces"},
                         Bad{"huge", std::string(5000, 'a'), "longer than the 4096 bytes"}}) {
    auto s = ReadJobTokenFile(TestFile(bad.name, bad.text));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad.name;
    EXPECT_TRUE(absl::StrContains(s.status().message(), bad.says))
        << bad.name << ": " << s.status();
    EXPECT_FALSE(absl::StrContains(s.status().message(), "\n")) << bad.name;
  }
}

}  // namespace
}  // namespace dptrain
