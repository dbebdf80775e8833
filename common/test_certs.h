// For tests: the files //tools:test_certs makes at build time with tools/make_certs.sh (list
// it in the test's data): the job's CA, ps-0, ps-1, worker-0, worker-1 and a job token, and
// in "other" an unrelated CA with its own ps-0 and worker-0.
#ifndef DPTRAIN_COMMON_TEST_CERTS_H_
#define DPTRAIN_COMMON_TEST_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"

namespace dptrain {

// The path of `file` ("ca.crt", "other/worker-0.key", ...).
inline std::string TestCertPath(const std::string& file) {
  const char* root = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(root != nullptr ? root : ".", "/",
                      workspace != nullptr ? workspace : "dptrain", "/tools/test_certs/", file);
}

// Mutual TLS as `process` ("ps-0", "worker-1", "other/worker-0", ...) with the CA and the
// job token of the same folder; `token_file` replaces the token ("": none).
inline SecurityOptions TestSecurity(const std::string& process,
                                    const std::string* token_file = nullptr) {
  const std::string dir = process.rfind("other/", 0) == 0 ? "other/" : "";
  SecurityOptions o;
  o.tls_cert = TestCertPath(process + ".crt");
  o.tls_key = TestCertPath(process + ".key");
  o.tls_ca = TestCertPath(dir + "ca.crt");
  o.job_token_file = token_file != nullptr ? *token_file : TestCertPath(dir + "job_token");
  return o;
}

// Writes `text` to a fresh file in the test's temporary folder and returns its path.
inline std::string TestFile(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_TEST_CERTS_H_
