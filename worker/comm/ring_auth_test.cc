// The ring's keyed handshake (ring_auth.h) over real TCP: with the job token the ring is
// bit-identical to the in-memory one; a connection without the token (a plain hello, a
// wrong proof, another job) is dropped before any of its frames is read and never disturbs
// the ring or takes a free rank; a connecting rank sends nothing to a listener that cannot
// prove the token; every wait of the handshake is bounded on both sides.
#include "worker/comm/ring_auth.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_peer_link_testing.h"

namespace dptrain {
namespace {

constexpr char kToken[] = "the-job-token-0123456789abcdef";
constexpr char kWrongToken[] = "not-the-token-0123456789abcdef";

TcpPeerLinkOptions Keyed(std::string token = kToken) {
  TcpPeerLinkOptions o;
  o.job_token = std::move(token);
  return o;
}

TEST(RingAuthTest, ProofsBindTokenNoncesRanksJobAndSide) {
  ring_auth::Session s{"job", 1, 0, {}, {}};
  s.acceptor_nonce.fill(1);
  s.connector_nonce.fill(2);
  const Digest proof = ring_auth::ConnectorProof(kToken, s);
  EXPECT_TRUE(DigestsEqual(proof, ring_auth::ConnectorProof(kToken, s)));
  EXPECT_FALSE(DigestsEqual(proof, ring_auth::AcceptorProof(kToken, s)));
  EXPECT_FALSE(DigestsEqual(proof, ring_auth::ConnectorProof(kWrongToken, s)));
  std::vector<ring_auth::Session> changed(6, s);
  changed[0].job_id = "jog";
  changed[1].connector_rank = 2;
  changed[2].acceptor_rank = 1;
  changed[3].acceptor_nonce[31] ^= 1;
  changed[4].connector_nonce[0] ^= 1;
  std::swap(changed[5].connector_rank, changed[5].acceptor_rank);
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_FALSE(DigestsEqual(proof, ring_auth::ConnectorProof(kToken, changed[i]))) << i;
  }
}

TEST(KeyedRingTest, WithTheTokenTheRingIsBitIdentical) {
  RingOptions o;
  o.chunk_elements = 997;
  for (int n : {2, 3}) {
    auto links = MakeLinks(n, absl::Seconds(20), Keyed());
    ExpectCleanAllReduce(links, 100003, o);
  }
}

// Once the ring is up, strangers at rank 0's port claim its left neighbour (rank 2): none
// gets a frame read, and the next all-reduce is bit-identical to a clean one.
TEST(KeyedRingTest, StrangersWithoutTheTokenNeverTouchTheRing) {
  LoggedLinks ring(3, Keyed());
  auto& [log, ports, links] = ring;
  RingOptions o;
  o.chunk_elements = 64;
  o.tag_base = 1;
  ExpectCleanAllReduce(links, 1000, o);
  o.tag_base = 2;
  const uint64_t first_tag = o.tag_base << 40;  // What rank 0 expects next from rank 2.
  const std::vector<float> garbage(o.chunk_elements, 1e30f);

  RawPeer plain(ports[0]);  // Today's hello, then the expected frame.
  plain.Hello(2);
  plain.Frame(first_tag, garbage, /*dropped=*/true);
  EXPECT_TRUE(plain.ClosedByLink());
  RawPeer wrong(ports[0]);  // The keyed handshake with another token, then the frame.
  EXPECT_FALSE(wrong.KeyedHello(2, 0, kWrongToken));
  wrong.Frame(first_tag, garbage, /*dropped=*/true);
  EXPECT_TRUE(wrong.ClosedByLink());
  RawPeer other_job(ports[0]);  // The right token, another job's id.
  EXPECT_FALSE(other_job.KeyedHello(2, 0, kToken, "another job"));
  RawPeer second(ports[0]);  // The right token still cannot take a connected rank.
  EXPECT_FALSE(second.KeyedHello(2, 0, kToken));
  second.Frame(first_tag, garbage, /*dropped=*/true);

  ASSERT_TRUE(
      log.WaitFor("dropped: a hello without a job-token proof (this ring requires the "
                  "job token)"));
  ASSERT_TRUE(log.WaitFor("dropped: claimed rank 2 with a wrong job-token proof"));
  ASSERT_TRUE(log.WaitFor("dropped: not a hello of this job"));
  ASSERT_TRUE(log.WaitFor("which is already connected (one live connection per rank)"));
  ExpectCleanAllReduce(links, 1000, o);
}

// Before the real rank 1 connects, strangers claim its rank: they are dropped at the
// handshake, so the rank stays free and the real peer is heard.
TEST(KeyedRingTest, AStrangerCannotTakeAFreeRank) {
  LoggedLinks pair(2, Keyed());
  auto& [log, ports, links] = pair;
  {
    RawPeer wrong(ports[0]);
    EXPECT_FALSE(wrong.KeyedHello(1, 0, kWrongToken));
    wrong.Frame(7, {66, 66, 66}, /*dropped=*/true);
    RawPeer plain(ports[0]);
    plain.Hello(1);
    plain.Frame(7, {66, 66, 66}, /*dropped=*/true);
    EXPECT_TRUE(plain.ClosedByLink());
    EXPECT_TRUE(wrong.ClosedByLink());
  }
  ASSERT_TRUE(log.WaitFor("dropped: claimed rank 1 with a wrong job-token proof"));
  ASSERT_TRUE(log.WaitFor("dropped: a hello without a job-token proof"));
  const std::vector<float> message = {1, 2, 3};
  ASSERT_TRUE(links[1]->Send(0, 7, message).ok());
  std::vector<float> got(3);
  ASSERT_TRUE(links[0]->Recv(1, 7, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, message);
}

struct RawFd {
  int fd;
};

// A listener on loopback that is not a rank of the job: `serve` gets its first connection
// (on a thread) and returns how many bytes it received in all.
class FakeAcceptor {
 public:
  explicit FakeAcceptor(std::function<void(RawFd)> serve) {
    auto l = TcpListener::Listen(0, "127.0.0.1");
    EXPECT_TRUE(l.ok()) << l.status();
    listener_ = *std::move(l);
    thread_ = std::thread([this, serve] {
      pollfd ready{listener_->fd(), POLLIN, 0};
      if (poll(&ready, 1, 20000) != 1) return;
      RawFd fd{accept(listener_->fd(), nullptr, nullptr)};
      serve(fd);
      char buffer[4096];
      for (ssize_t r; (r = recv(fd.fd, buffer, sizeof(buffer), 0)) > 0;) received_ += r;
      close(fd.fd);
    });
  }
  ~FakeAcceptor() {
    if (thread_.joinable()) thread_.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", listener_->port()); }
  // Every byte the connector sent, once it closed.
  int64_t TotalReceived() {
    thread_.join();
    return received_;
  }

 private:
  std::unique_ptr<TcpListener> listener_;
  std::thread thread_;
  int64_t received_ = 0;
};

// Rank 0 of a 2-rank link whose rank 1 is `impostor`.
std::unique_ptr<TcpPeerLink> LinkTo(const std::string& impostor, TcpPeerLinkOptions o) {
  auto l = TcpListener::Listen(0, "127.0.0.1");
  EXPECT_TRUE(l.ok()) << l.status();
  o.rank = 0;
  o.timeout = absl::Seconds(20);
  o.addresses = {absl::StrCat("127.0.0.1:", (*l)->port()), impostor};
  auto link = TcpPeerLink::Create(o, *std::move(l));
  EXPECT_TRUE(link.ok()) << link.status();
  return *std::move(link);
}

// Mutual: the connecting rank checks the listener's proof before it sends a tensor byte.
TEST(KeyedRingTest, TheConnectorSendsNothingToAListenerWithoutTheToken) {
  const std::vector<float> secret(1000, 42.0f);
  // Answers the challenge with a proof made from another token.
  FakeAcceptor wrong([](RawFd fd) {
    ring_auth::Challenge challenge{ring_auth::kChallengeMagic, 1, {}};
    challenge.nonce.fill(9);
    send(fd.fd, &challenge, sizeof(challenge), MSG_NOSIGNAL);
    ring_auth::Hello hello;
    ring_auth::Session s{"dptrain", 0, 1, challenge.nonce, {}};
    Digest proof;
    recv(fd.fd, &hello, sizeof(hello), MSG_WAITALL);
    recv(fd.fd, s.connector_nonce.data(), s.connector_nonce.size(), MSG_WAITALL);
    recv(fd.fd, proof.data(), proof.size(), MSG_WAITALL);
    const ring_auth::Verdict accepted{ring_auth::kVerdictMagic, 0};
    send(fd.fd, &accepted, sizeof(accepted), MSG_NOSIGNAL);
    const Digest answer = ring_auth::AcceptorProof(kWrongToken, s);
    send(fd.fd, answer.data(), answer.size(), MSG_NOSIGNAL);
  });
  {
    auto link = LinkTo(wrong.address(), Keyed());
    const absl::Status s = link->Send(1, 5, secret);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  "failed the job-token check as rank 1: nothing "
                                  "was sent to it"))
        << s;
  }
  EXPECT_EQ(wrong.TotalReceived(), 0);  // Beyond the 80 handshake bytes read in `serve`.

  // Claims to be another rank.
  FakeAcceptor other_rank([](RawFd fd) {
    const ring_auth::Challenge challenge{ring_auth::kChallengeMagic, 0, {}};
    send(fd.fd, &challenge, sizeof(challenge), MSG_NOSIGNAL);
  });
  {
    auto link = LinkTo(other_rank.address(), Keyed());
    const absl::Status s = link->Send(1, 5, secret);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "is not rank 1 of this ring")) << s;
  }
  EXPECT_EQ(other_rank.TotalReceived(), 48);  // The hello and the nonce, no proof, no frame.
}

// Every wait of the handshake is bounded by handshake_timeout: a stranger that stops half
// way is dropped, a listener that never challenges fails the Send, and at most
// max_pending_handshakes connections are in their handshake at once.
TEST(KeyedRingTest, HandshakeWaitsAreBounded) {
  TcpPeerLinkOptions o = Keyed();
  o.handshake_timeout = absl::Seconds(1);
  o.max_pending_handshakes = 2;
  LoggedLinks pair(2, o);
  auto& [log, ports, links] = pair;
  const absl::Time start = absl::Now();
  RawPeer half(ports[0]);  // A keyed hello, then silence: no proof.
  const ring_auth::Hello hello{ring_auth::kKeyedMagic, 1, ring_auth::HashJob("dptrain")};
  half.Send(&hello, sizeof(hello));
  RawPeer silent(ports[0]);
  RawPeer third(ports[0]);
  EXPECT_TRUE(third.ClosedByLink());
  EXPECT_TRUE(half.ClosedByLink());
  EXPECT_TRUE(silent.ClosedByLink());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(log.WaitFor("refused: 2 connections are already awaiting their handshake"));
  ASSERT_TRUE(
      log.WaitFor("dropped: claimed rank 1 but closed or timed out before its "
                  "job-token proof"));
  ASSERT_TRUE(log.WaitFor("dropped: closed or timed out before a whole hello"));
  // The real peer gets in afterwards.
  const std::vector<float> message = {4, 5};
  ASSERT_TRUE(links[1]->Send(0, 3, message).ok());
  std::vector<float> got(2);
  ASSERT_TRUE(links[0]->Recv(1, 3, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, message);

  // A listener that accepts and never challenges.
  FakeAcceptor mute([](RawFd) { absl::SleepFor(absl::Seconds(1)); });
  o.handshake_timeout = absl::Milliseconds(200);
  auto link = LinkTo(mute.address(), o);
  const absl::Time sent = absl::Now();
  const absl::Status s = link->Send(1, 5, message);
  EXPECT_LT(absl::Now() - sent, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "sent no job-token challenge within 200ms")) << s;
}

// A token on some ranks only fails at once with a line that says so, on both sides.
TEST(KeyedRingTest, ATokenOnSomeRanksOnlyFailsClearly) {
  CapturedLog log;
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    listeners.push_back(*TcpListener::Listen(0, "127.0.0.1"));
    addresses.push_back(absl::StrCat("127.0.0.1:", listeners.back()->port()));
  }
  TcpPeerLinkOptions keyed = Keyed(), plain;
  keyed.rank = 0;
  plain.rank = 1;
  for (TcpPeerLinkOptions* o : {&keyed, &plain}) {
    o->addresses = addresses;
    o->log = log.sink();
    o->timeout = absl::Seconds(2);
  }
  auto rank0 = TcpPeerLink::Create(keyed, std::move(listeners[0]));
  auto rank1 = TcpPeerLink::Create(plain, std::move(listeners[1]));
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  const absl::Status s = (*rank0)->Send(1, 1, {1.0f});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "closed the connection or sent no job-token "
                                "challenge"))
      << s;
  EXPECT_TRUE(log.WaitFor("tcp link rank 1: connection from 127.0.0.1:"));
  EXPECT_TRUE(log.WaitFor("dropped: a job-token hello, but this rank has no job token"));
  (void)(*rank1)->Send(0, 1, {1.0f});  // A plain hello: rank 0 drops it.
  EXPECT_TRUE(log.WaitFor("tcp link rank 0: connection from 127.0.0.1:"));
  EXPECT_TRUE(log.WaitFor("dropped: a hello without a job-token proof"));
}

}  // namespace
}  // namespace dptrain
