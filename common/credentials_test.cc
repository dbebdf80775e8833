// Credentials::Load: the TLS files and the job token are read and checked at start, and
// every mistake is one line naming the flag and the file; the warning says what is off.
// (The credentials at work, over real gRPC: tests/secure_grpc_test.)
#include "common/credentials.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "common/test_certs.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

void ExpectError(const SecurityOptions& o, absl::StatusCode code, absl::string_view says) {
  auto c = Credentials::Load(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), code) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), says)) << c.status();
  EXPECT_FALSE(absl::StrContains(c.status().message(), "\n")) << c.status();
}

TEST(CredentialsTest, LoadsWhatMakeCertsMakes) {
  auto c = Credentials::Load(TestSecurity("worker-1"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->tls());
  EXPECT_EQ((*c)->job_token().size(), 64u);
  EXPECT_EQ((*c)->Warning(), "");
  EXPECT_NE((*c)->ServerCredentials(), nullptr);
  EXPECT_NE((*c)->ChannelCredentials(), nullptr);
}

TEST(CredentialsTest, WarningSaysWhatIsOff) {
  auto none = Credentials::Load(SecurityOptions());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)->tls());
  EXPECT_TRUE(absl::StrContains((*none)->Warning(), "security off: plaintext gRPC, no job token"));
  const std::string no_token;
  auto tls_only = Credentials::Load(TestSecurity("ps-0", &no_token));
  ASSERT_TRUE(tls_only.ok()) << tls_only.status();
  EXPECT_TRUE(absl::StrContains((*tls_only)->Warning(), "no --job_token_file"));
  for (const auto& c : {*none, *tls_only}) {
    EXPECT_FALSE(absl::StrContains(c->Warning(), "\n"));
  }
}

// Issue 30 item 6: a private key or token that every user can read is warned about, one line
// naming the flag, the file and its mode; 0600 (what tools/make_certs.sh writes) is not.
TEST(CredentialsTest, WarnsAboutPrivateFilesEveryoneCanRead) {
  std::ifstream key_in(TestCertPath("ps-0.key")), token_in(TestCertPath("job_token"));
  std::stringstream key, token;
  key << key_in.rdbuf();
  token << token_in.rdbuf();
  SecurityOptions o = TestSecurity("ps-0");
  o.tls_key = TestFile("open.key", key.str());
  o.job_token_file = TestFile("open_token", token.str());
  ASSERT_EQ(chmod(o.tls_key.c_str(), 0644), 0);
  ASSERT_EQ(chmod(o.job_token_file.c_str(), 0604), 0);
  auto open = Credentials::Load(o);
  ASSERT_TRUE(open.ok()) << open.status();
  ASSERT_EQ((*open)->FileWarnings().size(), 2u);
  EXPECT_EQ((*open)->FileWarnings()[0],
            absl::StrCat("--tls_key=", o.tls_key,
                         " is readable by every user (mode 0644): chmod 600 it "
                         "(tools/make_certs.sh writes keys and tokens so)"));
  EXPECT_TRUE(absl::StrContains((*open)->FileWarnings()[1], "--job_token_file="))
      << (*open)->FileWarnings()[1];
  EXPECT_TRUE(absl::StrContains((*open)->FileWarnings()[1], "(mode 0604)"));
  ASSERT_EQ(chmod(o.tls_key.c_str(), 0600), 0);
  ASSERT_EQ(chmod(o.job_token_file.c_str(), 0640), 0);  // Group-readable: k8s Secrets (0440).
  auto closed = Credentials::Load(o);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_TRUE((*closed)->FileWarnings().empty());
}

TEST(CredentialsTest, EveryMistakeIsOneLineNamingTheFlag) {
  SecurityOptions o = TestSecurity("ps-0");
  o.tls_key.clear();
  ExpectError(o, absl::StatusCode::kInvalidArgument,
              "--tls_cert, --tls_key and --tls_ca go together (mutual TLS); missing: --tls_key");
  SecurityOptions token_only;
  token_only.job_token_file = TestCertPath("job_token");
  ExpectError(token_only, absl::StatusCode::kInvalidArgument,
              "--job_token_file needs --tls_cert, --tls_key and --tls_ca");

  o = TestSecurity("ps-0");
  o.tls_cert = "/nonexistent/ps-0.crt";
  ExpectError(o, absl::StatusCode::kNotFound,
              "--tls_cert: cannot read '/nonexistent/ps-0.crt': No such file or directory");
  o = TestSecurity("ps-0");
  o.tls_ca = "/nonexistent/ca.crt";
  ExpectError(o, absl::StatusCode::kNotFound, "--tls_ca: cannot read '/nonexistent/ca.crt'");
  o = TestSecurity("ps-0");
  o.job_token_file = "/nonexistent/token";
  ExpectError(o, absl::StatusCode::kNotFound, "--job_token_file: cannot read '/nonexistent/token'");
  o = TestSecurity("ps-0");
  o.job_token_file = TestFile("empty_token", "\n");
  ExpectError(o, absl::StatusCode::kInvalidArgument, "--job_token_file: '");

  o = TestSecurity("ps-0");
  o.tls_cert = TestCertPath("job_token");  // Not a certificate.
  ExpectError(o, absl::StatusCode::kInvalidArgument, "no PEM certificate in it");
  o = TestSecurity("ps-0");
  o.tls_key = TestCertPath("ps-0.crt");  // A certificate, not a key.
  ExpectError(o, absl::StatusCode::kInvalidArgument, "no unencrypted PEM private key in it");
  o = TestSecurity("ps-0");
  o.tls_key = TestCertPath("worker-0.key");  // Someone else's key.
  ExpectError(o, absl::StatusCode::kInvalidArgument, "not the private key of --tls_cert=");
  o = TestSecurity("ps-0");
  o.tls_ca = TestCertPath("other/ca.crt");  // A CA that did not sign ps-0.
  ExpectError(o, absl::StatusCode::kInvalidArgument, "not accepted by --tls_ca=");
}

}  // namespace
}  // namespace dptrain
