// PeerLink over plain TCP, for the bulk data of all-reduce mode: one connection per pair of
// ranks that talk (opened on first Send), a reader thread per incoming connection that
// reads each message straight into the receiver's memory when it was expected (Expect:
// copied there, or added through a small buffer that stays in cache), else into this
// rank's Mailbox; and a blocking write per Send.
// Framing: [tag u64][length u64][payload] after the handshake (ring_auth.h): with a job
// token an HMAC challenge-response in both directions, else a plain hello of
// [magic u32][rank u32][job hash u64]. Fewer copies and no HTTP/2 framing compared with a
// gRPC call per message.
//
// Trust (see docs/failure_and_security.md): a connection speaks for a rank only once its
// handshake (Handshake(), the one place that decides) proved the job token, when the link
// has one, and claimed a rank that had no live connection; a second claim of a connected
// rank is refused and logged, never merged. A connecting rank sends no frame before the
// accepting rank proved the token in turn. A connection that fails before its handshake
// completes, or before it delivered any frame, is logged and dropped and never marks a rank
// closed; one that sends no frame within handshake_timeout of its handshake gives its rank
// back. Every hello is answered (accepted, rank busy, refused); a connector refused because
// its rank is busy retries until `timeout`. Every frame length is bounded by max_message_bytes
// before anything is allocated, and a large unexpected payload is allocated as its bytes arrive. At
// most max_pending_handshakes connections may be in their handshake, each for at most
// handshake_timeout.
#ifndef DPTRAIN_WORKER_COMM_TCP_PEER_LINK_H_
#define DPTRAIN_WORKER_COMM_TCP_PEER_LINK_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log_sink.h"
#include "common/mailbox.h"
#include "common/peer_link.h"

namespace dptrain {

// A listening TCP socket on a free port (or `port`), accepting peers in the background
// once a link is attached.
class TcpListener {
 public:
  // Listens on `host` (a numeric IPv4 address; "0.0.0.0": every interface) and `port`
  // (0: a free one). InvalidArgument for a host that is not such an address.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(int port,
                                                             const std::string& host = "0.0.0.0");
  ~TcpListener();
  int port() const { return port_; }
  int fd() const { return fd_; }

 private:
  TcpListener() = default;
  int fd_ = -1;
  int port_ = 0;
};

struct TcpPeerLinkOptions {
  std::string job_id = "dptrain";
  int rank = 0;
  std::vector<std::string> addresses;          // "host:port" of every rank's listener.
  absl::Duration timeout = absl::Seconds(60);  // Longest wait for one message / connection.
  // The largest frame payload a peer may declare: the largest message the caller sends
  // (the ring's chunk). A larger declaration drops the connection.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  int max_pending_handshakes = 16;  // Accepted, handshake not done.
  // The whole handshake, on either side (a connector waits this long for the proof).
  absl::Duration handshake_timeout = absl::Seconds(10);
  // The job's secret (--job_token_file): every connection proves it (ring_auth.h). Empty:
  // a plain hello, and anyone who knows the job id can claim a free rank.
  std::string job_token;
  LogSink log = StderrLog();
};

class TcpPeerLink : public PeerLink {
 public:
  // Takes over `listener` (accepting peers from now on).
  static absl::StatusOr<std::unique_ptr<TcpPeerLink>> Create(const TcpPeerLinkOptions& options,
                                                             std::unique_ptr<TcpListener> listener);
  ~TcpPeerLink() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return static_cast<int>(options_.addresses.size()); }
  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override;
  absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) override;
  void Expect(int peer, uint64_t tag, const Posting& posting) override;
  bool Unexpect(int peer, uint64_t tag) override;
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  struct Outgoing {
    absl::Mutex mu;
    int fd = -1;
  };
  TcpPeerLink(const TcpPeerLinkOptions& options, std::unique_ptr<TcpListener> listener);
  void AcceptLoop();
  void ReadLoop(int fd);
  // The accepting side of the handshake: checks the hello (and with a token the proof,
  // then answers with its own) and claims the rank for `fd`. The rank, or why the
  // connection does not speak for one (it is then dropped).
  absl::StatusOr<int> Handshake(int fd);
  // The connecting side, on a fresh connection to `peer`: OK once `peer` accepted the hello
  // (and, with a token, proved it). `busy`: refused because another connection holds this
  // rank there (Unavailable; worth a retry).
  absl::Status ConnectorHandshake(int fd, int peer, bool& busy);
  // The acceptor's answer to this rank's hello (ring_auth.h), by `deadline`.
  absl::Status ReadVerdict(int fd, int peer, absl::Time deadline, bool& busy) const;
  // Reads frames from `from` until the connection ends: OK at a clean end of stream.
  // `delivered` says whether any frame got through.
  absl::Status ReadFrames(int fd, int from, bool& delivered);
  void CloseReader(int fd);
  // A line about the connection from `peer` ("host:port").
  void Log(absl::string_view peer, absl::string_view what) const;
  absl::Status Connect(int peer, Outgoing& out);
  // Says which rank gave up waiting, and after how long.
  absl::Status Explain(absl::Status s) const;

  const TcpPeerLinkOptions options_;
  const uint64_t job_hash_;
  std::unique_ptr<TcpListener> listener_;
  Mailbox inbox_;
  std::vector<std::unique_ptr<Outgoing>> outgoing_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex readers_mu_;
  std::vector<std::thread> readers_ ABSL_GUARDED_BY(readers_mu_);
  std::vector<int> reader_fds_ ABSL_GUARDED_BY(readers_mu_);  // Open ones only.
  // By rank: the fd of the connection that holds it (-1: none yet).
  std::vector<int> holder_ ABSL_GUARDED_BY(readers_mu_);
  std::atomic<int> pending_handshakes_{0};
  std::atomic<int64_t> sent_{0}, received_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_TCP_PEER_LINK_H_
