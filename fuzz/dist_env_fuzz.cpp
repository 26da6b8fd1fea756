// Fuzzes the launchers' environment parsing (comm/bootstrap.h: parse_dist_env over our launcher's,
// torchrun's, Open MPI's and Slurm's variables, named in comm/launch_env.h; first_slurm_host) and the
// rendezvous timeout variable (comm/tcp_rendezvous.h, default_rendezvous_timeout). The input is
// NAME=VALUE lines. An environment that parses must describe a rank inside its world.
#include <cstdlib>
#include <map>
#include <string>

#include "colossal/comm/bootstrap.h"       // parse_dist_env, first_slurm_host
#include "colossal/comm/launch_env.h"      // env::kRendezvousTimeout
#include "colossal/comm/tcp_rendezvous.h"  // default_rendezvous_timeout
#include "fuzz_support.h"                  // accept_errors, property_failed

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const std::string_view input = fuzz::as_text(data, size);
  std::map<std::string, std::string> variables;
  size_t pos = 0;
  while (pos < input.size()) {
    size_t end = input.find('\n', pos);
    if (end == std::string_view::npos) end = input.size();
    const std::string_view line = input.substr(pos, end - pos);
    pos = end + 1;
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
  }
  fuzz::accept_errors([&] {
    const comm::DistEnv env = comm::parse_dist_env(variables);
    if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size || env.local_rank < 0 ||
        env.local_rank >= env.local_world_size || env.local_world_size > env.world_size) {
      fuzz::property_failed("parse_dist_env accepted a rank outside its world");
    }
    (void)env.describe();
    (void)env.rendezvous_port();
  });
  for (const auto& [name, value] : variables) (void)comm::first_slurm_host(value);

  // default_rendezvous_timeout reads the process environment itself.
  const std::string timeout_name(comm::env::kRendezvousTimeout);
  if (const auto it = variables.find(timeout_name);
      it != variables.end() && it->second.find('\0') == std::string::npos) {
    ::setenv(timeout_name.c_str(), it->second.c_str(), 1);
    fuzz::accept_errors([&] {
      if (comm::default_rendezvous_timeout().count() <= 0)
        fuzz::property_failed("a rendezvous timeout of 0 ms or less");
    });
    ::unsetenv(timeout_name.c_str());
  }
  return 0;
}
