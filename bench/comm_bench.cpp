// Collective bandwidth of our ProcessGroup over NCCL: all_reduce (sum), reduce_scatter (sum) and
// all_gather on bf16 and f32 buffers of 1, 16 and 256 MiB, one process per GPU, every rank started by
// `colossal run --nproc_per_node N --backend processes -- comm_bench`. Rank 0 prints, per op and size,
// the time per call, the algorithm bandwidth and the bus bandwidth (NCCL's conventions; see
// docs/benchmarks.md), and with --jsonl FILE one JSON object per measurement, for
// bench/compare/collectives.py, which measures torch.distributed the same way beside it.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "colossal/comm/init.h"              // init_process_group, read_dist_env
#include "colossal/comm/library_versions.h"  // nccl_version
#include "colossal/comm/pair_all_reduce.h"   // use_pair_all_reduce
#include "colossal/core/cuda_device.h"       // Event, current_stream, set_device, properties

using namespace colossal;

namespace {

struct Options {
  std::vector<int64_t> sizes_mib{1, 16, 256};
  std::vector<DType> dtypes{DType::bf16, DType::f32};
  std::vector<std::string> ops{"all_reduce", "reduce_scatter", "all_gather"};
  int warmup = 10;
  int iters = 50;
  int64_t pair_window_mib = 0;  ///< > 0: all_reduce by the copy engines of a GPU pair through this window
  std::string jsonl;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "comm_bench: %s\n"
               "usage: colossal run --nproc_per_node N --backend processes -- comm_bench [--sizes-mib 1,16,256]\n"
               "           [--dtypes bf16,f32] [--ops all_reduce,reduce_scatter,all_gather] [--warmup 10]\n"
               "           [--iters 50] [--jsonl FILE] [--pair-window-mib N]\n"
               "  Times each collective over the NCCL world of the launcher's ranks (one GPU each): --warmup\n"
               "  untimed calls, then --iters calls between two CUDA events on the caller's stream. Rank 0\n"
               "  prints the slowest rank's time per call, algbw = bytes / time and busbw (all_reduce:\n"
               "  algbw * 2(n-1)/n; reduce_scatter, all_gather: algbw * (n-1)/n), bytes being the full,\n"
               "  unsharded buffer; --jsonl FILE also writes them as JSON lines. --pair-window-mib N (2 ranks):\n"
               "  all_reduce of 1 MiB and more by the copy engines through a window of N MiB (Note [Pair\n"
               "  all-reduce by the copy engines]).\n",
               problem.c_str());
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& value) {
  std::vector<std::string> items;
  std::stringstream stream(value);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

int64_t parse_int(const std::string& flag, const std::string& value, int64_t min) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= min) return v;
  } catch (const std::exception&) {
  }
  usage(fmt::format("{} needs an integer >= {}, got '{}'", flag, min, value));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("collective bandwidth benchmark");
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    if (flag == "--sizes-mib") {
      o.sizes_mib.clear();
      for (const std::string& item : split_list(value)) o.sizes_mib.push_back(parse_int(flag, item, 1));
    } else if (flag == "--dtypes") {
      o.dtypes.clear();
      for (const std::string& item : split_list(value)) {
        try {
          o.dtypes.push_back(core::parse_dtype(item));
        } catch (const std::exception& e) {
          usage(e.what());
        }
      }
    } else if (flag == "--ops") {
      o.ops = split_list(value);
      for (const std::string& op : o.ops) {
        if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather") {
          usage(fmt::format("unknown op '{}'; valid: all_reduce, reduce_scatter, all_gather", op));
        }
      }
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--iters") {
      o.iters = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--pair-window-mib") {
      o.pair_window_mib = parse_int(flag, value, 0);
    } else if (flag == "--jsonl") {
      o.jsonl = value;
    } else {
      usage(fmt::format("unknown option '{}'", flag));
    }
  }
  if (o.sizes_mib.empty() || o.dtypes.empty() || o.ops.empty()) usage("empty --sizes-mib, --dtypes or --ops");
  return o;
}

/// NCCL's bus-bandwidth factor: what each link carries relative to the buffer. A ring all-reduce
/// moves every byte twice (reduce-scatter, then all-gather) through n - 1 steps of 1/n each.
double bus_factor(const std::string& op, int ranks) {
  const double n = ranks;
  return op == "all_reduce" ? 2.0 * (n - 1.0) / n : (n - 1.0) / n;
}

struct Measurement {
  std::string op;
  DType dtype = DType::f32;
  int64_t bytes = 0;  ///< the full (unsharded) buffer
  double ms_per_call = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
};

Measurement measure(comm::ProcessGroup& group, const std::string& op, DType dtype, int64_t size_mib, const Options& o) {
  const int ranks = group.size();
  const Device device = group.device();
  // The full buffer is the size asked for, less what keeps its length divisible by the group (the
  // shard of reduce_scatter and all_gather is 1/n of it); a MiB of 2- or 4-byte elements divides by
  // any power of two up to 2^18.
  int64_t numel = size_mib * (int64_t{1} << 20) / static_cast<int64_t>(core::element_size(dtype));
  numel -= numel % ranks;
  // Zeros: NCCL's speed does not depend on the values, and sums of zeros never overflow to inf.
  Tensor full = core::zeros({numel}, TensorOptions(dtype, device));
  Tensor shard = core::zeros({numel / ranks}, TensorOptions(dtype, device));
  auto call = [&] {
    // Each call returns after its Work's wait(): the caller's stream then waits for the collective,
    // which runs on the group's own stream (Note [NCCL stream ordering] in nccl_process_group.cpp).
    if (op == "all_reduce") {
      group.all_reduce(full, comm::ReduceOp::sum);
    } else if (op == "reduce_scatter") {
      group.reduce_scatter(shard, full, comm::ReduceOp::sum);
    } else {
      group.all_gather(full, shard);
    }
  };
  for (int i = 0; i < o.warmup; ++i) call();  // also NCCL's lazy connection set-up for this op
  // Host-blocking: every rank starts its clock within a barrier's skew of the others.
  group.barrier();
  const core::Stream stream = core::cuda::current_stream(device);
  core::cuda::Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  start.record(stream);
  for (int i = 0; i < o.iters; ++i) call();
  // The caller's stream waited for the last collective, so this event marks its end.
  end.record(stream);
  end.synchronize();
  double ms = static_cast<double>(start.elapsed_ms(end)) / o.iters;
  // A collective ends on the slowest rank: report that rank's time.
  Tensor slowest = core::from_vector<double>({ms}, {1}, TensorOptions(DType::f64, device));
  group.all_reduce(slowest, comm::ReduceOp::max);
  ms = slowest.to(core::kCpu).item<double>();

  Measurement m;
  m.op = op;
  m.dtype = dtype;
  m.bytes = numel * static_cast<int64_t>(core::element_size(dtype));
  m.ms_per_call = ms;
  m.algbw_gbps = static_cast<double>(m.bytes) / (ms * 1e-3) / 1e9;
  m.busbw_gbps = m.algbw_gbps * bus_factor(op, ranks);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    comm::InitOptions init;
    init.backend = comm::Backend::nccl;
    const comm::DistEnv env = comm::read_dist_env();
    std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(init, env);
    // Events and the current stream belong to the current device: make it this rank's GPU.
    core::cuda::set_device(world->device().index);
    const bool printer = world->rank() == 0;
    if (o.pair_window_mib > 0) {
      std::string why;
      if (!comm::use_pair_all_reduce(*world, o.pair_window_mib << 20, int64_t{1} << 20, &why))
        usage(fmt::format("--pair-window-mib: {}", why));
      if (printer)
        fmt::print("comm_bench: all_reduce of 1 MiB and more by the copy engines ({} MiB window)\n", o.pair_window_mib);
    }
    std::ofstream jsonl;
    if (printer && !o.jsonl.empty()) {
      jsonl.open(o.jsonl);
      if (!jsonl) usage(fmt::format("cannot write --jsonl {}", o.jsonl));
    }
    const std::string gpu_name = core::cuda::properties(world->device().index).name;
    if (printer) {
      fmt::print("comm_bench: {} ranks over NCCL {} ({}), {} warm-up + {} timed calls per row; GB/s = 1e9 B/s\n",
                 world->size(), comm::nccl_version(), gpu_name, o.warmup, o.iters);
      fmt::print("{:<15} {:>5} {:>8} {:>12} {:>12} {:>12}\n", "op", "dtype", "MiB", "us/call", "algbw GB/s",
                 "busbw GB/s");
    }
    for (const std::string& op : o.ops) {
      for (DType dtype : o.dtypes) {
        for (int64_t size_mib : o.sizes_mib) {
          const Measurement m = measure(*world, op, dtype, size_mib, o);
          if (!printer) continue;
          fmt::print("{:<15} {:>5} {:>8} {:>12.1f} {:>12.1f} {:>12.1f}\n", m.op, m.dtype, size_mib, m.ms_per_call * 1e3,
                     m.algbw_gbps, m.busbw_gbps);
          std::fflush(stdout);
          if (jsonl.is_open()) {
            const nlohmann::json line = {{"impl", "colossal"},
                                         {"op", m.op},
                                         {"dtype", std::string(core::dtype_name(m.dtype))},
                                         {"size_mib", size_mib},
                                         {"bytes", m.bytes},
                                         {"world_size", world->size()},
                                         {"warmup", o.warmup},
                                         {"iters", o.iters},
                                         {"time_us", m.ms_per_call * 1e3},
                                         {"algbw_gbps", m.algbw_gbps},
                                         {"busbw_gbps", m.busbw_gbps},
                                         {"gpu", gpu_name},
                                         {"nccl", comm::nccl_version()}};
            jsonl << line.dump() << "\n";
            jsonl.flush();
          }
        }
      }
    }
    if (jsonl.is_open() && !jsonl) {
      std::fprintf(stderr, "comm_bench: writing %s failed\n", o.jsonl.c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
