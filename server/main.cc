// ps_server: one shard of the parameter server. See --helpfull.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/malloc_tuning.h"
#include "common/net.h"
#include "common/optimizer_flags.h"
#include "common/security_flags.h"
#include "common/telemetry_flags.h"
#include "server/ps_server.h"
#include "server/shard_status.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free port (printed, see --port_file).");
ABSL_FLAG(std::string, port_file, "", "If set, the chosen port is written to this file.");
ABSL_FLAG(int, shard, 0, "Index of this shard, in [0, --num_shards).");
ABSL_FLAG(int, num_shards, 1, "Total number of parameter-server shards.");
ABSL_FLAG(int, num_workers, 1, "Workers that push every step (BSP waits for all of them).");
ABSL_FLAG(double, lr, 0.1, "Learning rate.");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum.");
ABSL_FLAG(double, weight_decay, 0.0,
          "Weight decay: L2 for sgd and adam, decoupled for adamw. (--optimizer, --beta1, "
          "--beta2, --eps and the --lr_schedule flags: see common/optimizer_flags.cc.)");
ABSL_FLAG(std::string, sync, "bsp",
          "bsp (wait for every worker each step), ssp (bounded staleness, see --staleness) or "
          "async (apply every push as it arrives).");
ABSL_FLAG(int, staleness, 0, "ssp: how many steps a worker may run ahead of the slowest.");
ABSL_FLAG(absl::Duration, step_timeout, absl::Seconds(60),
          "Longest wait for the other workers of a step (or for rank 0's init), e.g. 30s.");

ABSL_FLAG(int64_t, max_model_bytes, int64_t{8} << 30,
          "Largest model (fp32 bytes of all tensors) an Init may declare; also bounds the "
          "size of one gRPC message this shard accepts.");
ABSL_FLAG(absl::Duration, malloc_trim_interval, absl::Seconds(10),
          "How often free heap memory is returned to the kernel (0: never), so that a "
          "burst such as a rejected over-limit message does not stay resident.");
ABSL_FLAG(int64_t, max_receive_memory, 0,
          "Bytes that the read buffers of all connections together may hold (gRPC's memory "
          "quota), so that many over-limit messages at once cannot add up: past it gRPC "
          "resets streams with RESOURCE_EXHAUSTED. 0: automatic, 64 MiB + 2 x (workers + 1) x "
          "the largest message (this shard's part of the model once known, the receive limit "
          "before); -1: no bound.");
ABSL_FLAG(int, max_streams_per_rank, 4,
          "Tensor streams one rank may have open at once; more are RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, stream_first_frame_timeout, absl::Seconds(10),
          "A tensor stream that sends no frame this long after it opened is cancelled.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "If set, the shard restores the newest valid checkpoint found there at start and "
          "writes checkpoints there (see --checkpoint_every); workers can then ride out a "
          "restart of this shard.");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "Steps between checkpoints (BSP: steps every worker completed; SSP/async: the "
          "slowest worker's steps); 0: none written. Give every shard of a job the same value.");
ABSL_FLAG(int, checkpoint_keep, 3, "Newest checkpoints kept in --checkpoint_dir.");
ABSL_FLAG(int64_t, max_chunks, int64_t{1} << 16,
          "Most chunks (over all shards) a model may be split into.");

int main(int argc, char** argv) {
  dptrain::KeepTensorBuffersInHeap();
  absl::SetProgramUsageMessage("One shard of the dptrain parameter server.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "ps_server: unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    std::cerr << "ps_server: --port must be in [0, 65535], got " << port << "\n";
    return 2;
  }

  auto credentials = dptrain::CredentialsFromFlags();
  if (!credentials.ok()) {
    std::cerr << "ps_server: " << credentials.status().message() << "\n";
    return 2;
  }
  if (const std::string warning = (*credentials)->Warning(); !warning.empty()) {
    std::cerr << "ps_server: warning: " << warning << std::endl;
  }
  for (const std::string& warning : (*credentials)->FileWarnings()) {
    std::cerr << "ps_server: warning: " << warning << std::endl;
  }

  dptrain::PsServerOptions options;
  options.credentials = *credentials;
  options.listen_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", port);
  options.shard.shard = absl::GetFlag(FLAGS_shard);
  options.shard.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.shard.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.shard.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  dptrain::OptimizerOptions optimizer;
  optimizer.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  optimizer.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  auto with_flags = dptrain::OptimizerFromFlags(optimizer);
  if (!with_flags.ok()) {
    std::cerr << "ps_server: " << with_flags.status().message() << "\n";
    return 2;
  }
  options.shard.optimizer = *with_flags;
  auto schedule = dptrain::LrScheduleFromFlags(absl::GetFlag(FLAGS_lr), options.shard.num_workers);
  if (!schedule.ok()) {
    std::cerr << "ps_server: " << schedule.status().message() << "\n";
    return 2;
  }
  options.shard.lr_schedule = *schedule;

  auto policy = dptrain::ParseSyncPolicy(absl::GetFlag(FLAGS_sync));
  if (!policy.ok()) {
    std::cerr << "ps_server: --sync: " << policy.status().message() << "\n";
    return 2;
  }
  options.shard.policy = *policy;
  options.shard.staleness = absl::GetFlag(FLAGS_staleness);
  options.shard.limits.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  options.shard.limits.max_chunks = absl::GetFlag(FLAGS_max_chunks);
  // One message carries at most this shard's part of the model, plus framing.
  options.max_receive_message_bytes = static_cast<int>(std::min<int64_t>(
      dptrain::kMaxMessageBytes, options.shard.limits.max_model_bytes + (int64_t{1} << 20)));
  options.max_receive_memory_bytes = absl::GetFlag(FLAGS_max_receive_memory);
  if (options.max_receive_memory_bytes < -1) {
    std::cerr << "ps_server: --max_receive_memory must be -1 (no bound), 0 (automatic) or a "
                 "size in bytes\n";
    return 2;
  }
  options.stream.max_streams_per_rank = absl::GetFlag(FLAGS_max_streams_per_rank);
  options.stream.first_frame_timeout = absl::GetFlag(FLAGS_stream_first_frame_timeout);
  if (options.stream.first_frame_timeout <= absl::ZeroDuration()) {
    std::cerr << "ps_server: --stream_first_frame_timeout must be positive\n";
    return 2;
  }
  options.shard.checkpoints.dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.shard.checkpoints.every = absl::GetFlag(FLAGS_checkpoint_every);
  options.shard.checkpoints.keep = absl::GetFlag(FLAGS_checkpoint_keep);

  // Signals are taken synchronously by this thread; every thread started later inherits
  // the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto telemetry =
      dptrain::TelemetryFromFlags(absl::StrCat("ps_server shard ", options.shard.shard));
  if (!telemetry.ok()) {
    std::cerr << "ps_server: " << telemetry.status().message() << "\n";
    return 2;
  }
  options.metrics = &(*telemetry)->registry;
  options.trace = (*telemetry)->trace.get();

  auto server = dptrain::PsServer::Start(options);
  if (!server.ok()) {
    std::cerr << "ps_server: " << server.status().message() << "\n";
    return 1;
  }
  const int chosen = (*server)->port();
  std::cout << "ps_server: shard " << options.shard.shard << "/" << options.shard.num_shards
            << " for " << options.shard.num_workers << " workers listening on port " << chosen
            << ((*credentials)->tls() ? " (mutual TLS" : " (plaintext")
            << ((*credentials)->job_token().empty() ? ")" : ", job token)") << std::endl;
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (auto s = dptrain::WritePortFile(port_file, chosen); !s.ok()) {
      std::cerr << "ps_server: " << s.message() << "\n";
      return 1;
    }
  }
  dptrain::PsServer* running = server->get();
  if (auto s =
          dptrain::ServeMetrics(**telemetry, absl::StrCat("ps_server: shard ", options.shard.shard),
                                (*credentials)->tls(),
                                [running] {
                                  dptrain::proto::ShardInfoResponse info;
                                  dptrain::FillShardInfo(running->shard(), &info);
                                  return dptrain::ShardInfoJson(info);
                                });
      !s.ok()) {
    std::cerr << "ps_server: " << s.message() << "\n";
    return 1;
  }
  int signal = 0;
  const absl::Duration trim_interval = absl::GetFlag(FLAGS_malloc_trim_interval);
  if (trim_interval > absl::ZeroDuration()) {
    const timespec wait = absl::ToTimespec(trim_interval);
    while ((signal = sigtimedwait(&signals, nullptr, &wait)) < 0) {
      dptrain::ReturnFreeMemoryToKernel();
    }
  } else {
    sigwait(&signals, &signal);
  }
  std::cout << "ps_server: shard " << options.shard.shard << " stopping on signal " << signal
            << std::endl;
  const dptrain::ParameterShard::Info info = (*server)->shard().GetInfo();
  std::cout << "ps_server: shard " << options.shard.shard << " served version " << info.version
            << ", " << info.pushes << " pushes, staleness max " << info.max_staleness << " mean "
            << info.mean_staleness << ", non-finite gradients skipped " << info.nonfinite_steps
            << " steps, " << info.nonfinite_pushes << " pushes";
  if (!options.shard.checkpoints.dir.empty()) {
    std::cout << ", checkpoints written " << info.checkpoints_written << " (newest step "
              << info.checkpoint_step << ", " << info.checkpoint_bytes << " tensor bytes in "
              << info.checkpoint_seconds << " s; mean write "
              << (info.checkpoints_written > 0
                      ? info.checkpoint_seconds_total / info.checkpoints_written
                      : 0)
              << " s), failed " << info.checkpoint_failures << ", rollbacks " << info.rollbacks;
  }
  std::cout << std::endl;
  (*server)->Shutdown();
  if ((*telemetry)->trace != nullptr) {
    if (auto s = (*telemetry)->trace->Flush(); !s.ok()) {
      std::cerr << "ps_server: " << s.message() << "\n";
    }
  }
  return 0;
}
