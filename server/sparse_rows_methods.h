// The sparse tables' row path as raw frames (proto/ps.proto, SparseRows; the frames are
// common/sparse_frames.h): Pull and Push of SparseService without protobuf in the bytes' way.
// A pull is answered on gRPC's callback thread (it only copies rows); a push runs on a thread
// of its own, since under BSP it waits for the other workers. Pushes in flight are bounded
// (RESOURCE_EXHAUSTED beyond), so that no caller can make the shard start threads without end.
#ifndef DPTRAIN_SERVER_SPARSE_ROWS_METHODS_H_
#define DPTRAIN_SERVER_SPARSE_ROWS_METHODS_H_

#include <atomic>

#include "server/generic_methods.h"
#include "server/sparse_service.h"

namespace dptrain {

class SparseRowsMethods {
 public:
  // `service` must outlive the gRPC server these methods are added to.
  // `max_pushes`: pushes being served at once (a worker has one per step).
  SparseRowsMethods(SparseService* service, int max_pushes)
      : service_(service), max_pushes_(max_pushes) {}

  // Adds Pull and Push to `methods`. This object must outlive the server.
  void AddTo(GenericMethods& methods);

  // Pushes being served now (status and tests).
  int pushes_in_flight() const { return pushes_.load(); }
  // Frame bytes received and sent.
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  friend class SparseRowsReactor;
  SparseService* const service_;
  const int max_pushes_;
  std::atomic<int> pushes_{0};
  std::atomic<int64_t> bytes_received_{0}, bytes_sent_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SPARSE_ROWS_METHODS_H_
