// Compute benchmark: steady-state training throughput of one worker's model on the CPU, for
// each model and math-thread count. One timed step is TrainStep (forward + softmax
// cross-entropy + backward) followed by a plain SGD update w -= lr * g over all weights, which
// is what PyTorch's loop (zero_grad, forward, loss, backward, optimizer.step()) does;
// tools/bench_torch_compute.py measures that loop the same way.
//
// ModelOptions.threads also sets OpenBLAS threads process-wide, so every (model, threads) point
// runs in a fresh child: this binary re-executes itself (/proc/self/exe) with --one=model:threads,
// and the child prints one "result ..." line: the median step time over --steps timed steps
// after --warmup untimed ones, images/s = batch / median, and its peak resident memory
// (getrusage ru_maxrss). The parent stays small (it never builds a model), since Linux carries
// the parent's forked RSS into the child's ru_maxrss.
//
//   bazel build //tests/bench:compute_benchmark
//   bazel-bin/tests/bench/compute_benchmark --models=mlp,lenet,resnet18 --threads=1,2
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/model.h"
#include "worker/thread_plan.h"

ABSL_FLAG(std::string, models, "mlp,lenet,resnet18",
          "Models to measure; one CreateBuiltinModel does not know is skipped with a note.");
ABSL_FLAG(std::string, threads, "1,2",
          "Math-thread counts (or auto, gpu_worker's default plan for this machine); each point "
          "in a fresh process.");
ABSL_FLAG(std::string, dense_gemm, "plan",
          "How the model uses more than one thread: plan (what --threads picks, as gpu_worker), "
          "split (its layers split over the model's pool) or blas (no pool: every GEMM on "
          "BLAS's threads).");
ABSL_FLAG(std::string, conv, "auto",
          "How convolutions compute: auto (oneDNN where the measured rule picks it, as "
          "gpu_worker), im2col, or onednn.");
ABSL_FLAG(int, batch_size, 256, "Images per step.");
ABSL_FLAG(std::string, input, "1x28x28",
          "One image's CxHxW: the models are built for it (3x32x32: CIFAR-shaped), 10 classes.");
ABSL_FLAG(int, warmup, 3, "Untimed steps before the timed ones.");
ABSL_FLAG(int, steps, 20, "Timed steps; the median step time is reported.");
ABSL_FLAG(int, resnet18_warmup, 1, "--warmup for resnet18 (seconds per step).");
ABSL_FLAG(int, resnet18_steps, 3, "--steps for resnet18 (seconds per step).");
ABSL_FLAG(double, lr, 0.01, "Learning rate of the SGD update inside the timed step.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the weights and of the synthetic batch.");
ABSL_FLAG(std::string, csv, "", "If set, append one CSV row per measured point (header if new).");
ABSL_FLAG(std::string, one, "",
          "Internal: measure model:threads in this process and print one result line.");

namespace dptrain {
namespace {

constexpr int kUnknownModelExit = 3;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The child: one (model, threads) point in this process. Prints "result k=v ..." or
// "skip model=... reason=..." and returns the exit code.
int RunOne(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  ThreadPlanInputs plan_inputs;
  plan_inputs.flag = parts.size() == 2 ? parts[1] : "";
  plan_inputs.affinity_cores = AffinityCores();
  plan_inputs.cgroup_cores = CgroupCpuLimit();
  absl::StatusOr<ThreadPlan> plan = PlanThreads(plan_inputs);
  if (!plan.ok() || plan->threads < 1) {
    std::cerr << "--one wants model:threads (threads >= 1 or auto), got '" << spec << "'\n";
    return 2;
  }
  const int threads = plan->threads;
  const std::string dense = absl::GetFlag(FLAGS_dense_gemm);
  if (dense == "split") {
    plan->dense_gemm = nn::DenseGemm::kPoolSplit;
  } else if (dense == "blas") {
    plan->dense_gemm = nn::DenseGemm::kBlasThreads;
  } else if (dense != "plan") {
    std::cerr << "--dense_gemm must be plan, split or blas, got '" << dense << "'\n";
    return 2;
  }
  const std::string conv = absl::GetFlag(FLAGS_conv);
  nn::ConvAlgorithm conv_algorithm = nn::ConvAlgorithm::kAuto;
  if (conv == "im2col") {
    conv_algorithm = nn::ConvAlgorithm::kIm2col;
  } else if (conv == "onednn") {
    conv_algorithm = nn::ConvAlgorithm::kOneDnn;
  } else if (conv != "auto") {
    std::cerr << "--conv must be auto, im2col or onednn, got '" << conv << "'\n";
    return 2;
  }
  const std::string& name = parts[0];
  const bool resnet = name == "resnet18";
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int warmup = resnet ? absl::GetFlag(FLAGS_resnet18_warmup) : absl::GetFlag(FLAGS_warmup);
  const int steps =
      std::max(1, resnet ? absl::GetFlag(FLAGS_resnet18_steps) : absl::GetFlag(FLAGS_steps));
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));

  nn::ModelOptions options;
  options.name = name;
  {
    const std::vector<std::string> dims = absl::StrSplit(absl::GetFlag(FLAGS_input), 'x');
    if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &options.shape.input.c) ||
        !absl::SimpleAtoi(dims[1], &options.shape.input.h) ||
        !absl::SimpleAtoi(dims[2], &options.shape.input.w)) {
      std::cerr << "--input must be CxHxW, got '" << absl::GetFlag(FLAGS_input) << "'\n";
      return 2;
    }
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  options.threads = threads;
  options.dense_gemm = plan->dense_gemm;
  options.conv_algorithm = conv_algorithm;
  absl::StatusOr<std::unique_ptr<nn::Model>> created = graph::CreateBuiltinModel(options);
  if (!created.ok()) {
    const bool unknown = absl::StrContains(created.status().message(), "unknown model");
    std::cout << "skip model=" << name << " reason=" << created.status() << std::endl;
    return unknown ? kUnknownModelExit : 1;
  }
  nn::Model& model = **created;

  // A fixed synthetic batch (the data pipeline is not measured): pixels in [0, 1), labels 0..9.
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(batch) * options.shape.input.size());
  for (float& x : images) x = pixel(rng);
  std::vector<nn::Label> labels(batch);
  for (nn::Label& y : labels) y = static_cast<nn::Label>(rng() % 10);

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::vector<double> step_s, train_s, sgd_s;
  double loss = 0.0;
  for (int i = 0; i < warmup + steps; ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<nn::BatchResult> r = model.TrainStep(images.data(), labels.data(), batch);
    if (!r.ok()) {
      std::cerr << name << ": TrainStep: " << r.status() << "\n";
      return 1;
    }
    const Clock::time_point t1 = Clock::now();
    // Plain SGD, as torch.optim.SGD(lr) without momentum or weight decay.
    std::vector<float>& w = model.weights();
    const absl::Span<const float> g = model.grads();
    float* __restrict wp = w.data();
    const float* __restrict gp = g.data();
    const size_t n = w.size();
    for (size_t k = 0; k < n; ++k) wp[k] -= lr * gp[k];
    const Clock::time_point t2 = Clock::now();
    loss = r->loss;
    if (i < warmup) continue;
    train_s.push_back(seconds(t0, t1));
    sgd_s.push_back(seconds(t1, t2));
    step_s.push_back(seconds(t0, t2));
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double step = Median(step_s);
  std::cout << absl::StrFormat(
                   "result model=%s threads=%s batch=%d warmup=%d steps=%d step_ms=%.3f "
                   "train_ms=%.3f sgd_ms=%.3f images_per_s=%.1f maxrss_mib=%.1f params=%d "
                   "last_loss=%.4f best_images_per_s=%.1f",
                   name, parts[1], batch, warmup, steps, 1e3 * step, 1e3 * Median(train_s),
                   1e3 * Median(sgd_s), batch / step, usage.ru_maxrss / 1024.0,
                   model.weights().size(), loss,
                   batch / *std::min_element(step_s.begin(), step_s.end()))
            << std::endl;
  return 0;
}

// Runs this binary as a child with `args`; returns its exit status and its stdout in `out`.
int RunChild(const std::vector<std::string>& args, std::string& out) {
  int fds[2];
  if (pipe(fds) != 0) {
    perror("pipe");
    return -1;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[1]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    perror("execv /proc/self/exe");
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, got);
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    perror("waitpid");
    return -1;
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// "result a=1 b=x" -> {a: 1, b: x}.
std::map<std::string, std::string> ParseResult(const std::string& line) {
  std::map<std::string, std::string> kv;
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::vector<std::string> p = absl::StrSplit(field, absl::MaxSplits('=', 1));
    if (p.size() == 2) kv[p[0]] = p[1];
  }
  return kv;
}

int RunAll(const char* argv0) {
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  const std::vector<std::string> threads =
      absl::StrSplit(absl::GetFlag(FLAGS_threads), ',', absl::SkipEmpty());
  const std::vector<std::string> columns = {
      "model",  "threads",      "batch",      "warmup", "steps",     "step_ms",          "train_ms",
      "sgd_ms", "images_per_s", "maxrss_mib", "params", "last_loss", "best_images_per_s"};
  const std::string csv_path = absl::GetFlag(FLAGS_csv);
  std::ofstream csv;
  if (!csv_path.empty()) {
    const bool fresh = access(csv_path.c_str(), F_OK) != 0;
    csv.open(csv_path, std::ios::app);
    if (!csv) {
      std::cerr << "cannot open " << csv_path << "\n";
      return 1;
    }
    if (fresh) csv << absl::StrJoin(columns, ",") << "\n";
  }
  std::cout << "Ours: TrainStep (forward + backward) + SGD update w -= lr*g, batch "
            << absl::GetFlag(FLAGS_batch_size) << ", median step\n\n"
            << "| model | threads | step ms | train ms | sgd ms | images/s | peak MiB |\n"
            << "|---|---|---|---|---|---|---|\n";
  int failures = 0;
  std::vector<std::string> notes;
  for (const std::string& model : models) {
    for (const std::string& t : threads) {
      std::vector<std::string> args = {
          argv0,
          absl::StrCat("--one=", model, ":", t),
          absl::StrCat("--batch_size=", absl::GetFlag(FLAGS_batch_size)),
          absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup)),
          absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
          absl::StrCat("--resnet18_warmup=", absl::GetFlag(FLAGS_resnet18_warmup)),
          absl::StrCat("--resnet18_steps=", absl::GetFlag(FLAGS_resnet18_steps)),
          absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)),
          absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
          absl::StrCat("--dense_gemm=", absl::GetFlag(FLAGS_dense_gemm)),
          absl::StrCat("--conv=", absl::GetFlag(FLAGS_conv))};
      std::string out;
      const int code = RunChild(args, out);
      if (code == kUnknownModelExit) {
        notes.push_back(absl::StrCat("skipped ", model, ": CreateBuiltinModel does not know it (",
                                     absl::StripAsciiWhitespace(out), ")"));
        break;  // Same answer for every thread count.
      }
      std::map<std::string, std::string> kv;
      for (absl::string_view line : absl::StrSplit(out, '\n')) {
        if (absl::StartsWith(line, "result ")) kv = ParseResult(std::string(line));
      }
      if (code != 0 || kv.empty()) {
        notes.push_back(absl::StrCat(model, " threads ", t, ": child failed (exit ", code, ")"));
        ++failures;
        continue;
      }
      std::cout << absl::StrFormat("| %s | %s | %s | %s | %s | %s | %s |\n", kv["model"],
                                   kv["threads"], kv["step_ms"], kv["train_ms"], kv["sgd_ms"],
                                   kv["images_per_s"], kv["maxrss_mib"])
                << std::flush;
      if (csv) {
        std::vector<std::string> row;
        for (const std::string& c : columns) row.push_back(kv[c]);
        csv << absl::StrJoin(row, ",") << "\n" << std::flush;
      }
    }
  }
  for (const std::string& note : notes) std::cout << "\nNote: " << note << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string one = absl::GetFlag(FLAGS_one);
  if (!one.empty()) return dptrain::RunOne(one);
  return dptrain::RunAll(argv[0]);
}
