// Parses the launchers' environments into a DistEnv (comm/bootstrap.h).
#include "colossal/comm/bootstrap.h"

#include <charconv>
#include <cstdlib>
#include <vector>

#include "colossal/comm/launch_env.h"  // the variables' names
#include "colossal/core/error.h"

namespace colossal::comm {

// Note [Rendezvous port under torchrun]
// torchrun (torch.distributed.run) starts a TCPStore on MASTER_ADDR:MASTER_PORT in its agent on node 0
// and hands it to the workers (TORCHELASTIC_USE_AGENT_STORE), so MASTER_PORT is taken for the whole
// run: binding it fails with "address in use" on rank 0, and the other ranks would reach torchrun's
// store instead of us. We therefore listen on MASTER_PORT + 1 under torchrun. Our own launcher
// (`colossal run`) only chooses MASTER_PORT and binds nothing, so there the rendezvous takes it.
int DistEnv::rendezvous_port() const {
  return source == EnvSource::torchrun ? master_port + 1 : master_port;
}

std::string_view env_source_name(EnvSource source) {
  switch (source) {
    case EnvSource::single:
      return "single";
    case EnvSource::launcher:
      return "launcher";
    case EnvSource::torchrun:
      return "torchrun";
    case EnvSource::openmpi:
      return "openmpi";
    case EnvSource::slurm:
      return "slurm";
  }
  return "?";
}

std::string DistEnv::describe() const {
  return fmt::format("rank {} of {} (local {} of {}), from {}, rank 0 at {}:{}", rank, world_size, local_rank,
                     local_world_size, env_source_name(source), master_addr, master_port);
}

namespace {

/// Reads the variables of one launcher and reports all missing ones at once.
class EnvReader {
 public:
  EnvReader(const EnvLookup& lookup, std::string_view launcher) : lookup_(lookup), launcher_(launcher) {}

  std::optional<std::string> get(std::string_view name) const {
    std::optional<std::string> value = lookup_(std::string(name));
    if (value && value->empty()) return std::nullopt;  // VAR= counts as unset
    return value;
  }
  bool has(std::string_view name) const { return get(name).has_value(); }

  /// Throws naming every variable of `names` that is unset.
  void require(const std::vector<std::string_view>& names, std::string_view why) const {
    std::vector<std::string_view> missing;
    for (const std::string_view name : names) {
      if (!has(name)) missing.push_back(name);
    }
    COLOSSAL_CHECK(missing.empty(), "{}: {} set, so this is a {} environment, but {} {} missing; {} sets all of {}",
                   launcher_, why, launcher_, fmt::join(missing, ", "), missing.size() == 1 ? "is" : "are", launcher_,
                   fmt::join(names, ", "));
  }

  int integer(std::string_view name) const {
    const std::string text = get(name).value_or("");
    int value = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    COLOSSAL_CHECK(ec == std::errc() && ptr == end, "{}: {}='{}' is not an integer", launcher_, name, text);
    return value;
  }

  int port(std::string_view name) const {
    const int value = integer(name);
    COLOSSAL_CHECK(value >= 1 && value <= 65535, "{}: {}={} is not a TCP port (1 to 65535)", launcher_, name, value);
    return value;
  }

 private:
  const EnvLookup& lookup_;
  std::string launcher_;
};

void check_ranks(const DistEnv& env, std::string_view launcher, std::string_view rank_var, std::string_view size_var,
                 std::string_view local_rank_var, std::string_view local_size_var) {
  COLOSSAL_CHECK(env.world_size >= 1, "{}: {}={} must be at least 1", launcher, size_var, env.world_size);
  COLOSSAL_CHECK(env.rank >= 0 && env.rank < env.world_size, "{}: {}={} is outside the world ({}={}: ranks 0 to {})",
                 launcher, rank_var, env.rank, size_var, env.world_size, env.world_size - 1);
  COLOSSAL_CHECK(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
                 "{}: {}={} must be between 1 and {}={}", launcher, local_size_var, env.local_world_size, size_var,
                 env.world_size);
  COLOSSAL_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world_size,
                 "{}: {}={} is outside this node's {} processes ({}={})", launcher, local_rank_var, env.local_rank,
                 env.local_world_size, local_size_var, env.local_world_size);
}

/// torchrun and our launcher: the same six variables (ours adds COLOSSAL_LAUNCHER=1).
DistEnv parse_torchrun_like(const EnvReader& vars, EnvSource source, std::string_view why) {
  vars.require({env::kRank, env::kLocalRank, env::kWorldSize, env::kLocalWorldSize, env::kMasterAddr, env::kMasterPort},
               why);
  DistEnv out;
  out.source = source;
  out.rank = vars.integer(env::kRank);
  out.world_size = vars.integer(env::kWorldSize);
  out.local_rank = vars.integer(env::kLocalRank);
  out.local_world_size = vars.integer(env::kLocalWorldSize);
  out.master_addr = *vars.get(env::kMasterAddr);
  out.master_port = vars.port(env::kMasterPort);
  const std::string_view name = env_source_name(source);
  check_ranks(out, name, env::kRank, env::kWorldSize, env::kLocalRank, env::kLocalWorldSize);
  COLOSSAL_CHECK(source != EnvSource::torchrun || out.master_port < 65535,
                 "torchrun: {}=65535 leaves no port for the rendezvous (it uses {} + 1, since torchrun's store holds "
                 "{}); pick a lower --master_port",
                 env::kMasterPort, env::kMasterPort, env::kMasterPort);
  return out;
}

DistEnv parse_openmpi(const EnvReader& vars) {
  vars.require({env::kOmpiRank, env::kOmpiSize, env::kOmpiLocalRank, env::kOmpiLocalSize},
               fmt::format("{} is", env::kOmpiRank));
  DistEnv out;
  out.source = EnvSource::openmpi;
  out.rank = vars.integer(env::kOmpiRank);
  out.world_size = vars.integer(env::kOmpiSize);
  out.local_rank = vars.integer(env::kOmpiLocalRank);
  out.local_world_size = vars.integer(env::kOmpiLocalSize);
  // Under MPI the NCCL id travels by MPI_Bcast; MASTER_ADDR/PORT only matter if a user set them.
  if (vars.has(env::kMasterAddr)) out.master_addr = *vars.get(env::kMasterAddr);
  if (vars.has(env::kMasterPort)) out.master_port = vars.port(env::kMasterPort);
  check_ranks(out, "openmpi", env::kOmpiRank, env::kOmpiSize, env::kOmpiLocalRank, env::kOmpiLocalSize);
  return out;
}

/// Tasks on node `node` from a Slurm tasks-per-node list: "2(x3),1" is 2, 2, 2, 1. nullopt for a list
/// that does not parse, a repeat below 1, or a node it does not reach.
std::optional<int> slurm_tasks_on_node(std::string_view list, int node) {
  if (node < 0) return std::nullopt;
  int index = 0;  // the first node of the current item; stays <= node, so adding a repeat cannot overflow
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string_view item =
        list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? list.size() : comma + 1;
    int tasks = 0, repeat = 1;
    const size_t paren = item.find('(');
    const std::string_view count = item.substr(0, paren);
    if (std::from_chars(count.data(), count.data() + count.size(), tasks).ec != std::errc()) return std::nullopt;
    if (paren != std::string_view::npos) {
      // "(x3)"
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')') return std::nullopt;
      const std::string_view times = item.substr(paren + 2, item.size() - paren - 3);
      if (std::from_chars(times.data(), times.data() + times.size(), repeat).ec != std::errc()) return std::nullopt;
    }
    if (repeat < 1) return std::nullopt;
    if (node - index < repeat) return tasks;
    index += repeat;
  }
  return std::nullopt;
}

DistEnv parse_slurm(const EnvReader& vars) {
  vars.require({env::kSlurmProcId, env::kSlurmNtasks, env::kSlurmLocalId}, fmt::format("{} is", env::kSlurmProcId));
  DistEnv out;
  out.source = EnvSource::slurm;
  out.rank = vars.integer(env::kSlurmProcId);
  out.world_size = vars.integer(env::kSlurmNtasks);
  out.local_rank = vars.integer(env::kSlurmLocalId);
  // Tasks on this node: the step's distribution (srun), else the job's, indexed by SLURM_NODEID.
  std::optional<int> local = std::nullopt;
  for (const std::string_view list_var : {env::kSlurmStepTasksPerNode, env::kSlurmTasksPerNode}) {
    if (local || !vars.has(list_var)) continue;
    const int node = vars.has(env::kSlurmNodeId) ? vars.integer(env::kSlurmNodeId) : 0;
    local = slurm_tasks_on_node(*vars.get(list_var), node);
    COLOSSAL_CHECK(local.has_value(),
                   "slurm: cannot read node {}'s task count from {}='{}' (expected a list like 2(x3),1)", node,
                   list_var, *vars.get(list_var));
  }
  if (!local && vars.has(env::kSlurmNtasksPerNode)) local = vars.integer(env::kSlurmNtasksPerNode);
  COLOSSAL_CHECK(local.has_value(),
                 "slurm: cannot tell how many tasks run on this node: none of {}, {} (with {}) or {} is set; start "
                 "the job with srun",
                 env::kSlurmStepTasksPerNode, env::kSlurmTasksPerNode, env::kSlurmNodeId, env::kSlurmNtasksPerNode);
  out.local_world_size = *local;
  check_ranks(out, "slurm", env::kSlurmProcId, env::kSlurmNtasks, env::kSlurmLocalId, "the tasks-per-node count");

  if (vars.has(env::kMasterAddr)) {
    out.master_addr = *vars.get(env::kMasterAddr);
  } else {
    std::optional<std::string> nodes;
    for (const std::string_view list_var : {env::kSlurmStepNodeList, env::kSlurmJobNodeList, env::kSlurmNodeList}) {
      if (!nodes) nodes = vars.get(list_var);
    }
    COLOSSAL_CHECK(nodes.has_value() || out.world_size == 1,
                   "slurm: no {} and no node list ({}, {}) to find rank 0's host; export {}", env::kMasterAddr,
                   env::kSlurmStepNodeList, env::kSlurmJobNodeList, env::kMasterAddr);
    if (nodes) out.master_addr = first_slurm_host(*nodes);
  }
  if (vars.has(env::kMasterPort)) {
    out.master_port = vars.port(env::kMasterPort);
  } else if (vars.has(env::kSlurmJobId)) {
    // Jobs sharing a node get different ports; 20000-39999 stays clear of the ephemeral range.
    out.master_port = 20000 + vars.integer(env::kSlurmJobId) % 20000;
  }
  return out;
}

}  // namespace

std::string first_slurm_host(std::string_view host_list) {
  std::string host;
  int depth = 0;
  bool skipping = false;  // inside brackets, past the first number or range
  for (char c : host_list) {
    if (c == '[') {
      depth++;
      skipping = false;
      continue;
    }
    if (c == ']') {
      depth--;
      skipping = false;
      continue;
    }
    if (depth == 0 && c == ',') break;
    if (depth > 0) {
      if (c == ',' || c == '-') skipping = true;
      if (!skipping) host += c;
      continue;
    }
    host += c;
  }
  return host;
}

namespace {

/// DistEnv::job_id for an environment parsed as `source`.
std::string job_id_of(const EnvLookup& lookup, EnvSource source) {
  const auto get = [&](std::string_view name) { return lookup(std::string(name)).value_or(""); };
  if (std::string id = get(env::kColossalJobId); !id.empty()) return id;
  if (source == EnvSource::torchrun) return get(env::kTorchelasticRunId);
  if (source == EnvSource::slurm && !get(env::kSlurmJobId).empty()) {
    return fmt::format("{}.{}", get(env::kSlurmJobId), get(env::kSlurmStepId));
  }
  return "";
}

DistEnv parse_dist_env_without_job(const EnvLookup& lookup) {
  if (lookup(std::string(env::kColossalLauncher)).value_or("") == "1") {
    return parse_torchrun_like(EnvReader(lookup, "launcher"), EnvSource::launcher,
                               fmt::format("{}=1 is", env::kColossalLauncher));
  }
  const EnvReader torchrun(lookup, "torchrun");
  if (torchrun.has(env::kRank) || torchrun.has(env::kWorldSize)) {
    return parse_torchrun_like(torchrun, EnvSource::torchrun,
                               fmt::format("{} is", torchrun.has(env::kRank) ? env::kRank : env::kWorldSize));
  }
  const EnvReader openmpi(lookup, "openmpi");
  if (openmpi.has(env::kOmpiRank) || openmpi.has(env::kOmpiSize)) return parse_openmpi(openmpi);
  const EnvReader slurm(lookup, "slurm");
  if (slurm.has(env::kSlurmProcId)) return parse_slurm(slurm);

  DistEnv single;
  if (auto addr = lookup(std::string(env::kMasterAddr)); addr && !addr->empty()) single.master_addr = *addr;
  if (lookup(std::string(env::kMasterPort)).value_or("") != "")
    single.master_port = EnvReader(lookup, "single").port(env::kMasterPort);
  return single;
}

}  // namespace

DistEnv parse_dist_env(const EnvLookup& lookup) {
  DistEnv out = parse_dist_env_without_job(lookup);
  out.job_id = job_id_of(lookup, out.source);
  return out;
}

DistEnv parse_dist_env(const std::map<std::string, std::string>& variables) {
  return parse_dist_env([&variables](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  });
}

DistEnv read_dist_env() {
  return parse_dist_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace colossal::comm
