#include "python/native/dptrain_c.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json_number.h"
#include "common/sparse_rows.h"
#include "common/wire_dtype.h"
#include "nlohmann/json.hpp"
#include "python/native/session.h"

struct dpt_session {
  std::unique_ptr<dptrain::Session> session;
};

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  return s.ok() ? 0 : static_cast<int>(s.code());
}

absl::Status ParseOptions(const char* text, dptrain::SessionOptions& o) {
  nlohmann::json j = nlohmann::json::parse(text != nullptr ? text : "", nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("the session options are not a JSON object");
  }
  auto seconds = [](const nlohmann::json& v) {
    return absl::Seconds(dptrain::JsonNumber<double>(v));
  };
  try {
    for (const auto& [key, v] : j.items()) {
      if (key == "mode")
        o.mode = v.get<std::string>();
      else if (key == "rank")
        o.rank = dptrain::JsonNumber<int>(v);
      else if (key == "world_size")
        o.world_size = dptrain::JsonNumber<int>(v);
      else if (key == "job_id")
        o.job_id = v.get<std::string>();
      else if (key == "ps")
        o.ps = v.get<std::vector<std::string>>();
      else if (key == "master_addr")
        o.master_addr = v.get<std::string>();
      else if (key == "master_port")
        o.master_port = dptrain::JsonNumber<int>(v);
      else if (key == "bind_address")
        o.bind_address = v.get<std::string>();
      else if (key == "advertise_host")
        o.advertise_host = v.get<std::string>();
      else if (key == "tls_cert")
        o.security.tls_cert = v.get<std::string>();
      else if (key == "tls_key")
        o.security.tls_key = v.get<std::string>();
      else if (key == "tls_ca")
        o.security.tls_ca = v.get<std::string>();
      else if (key == "job_token_file")
        o.security.job_token_file = v.get<std::string>();
      else if (key == "timeout_s")
        o.timeout = seconds(v);
      else if (key == "connect_timeout_s")
        o.connect_timeout = seconds(v);
      else if (key == "reconnect_timeout_s")
        o.reconnect_timeout = seconds(v);
      else if (key == "wire_dtype") {
        absl::StatusOr<dptrain::DType> wire = dptrain::ParseWireDtype(v.get<std::string>());
        if (!wire.ok()) return wire.status();
        o.wire_dtype = *wire;
      } else
        return absl::InvalidArgumentError(absl::StrCat("unknown session option '", key, "'"));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad session option: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<dptrain::TensorInfo>> Tensors(const char* names, const int64_t* sizes,
                                                         int64_t count) {
  if (names == nullptr || (count > 0 && sizes == nullptr) || count < 0) {
    return absl::InvalidArgumentError("null tensor names or sizes");
  }
  const std::vector<std::string> split =
      count == 0 ? std::vector<std::string>{} : absl::StrSplit(names, '\n');
  if (static_cast<int64_t>(split.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(split.size(), " tensor names for ", count, " sizes"));
  }
  std::vector<dptrain::TensorInfo> tensors;
  for (int64_t i = 0; i < count; ++i) tensors.push_back({split[i], sizes[i]});
  return tensors;
}

absl::Status Usable(const dpt_session* s, const void* data, int64_t n) {
  if (s == nullptr || s->session == nullptr) return absl::InvalidArgumentError("no session");
  if (n < 0 || (n > 0 && data == nullptr)) return absl::InvalidArgumentError("bad buffer");
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int dpt_abi_version(void) { return 4; }
const char* dpt_last_error(void) { return last_error.c_str(); }

int dpt_create(const char* options_json, dpt_session** out) {
  if (out == nullptr) return Fail(absl::InvalidArgumentError("null output"));
  *out = nullptr;
  dptrain::SessionOptions options;
  if (auto s = ParseOptions(options_json, options); !s.ok()) return Fail(s);
  auto session = dptrain::Session::Create(options);
  if (!session.ok()) return Fail(session.status());
  *out = new dpt_session{*std::move(session)};
  return 0;
}

void dpt_destroy(dpt_session* session) { delete session; }

int dpt_rank(const dpt_session* s) { return s->session->rank(); }
int dpt_world_size(const dpt_session* s) { return s->session->world_size(); }
int dpt_master_port(const dpt_session* s) { return s->session->master_port(); }

int dpt_broadcast(dpt_session* s, float* data, int64_t n, int root) {
  if (auto u = Usable(s, data, n); !u.ok()) return Fail(u);
  return Fail(s->session->Broadcast(absl::MakeSpan(data, n), root));
}

int dpt_allreduce(dpt_session* s, float* data, int64_t n, int average) {
  if (auto u = Usable(s, data, n); !u.ok()) return Fail(u);
  return Fail(s->session->AllReduce(absl::MakeSpan(data, n), average != 0));
}

int dpt_allreduce_gradient(dpt_session* s, float* data, int64_t n) {
  if (auto u = Usable(s, data, n); !u.ok()) return Fail(u);
  return Fail(s->session->AllReduce(absl::MakeSpan(data, n), true, /*gradient=*/true));
}

int dpt_check_same(dpt_session* s, const char* what, const char* description) {
  if (auto u = Usable(s, what, 0); !u.ok()) return Fail(u);
  if (what == nullptr || description == nullptr) {
    return Fail(absl::InvalidArgumentError("null description"));
  }
  return Fail(s->session->CheckSame(what, description));
}

int dpt_register_gradients(dpt_session* s, const char* names, const int64_t* sizes, int64_t count) {
  if (auto u = Usable(s, names, 0); !u.ok()) return Fail(u);
  auto tensors = Tensors(names, sizes, count);
  if (!tensors.ok()) return Fail(tensors.status());
  return Fail(s->session->RegisterGradients(*tensors));
}

int dpt_reduce_gradients(dpt_session* s, float* gradient_and_flag, int64_t n, int* skipped) {
  if (auto u = Usable(s, gradient_and_flag, n); !u.ok()) return Fail(u);
  auto result = s->session->ReduceGradients(absl::MakeSpan(gradient_and_flag, n));
  if (!result.ok()) return Fail(result.status());
  if (skipped != nullptr) *skipped = *result ? 1 : 0;
  return 0;
}

int dpt_reduce_begin(dpt_session* s, float* gradient_and_flag, int64_t n) {
  if (auto u = Usable(s, gradient_and_flag, n); !u.ok()) return Fail(u);
  if (auto b = s->session->BeginReduce(absl::MakeSpan(gradient_and_flag, n)); !b.ok()) {
    return Fail(b);
  }
  return 0;
}

int dpt_reduce_ready(dpt_session* s, int64_t upto) {
  if (s == nullptr || s->session == nullptr) return Fail(absl::InvalidArgumentError("no session"));
  s->session->ReadyUpTo(upto);
  return 0;
}

int dpt_reduce_cancel(dpt_session* s) {
  if (s == nullptr || s->session == nullptr) return Fail(absl::InvalidArgumentError("no session"));
  s->session->CancelReduce();
  return 0;
}

int dpt_reduce_end(dpt_session* s, int* skipped) {
  if (s == nullptr || s->session == nullptr) return Fail(absl::InvalidArgumentError("no session"));
  auto result = s->session->EndReduce();
  if (!result.ok()) return Fail(result.status());
  if (skipped != nullptr) *skipped = *result ? 1 : 0;
  return 0;
}

int dpt_start_server(dpt_session* s, const char* names, const int64_t* sizes, int64_t count,
                     float* weights, int64_t n, int64_t* resume_step) {
  if (auto u = Usable(s, weights, n); !u.ok()) return Fail(u);
  auto tensors = Tensors(names, sizes, count);
  if (!tensors.ok()) return Fail(tensors.status());
  auto step = s->session->StartServer(*tensors, absl::MakeSpan(weights, n));
  if (!step.ok()) return Fail(step.status());
  if (resume_step != nullptr) *resume_step = *step;
  return 0;
}

int dpt_push_pull(dpt_session* s, int64_t step, float* gradient_and_flag, float* weights, int64_t n,
                  int* skipped, int64_t* rewind_to) {
  if (auto u = Usable(s, weights, n); !u.ok()) return Fail(u);
  if (gradient_and_flag == nullptr) return Fail(absl::InvalidArgumentError("null gradient"));
  auto outcome = s->session->PushPull(step, absl::MakeSpan(gradient_and_flag, n + 1),
                                      absl::MakeSpan(weights, n));
  if (!outcome.ok()) return Fail(outcome.status());
  if (skipped != nullptr) *skipped = outcome->skipped ? 1 : 0;
  if (rewind_to != nullptr) *rewind_to = outcome->rewind_to;
  return 0;
}

int dpt_sparse_declare(dpt_session* s, const char* spec_json, int64_t* step) {
  if (auto u = Usable(s, spec_json, 0); !u.ok()) return Fail(u);
  nlohmann::json j = nlohmann::json::parse(spec_json != nullptr ? spec_json : "", nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Fail(absl::InvalidArgumentError("the sparse table spec is not a JSON object"));
  }
  dptrain::proto::SparseTableSpec spec;
  // A number the field's type cannot hold (seed=2**64, seed=-1, dim=16.5) is an error.
  const char* field = "";  // The one being read, for the error.
  auto number = [&j, &field](const char* key, auto fallback) {
    using T = decltype(fallback);
    field = key;
    return j.contains(key) ? dptrain::JsonNumber<T>(j.at(key)) : fallback;
  };
  try {
    field = "name";
    spec.set_name(j.value("name", ""));
    spec.set_rows(number("rows", int64_t{0}));
    spec.set_dim(number("dim", 0));
    field = "optimizer";
    spec.set_optimizer(j.value("optimizer", "adagrad"));
    spec.set_lr(number("lr", 0.01f));
    spec.set_eps(number("eps", 1e-10));
    spec.set_beta1(number("beta1", 0.9));
    spec.set_beta2(number("beta2", 0.999));
    spec.set_seed(number("seed", uint64_t{0}));
  } catch (const nlohmann::json::exception& e) {
    const std::string where = *field ? absl::StrCat(field, ": ") : "";
    return Fail(absl::InvalidArgumentError(absl::StrCat("bad sparse table spec: ", where, e.what())));
  }
  auto declared = s->session->SparseDeclare(spec);
  if (!declared.ok()) return Fail(declared.status());
  if (step != nullptr) *step = *declared;
  return 0;
}

int dpt_sparse_pull(dpt_session* s, const char* table, int dim, const int64_t* ids, int64_t n,
                    float* out) {
  if (auto u = Usable(s, ids, n); !u.ok()) return Fail(u);
  if (table == nullptr || dim < 1 || (n > 0 && out == nullptr)) {
    return Fail(absl::InvalidArgumentError("sparse pull: null table or output, or dim < 1"));
  }
  return Fail(s->session->SparsePull(table, dim, absl::MakeConstSpan(ids, n),
                                     absl::MakeSpan(out, n * dim)));
}

int dpt_sparse_push(dpt_session* s, const char* table, int dim, int64_t step, const int64_t* ids,
                    int64_t n, const float* grads) {
  if (auto u = Usable(s, ids, n); !u.ok()) return Fail(u);
  if (table == nullptr || dim < 1 || (n > 0 && grads == nullptr)) {
    return Fail(absl::InvalidArgumentError("sparse push: null table or gradients, or dim < 1"));
  }
  return Fail(s->session->SparsePush(table, dim, step, absl::MakeConstSpan(ids, n),
                                     absl::MakeConstSpan(grads, n * dim)));
}

int dpt_sparse_step(dpt_session* s, const char* table, int64_t* step) {
  if (auto u = Usable(s, table, 0); !u.ok()) return Fail(u);
  if (table == nullptr || step == nullptr) return Fail(absl::InvalidArgumentError("null argument"));
  auto at = s->session->SparseStep(table);
  if (!at.ok()) return Fail(at.status());
  *step = *at;
  return 0;
}

int dpt_sparse_rollback(dpt_session* s, const char* table, int64_t step) {
  if (auto u = Usable(s, table, 0); !u.ok()) return Fail(u);
  if (table == nullptr) return Fail(absl::InvalidArgumentError("null table"));
  return Fail(s->session->SparseRollback(table, step));
}

int dpt_rewind(dpt_session* s, int64_t step, float* weights, int64_t n) {
  if (auto u = Usable(s, weights, n); !u.ok()) return Fail(u);
  return Fail(s->session->Rewind(step, absl::MakeSpan(weights, n)));
}

int dpt_sparse_initial_rows(uint64_t seed, const char* table, const int64_t* ids, int64_t n,
                            int dim, float* out) {
  if (table == nullptr || n < 0 || dim < 1 || (n > 0 && (ids == nullptr || out == nullptr))) {
    return Fail(absl::InvalidArgumentError("initial rows: bad arguments"));
  }
  for (int64_t i = 0; i < n; ++i) {
    dptrain::InitialRow(seed, table, ids[i], absl::MakeSpan(out + i * dim, dim));
  }
  return 0;
}

}  // extern "C"
