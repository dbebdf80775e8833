// Test helper for the raw-byte frames (tensor_frame.h, sparse_frames.h): a frame re-cut into
// slices of a given size, as a network read might deliver it.
#ifndef DPTRAIN_COMMON_FRAME_TESTING_H_
#define DPTRAIN_COMMON_FRAME_TESTING_H_

#include <algorithm>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"

namespace dptrain {

inline grpc::ByteBuffer Recut(grpc::ByteBuffer& frame, size_t piece) {
  grpc::Slice whole;
  EXPECT_TRUE(frame.DumpToSingleSlice(&whole).ok());
  std::vector<grpc::Slice> pieces;
  for (size_t at = 0; at < whole.size(); at += piece) {
    pieces.emplace_back(whole.begin() + at, std::min(piece, whole.size() - at));
  }
  return grpc::ByteBuffer(pieces.data(), pieces.size());
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_FRAME_TESTING_H_
