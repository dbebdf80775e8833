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

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_GEMM_H_
