/* The C ABI of dptrain.torch's native library (libdptrain_c.so), loaded by Python's ctypes
 * (python/dptrain/_native.py): plain C types only, no framework headers, so that one build
 * serves every Python and PyTorch version. A thin layer over session.h, whose comments hold
 * the contracts (every call but the getters is collective).
 *
 * Errors: every int-returning call returns 0 on success, else the absl::StatusCode (> 0) of
 * the failure, whose one-line message dpt_last_error() returns (per thread, until the
 * thread's next failing call). Buffers are the caller's, fp32 values, `n` of them. */
#ifndef DPTRAIN_PYTHON_NATIVE_DPTRAIN_C_H_
#define DPTRAIN_PYTHON_NATIVE_DPTRAIN_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dpt_session dpt_session;

/* The version of this ABI; the Python side refuses a library of another. */
int dpt_abi_version(void);
const char* dpt_last_error(void);

/* `options_json`: {"mode": "allreduce"|"ps"|"master", "rank", "world_size", "job_id",
 * "ps": ["host:port", ...], "master_addr", "master_port", "bind_address", "advertise_host",
 * "tls_cert", "tls_key", "tls_ca", "job_token_file", "timeout_s", "connect_timeout_s",
 * "reconnect_timeout_s"}; absent keys take session.h's defaults, unknown keys are an error. */
int dpt_create(const char* options_json, dpt_session** out);
void dpt_destroy(dpt_session* session);

int dpt_rank(const dpt_session* session);
int dpt_world_size(const dpt_session* session);
int dpt_master_port(const dpt_session* session);

int dpt_broadcast(dpt_session* session, float* data, int64_t n, int root);
int dpt_allreduce(dpt_session* session, float* data, int64_t n, int average);
/* As dpt_allreduce (the mean) for a bucket of gradients: travels as the wire dtype. */
int dpt_allreduce_gradient(dpt_session* session, float* data, int64_t n);
int dpt_check_same(dpt_session* session, const char* what, const char* description);

/* `names`: the tensors' names joined by '\n'; `sizes`: their element counts. */
int dpt_register_gradients(dpt_session* session, const char* names, const int64_t* sizes,
                           int64_t count);
/* `n`: the registered elements + 1 (the overflow flag). `skipped`: 1 if the step must be
 * skipped on every rank. */
int dpt_reduce_gradients(dpt_session* session, float* gradient_and_flag, int64_t n, int* skipped);
// The same in parts (ps and master mode, pushing while backward runs): begin with the whole
// buffer (its flag set), say how many leading values are final as buckets complete, end to
// get the mean in place; cancel if backward failed (end then fails, no shard counts it).
int dpt_reduce_begin(dpt_session* session, float* gradient_and_flag, int64_t n);
int dpt_reduce_ready(dpt_session* session, int64_t upto);
int dpt_reduce_cancel(dpt_session* session);
int dpt_reduce_end(dpt_session* session, int* skipped);

int dpt_start_server(dpt_session* session, const char* names, const int64_t* sizes, int64_t count,
                     float* weights, int64_t n, int64_t* resume_step);
int dpt_push_pull(dpt_session* session, int64_t step, float* gradient_and_flag, float* weights,
                  int64_t n, int* skipped, int64_t* rewind_to);

/* Row-sparse embedding tables (session.h). `spec_json`: {"name", "rows", "dim",
 * "optimizer": "sgd"|"adagrad"|"adam", "lr", "eps", "beta1", "beta2", "seed"}. */
int dpt_sparse_declare(dpt_session* session, const char* spec_json, int64_t* step);
int dpt_sparse_pull(dpt_session* session, const char* table, int dim, const int64_t* ids, int64_t n,
                    float* out);
int dpt_sparse_push(dpt_session* session, const char* table, int dim, int64_t step,
                    const int64_t* ids, int64_t n, const float* grads);
/* After a shard restart (session.h): the table's lowest next step over the shards; every
   shard's table back to `step`; ServerOptimizer's shards back to `step` with their weights
   into `weights` (n values). */
int dpt_sparse_step(dpt_session* session, const char* table, int64_t* step);
int dpt_sparse_rollback(dpt_session* session, const char* table, int64_t step);
int dpt_rewind(dpt_session* session, int64_t step, float* weights, int64_t n);
/* A table's initial rows (common/sparse_rows.h), without a session: n x dim into `out`. */
int dpt_sparse_initial_rows(uint64_t seed, const char* table, const int64_t* ids, int64_t n,
                            int dim, float* out);

#ifdef __cplusplus
}
#endif

#endif /* DPTRAIN_PYTHON_NATIVE_DPTRAIN_C_H_ */
