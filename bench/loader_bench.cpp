// The training loader alone, as `colossal train` builds it from a config: the dataset with the
// config's transforms, batches of data.batch_size collated (into pinned memory and copied to the
// GPU when there is one), at each worker count asked for, in two forms: every transform per sample
// with mixup as the batch transform (the reference), and the staged form colossal train runs
// (Note [Batch stages]: the per-sample part up to the last uint8 step on the workers, the rest on
// the GPU after the copy, or on the workers with --device cpu). Prints images/s (or tokens/s) per
// worker count, to set beside the training step's need (issue 18: the loader must keep up with the
// GPU on the tutorial's own path).
//
//   loader_bench --config configs/vit_b16_cifar10.toml [--set key=value ...] [--workers 1,2,4,8]
//                [--batches N] [--warmup N] [--device cpu|cuda]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "colossal/core/cuda_device.h"  // is_available, synchronize
#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/initialize/builders.h"
#include "colossal/initialize/training_run.h"  // load_run_config

using namespace colossal;

namespace {

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "loader_bench: %s\n"
               "usage: loader_bench --config FILE [--set key=value ...] [--workers 1,2,4,8] [--batches N]\n"
               "                    [--warmup N] [--device cpu|cuda]\n"
               "  Times the training loader of the config (its dataset, transforms, batch size and mixup) at\n"
               "  each worker count; --device cuda (the default when a GPU is there) adds the pinned\n"
               "  collation and the copy to the GPU, as colossal train does.\n",
               problem.c_str());
  std::exit(2);
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0) usage(fmt::format("--workers needs counts >= 0, got '{}'", text));
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<int64_t> workers{1, 2, 4, 8};
  int64_t batches = 30, warmup = 5;
  std::string device_name = core::cuda::is_available() ? "cuda" : "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("the training loader alone");
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    if (flag == "--config") {
      config_path = value;
    } else if (flag == "--set") {
      overrides.push_back(value);
    } else if (flag == "--workers") {
      workers = parse_list(value);
    } else if (flag == "--batches") {
      batches = std::max<int64_t>(1, std::atoll(value.c_str()));
    } else if (flag == "--warmup") {
      warmup = std::max<int64_t>(0, std::atoll(value.c_str()));
    } else if (flag == "--device") {
      if (value != "cpu" && value != "cuda") usage(fmt::format("--device is cpu or cuda, got '{}'", value));
      device_name = value;
    } else {
      usage(fmt::format("unknown option '{}'", flag));
    }
  }
  if (config_path.empty()) usage("--config is required");
  // Batches per second of one loader over `batches` batches after `warmup`; 0 when it has none.
  const auto time_loader = [&](data::DataLoader& loader, const std::optional<Device>& device) {
    loader.start(0);
    for (int64_t b = 0; b < warmup; ++b) {
      if (!loader.next()) break;
    }
    const auto start = std::chrono::steady_clock::now();
    int64_t done = 0;
    for (; done < batches; ++done) {
      if (!loader.next()) break;
    }
    // The staged batches' kernels and the copies are queued on the GPU: wait for them.
    if (device) core::cuda::synchronize(*device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return done == 0 ? 0.0 : static_cast<double>(done) / s;
  };
  try {
    const config::TrainConfig c = initialize::load_run_config(config_path, overrides);
    const initialize::Datasets d = initialize::make_datasets(c);
    const bool images = d.image_size > 0;
    const int64_t per_sample = images ? 1 : d.seq_len;
    fmt::print("{}: {} samples, batch {}, {}{}\n", config_path, d.train->size(), c.data.batch_size,
               images ? fmt::format("{} x {} x {} images", d.channels, d.image_size, d.image_size)
                      : fmt::format("{} tokens per sample", d.seq_len),
               d.batch_transform ? ", with the batch transform (mixup)" : "");
    const char* unit = images ? "images/s" : "tokens/s";
    fmt::print("{:>8} {:>12} {:>14} {:>12} {:>14}\n", "workers", "ms/batch", fmt::format("{} ref", unit), "ms/batch",
               fmt::format("{} staged", unit));
    if (d.staged) fmt::print("staged: per batch {}\n", d.staged->train_stage->name());
    for (const int64_t w : workers) {
      data::DataLoaderOptions lo;
      lo.batch_size = c.data.batch_size;
      lo.drop_last = true;
      lo.shuffle = true;
      lo.seed = static_cast<uint64_t>(c.train.seed);
      lo.num_workers = w;
      lo.batch_transform = d.batch_transform;
      if (device_name == "cuda") lo.device = core::cuda_device(0);
      double reference = 0, staged = 0;
      {
        data::DataLoader loader(d.train, lo);
        reference = time_loader(loader, lo.device);
      }
      if (d.staged) {
        lo.batch_transform = nullptr;
        lo.batch_stage = d.staged->train_stage;
        data::DataLoader loader(d.staged->train, lo);
        staged = time_loader(loader, lo.device);
      }
      const auto row = [&](double batches_per_s) {
        if (batches_per_s == 0) return fmt::format("{:>12} {:>14}", "-", "-");
        return fmt::format("{:>12.2f} {:>14.0f}", 1e3 / batches_per_s,
                           batches_per_s * static_cast<double>(c.data.batch_size * per_sample));
      };
      fmt::print("{:>8} {} {}\n", w, row(reference), row(staged));
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
