#include "worker/gpu_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dptrain {
namespace {

constexpr char kPlugin[] = "libdptrain_cuda.so";

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> CudaBackendCandidates() {
  if (const char* env = std::getenv("DPTRAIN_CUDA_BACKEND"); env != nullptr && *env != '\0') {
    return {env};
  }
  const std::string dir = ExecutableDir();
  return {absl::StrCat(dir, "/", kPlugin), absl::StrCat(dir, "/cuda/", kPlugin),
          absl::StrCat(dir, "/../lib/", kPlugin)};
}

absl::StatusOr<std::unique_ptr<cuda::Backend>> LoadCudaBackend() {
  const std::vector<std::string> candidates = CudaBackendCandidates();
  for (const std::string& path : candidates) {
    if (access(path.c_str(), F_OK) != 0 && candidates.size() > 1) continue;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // Never closed.
    if (handle == nullptr) {
      // dlerror() names the file and what is missing (e.g. libcudnn.so.9).
      return absl::UnavailableError(absl::StrCat("cannot load the CUDA backend: ", dlerror()));
    }
    using Create = cuda::Backend* (*)();
    auto create = reinterpret_cast<Create>(dlsym(handle, kDptrainCudaBackendSymbol));
    if (create == nullptr) {
      return absl::UnavailableError(absl::StrCat(path, " has no ", kDptrainCudaBackendSymbol,
                                                 " (not a dptrain CUDA backend?)"));
    }
    return std::unique_ptr<cuda::Backend>(create());
  }
  return absl::UnavailableError(absl::StrCat("no CUDA backend (", kPlugin, ") in ",
                                             absl::StrJoin(candidates, ", ")));
}

}  // namespace dptrain
