// A pipeline whose stages disagree ends with a message instead of hanging (issue 20's "no hangs"): two
// MPI ranks run a 2-stage pipeline in which stage 0 cuts each batch into 4 microbatches and stage 1 into
// 2 (a schedule mismatch), under a 2 s collective timeout. Stage 0 waits for the gradient of microbatch
// 2, which stage 1 never sends: the watchdog ends it naming its stage, the microbatch and the exchange
// (stage 1, done with its microbatches, waits in the micro-step's closing all-reduce and ends named
// as such, "pipeline stage 1 of 2: the micro-step's loss, after this stage's 2 microbatches", unless the
// launcher stopped it first).
// A timed-out rank ends its process, so the ranks run as a job of their own (this program, started
// again under mpirun with --scenario) and the test reads what they printed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../comm/timeout_support.h"  // run_child
#include "colossal/core/build_config.h"

#if COLOSSAL_WITH_MPI
#include "colossal/comm/mpi/mpi_process_group.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/sgd.h"
#endif

namespace colossal::engine {
namespace {

using namespace std::chrono_literals;

#if COLOSSAL_WITH_MPI

/// One rank of the job: stage r of 2, one Linear each, microbatches 4 on stage 0 and 2 on stage 1.
int run_mismatched_stage() {
  auto world = comm::MpiProcessGroup::create_world();
  const int stage = world->rank();
  core::Generator init(3);
  auto linear = std::make_shared<nn::Linear>(4, 4, true, &init);
  auto chunk = std::make_shared<nn::Sequential>();
  chunk->push_back(linear);
  EngineOptions options;
  options.schedule =
      std::make_shared<PipelineSchedule>(std::vector<std::shared_ptr<nn::Module>>{chunk}, world, stage == 0 ? 4 : 2);
  auto sgd = std::make_shared<optim::Sgd>(chunk->parameters(), optim::SgdOptions{.lr = 0.1});
  Engine engine(
      chunk, sgd, [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); }, options);
  // Microbatches of 2 rows on both stages, so only their number disagrees.
  const int64_t rows = stage == 0 ? 8 : 4;
  const Tensor x = core::full({rows, 4}, 0.5, DType::f32);
  const Tensor y = core::zeros({rows}, TensorOptions(DType::i64));
  engine.step(x, y);
  std::printf("stage %d should have timed out\n", stage);
  return 0;
}

TEST(PipelineMismatch, StagesThatDisagreeEndNamingTheStageMicrobatchAndExchange) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> argv = {"mpirun", "-np", "2", "--oversubscribe", self, "--scenario"};
  const comm::testing::ChildResult r = comm::testing::run_child(argv,
                                                                {{"COLOSSAL_COLLECTIVE_TIMEOUT", "2"},
                                                                 {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                                 {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                                                 {"OMP_NUM_THREADS", "1"}},
                                                                60s);
  EXPECT_FALSE(r.overran) << r.output;
  EXPECT_TRUE(r.exited && r.exit_code != 0) << r.output;
  EXPECT_EQ(r.output.find("should have timed out"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("collective timeout"), std::string::npos) << r.output;
  // Stage 0 (the first to time out): the exchange before its backward of microbatch 2, whose gradient
  // stage 1 never sends.
  EXPECT_NE(r.output.find("(pipeline stage 0 of 2: send activation of microbatch 3 (chunk 0) to stage 1, receive "
                          "gradient of microbatch 2 (chunk 0) from stage 1)"),
            std::string::npos)
      << r.output;
}

#endif

}  // namespace
}  // namespace colossal::engine

int main(int argc, char** argv) {
#if COLOSSAL_WITH_MPI
  if (argc > 1 && std::string(argv[1]) == "--scenario") return colossal::engine::run_mismatched_stage();
#endif
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
