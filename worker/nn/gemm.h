// Thin overloads over OpenBLAS so that layers can be written once for float (training) and
// double (gradient checks in tests).
#ifndef DPTRAIN_WORKER_NN_GEMM_H_
#define DPTRAIN_WORKER_NN_GEMM_H_

namespace dptrain {
namespace nn {

// Row-major C = alpha * op(A) * op(B) + beta * C, where op(X) is X or X^T; op(A) is m x k,
// op(B) is k x n and C is m x n; lda/ldb/ldc are the row strides of A, B and C as stored.
// With beta == 0, C need not be initialised.
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc);

// Sets the number of OpenBLAS threads. Process-wide: affects every BLAS call in the process.
void SetBlasThreads(int threads);

// Runs BLAS on `threads` threads for the scope's lifetime and on 1 thread after: for a layer
// that hands a whole GEMM to BLAS's threads in a model that otherwise keeps BLAS at 1
// (DenseGemm::kBlasThreads). Process-wide, like SetBlasThreads; no BLAS call may be running
// on another thread meanwhile (the layers run one at a time, regions return before the next).
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads) { SetBlasThreads(threads); }
  ~ScopedBlasThreads() { SetBlasThreads(1); }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_GEMM_H_
