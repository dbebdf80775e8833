#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>
#include <vector>
#include "worker/nn/model.h"
using namespace dptrain::nn;
int main(int argc, char** argv) {
  const int batch = atoi(argv[1]), threads = atoi(argv[2]), steps = atoi(argv[3]);
  const char* name = argc > 4 ? argv[4] : "resnet18";
  auto model = CreateModel({name, 1, threads});
  if (!model.ok()) return 1;
  std::vector<float> images(batch * 784);
  std::vector<uint8_t> labels(batch);
  for (size_t i = 0; i < images.size(); ++i) images[i] = (i * 37 % 101) / 101.0f;
  for (int i = 0; i < batch; ++i) labels[i] = i % 10;
  (*model)->TrainStep(images.data(), labels.data(), batch);
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) (*model)->TrainStep(images.data(), labels.data(), batch);
  auto t1 = std::chrono::steady_clock::now();
  rusage ru; getrusage(RUSAGE_SELF, &ru);
  printf("%s batch %d threads %d: %.3f s/step, maxrss %.0f MiB\n", name, batch, threads,
         std::chrono::duration<double>(t1 - t0).count() / steps, ru.ru_maxrss / 1024.0);
}
