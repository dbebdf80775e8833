// PeerLink over plain TCP, for the bulk data of all-reduce mode: one connection per pair of
// ranks that talk (opened on first Send), a reader thread per incoming connection that
// reads each message straight into the receiver's memory when it was expected (Expect:
// copied there, or added through a small buffer that stays in cache), else into this
// rank's Mailbox; and a blocking write per Send.
// Framing: [tag u64][length u64][payload] after a hello of [magic u32][rank u32][job hash u64].
// Fewer copies and no HTTP/2 framing compared with a gRPC call per message.
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
#include "common/mailbox.h"
#include "common/peer_link.h"

namespace dptrain {

// A listening TCP socket on a free port (or `port`), accepting peers in the background
// once a link is attached.
class TcpListener {
 public:
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(int port);
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
};

class TcpPeerLink : public PeerLink {
 public:
  // Takes over `listener` (accepting peers from now on).
  static absl::StatusOr<std::unique_ptr<TcpPeerLink>> Create(
      const TcpPeerLinkOptions& options, std::unique_ptr<TcpListener> listener);
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
  std::vector<int> reader_fds_ ABSL_GUARDED_BY(readers_mu_);
  std::atomic<int64_t> sent_{0}, received_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_TCP_PEER_LINK_H_
