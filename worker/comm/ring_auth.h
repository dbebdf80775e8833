// The ring's keyed handshake (used by worker/comm/tcp_peer_link.h): how a TCP connection
// proves that it belongs to the job before the accepting rank reads any tensor byte from
// it, and how the connecting rank learns that it reached the real peer before it sends any.
//
// With a job token (fields in host byte order, as the rest of the link's framing):
//   acceptor  -> connector  Challenge {"DPTC", acceptor rank, nonce_a}   at once on accept
//   connector -> acceptor   Hello {"DPTA", connector rank, job hash}, nonce_c
//   connector -> acceptor   ConnectorProof = HMAC-SHA256(token, "dptrain ring v1 connector"
//                           || nonce_a || nonce_c || connector rank || acceptor rank || job id)
//   acceptor  -> connector  Verdict {"DPTV", code}
//   acceptor  -> connector  AcceptorProof  = the same with "... acceptor", once the rank is
//                           claimed (after an accepting verdict only)
// Nonces are 32 random bytes, fresh per connection, so a recorded proof answers no other
// challenge; the labels keep one side's proof from serving as the other's. The token itself
// never crosses the wire. Without a token the connector sends Hello {"DPTR", rank, job hash}
// only (the hash of a job id is no secret), and the acceptor answers with the Verdict.
// Every hello gets a verdict, in both modes: accepted; the rank is busy (another connection
// holds it: the connector retries until its deadline, since a stranger that claimed the rank
// first is dropped when it delivers no frame); or refused (another job, a bad rank or proof:
// no retry). A connector never sends a frame before it read an accepting verdict.
#ifndef DPTRAIN_WORKER_COMM_RING_AUTH_H_
#define DPTRAIN_WORKER_COMM_RING_AUTH_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/job_token.h"

namespace dptrain {
namespace ring_auth {

inline constexpr uint32_t kPlainMagic = 0x44505452;      // "DPTR": a hello without proof.
inline constexpr uint32_t kKeyedMagic = 0x44505441;      // "DPTA": a hello, proof to follow.
inline constexpr uint32_t kChallengeMagic = 0x44505443;  // "DPTC"

inline constexpr uint32_t kVerdictMagic = 0x44505456;  // "DPTV"

using Nonce = std::array<uint8_t, 32>;

enum class VerdictCode : uint32_t { kAccepted = 0, kRankBusy = 1, kRefused = 2 };

struct Verdict {
  uint32_t magic, code;  // kVerdictMagic, a VerdictCode.
};
static_assert(sizeof(Verdict) == 8);

struct Hello {
  uint32_t magic, rank;
  uint64_t job;  // HashJob(job id).
};
static_assert(sizeof(Hello) == 16);

struct Challenge {
  uint32_t magic, rank;
  Nonce nonce;
};
static_assert(sizeof(Challenge) == 40);

// FNV-1a of the job id.
uint64_t HashJob(const std::string& job_id);

// What both proofs of one connection cover.
struct Session {
  std::string job_id;
  uint32_t connector_rank = 0, acceptor_rank = 0;
  Nonce acceptor_nonce{}, connector_nonce{};
};

Digest ConnectorProof(absl::string_view token, const Session& session);
Digest AcceptorProof(absl::string_view token, const Session& session);

}  // namespace ring_auth
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_RING_AUTH_H_
