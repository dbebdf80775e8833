#include "worker/comm/ring_auth.h"

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace ring_auth {
namespace {

std::string LittleEndian(uint32_t v) {
  return std::string{static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 24)};
}

Digest Proof(absl::string_view label, absl::string_view token, const Session& s) {
  const auto bytes = [](const Nonce& n) {
    return absl::string_view(reinterpret_cast<const char*>(n.data()), n.size());
  };
  // The label ends with a NUL byte, so that no label is a prefix of another message.
  return HmacSha256(token, absl::StrCat(label, absl::string_view("\0", 1), bytes(s.acceptor_nonce),
                                        bytes(s.connector_nonce), LittleEndian(s.connector_rank),
                                        LittleEndian(s.acceptor_rank), s.job_id));
}

}  // namespace

uint64_t HashJob(const std::string& job_id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : job_id) h = (h ^ c) * 1099511628211ull;
  return h;
}

Digest ConnectorProof(absl::string_view token, const Session& session) {
  return Proof("dptrain ring v1 connector", token, session);
}

Digest AcceptorProof(absl::string_view token, const Session& session) {
  return Proof("dptrain ring v1 acceptor", token, session);
}

}  // namespace ring_auth
}  // namespace dptrain
