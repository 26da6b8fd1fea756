// colossal::Error and the CHECK macros: the message is the fmt-formatted text followed by the source
// location, paths inside the library are shortened to colossal/..., and a passing check does not
// evaluate its message arguments.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "colossal/core/device.h"
#include "colossal/core/error.h"
#include "colossal/core/tensor.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no colossal::Error thrown";
  return "";
}

TEST(Error, CheckFormatsTheMessageAndAppendsTheLocation) {
  int line = 0;
  const std::string message = message_of([&] {
    line = __LINE__ + 1;
    COLOSSAL_CHECK(1 + 1 == 3, "expected {} got {} for shape {}", 3, "two", core::Shape{2, 3});
  });
  EXPECT_EQ(message.rfind("expected 3 got two for shape [2, 3] (", 0), 0u) << message;
  EXPECT_NE(message.find("error_test.cpp:" + std::to_string(line) + ")"), std::string::npos) << message;
  EXPECT_EQ(message.back(), ')');
}

TEST(Error, FailAlwaysThrows) {
  const std::string message = message_of([] { COLOSSAL_FAIL("bad value {:.3f} in {}", 0.5, "layer"); });
  EXPECT_EQ(message.rfind("bad value 0.500 in layer (", 0), 0u) << message;
}

TEST(Error, LibraryPathsAreShortenedToColossal) {
  // Errors raised inside the library name the file from colossal/ on, without the checkout's path.
  const std::string message = message_of([] { core::empty({-1}); });
  EXPECT_NE(message.find("(colossal/core/tensor.cpp:"), std::string::npos) << message;
  EXPECT_EQ(message.find("src/colossal"), std::string::npos) << message;
}

TEST(Error, PassingCheckDoesNotEvaluateTheMessage) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  COLOSSAL_CHECK(true, "{}", count());
  EXPECT_EQ(evaluated, 0);
  EXPECT_THROW(COLOSSAL_CHECK(false, "{}", count()), Error);
  EXPECT_EQ(evaluated, 1);
}

TEST(Error, IsAStdRuntimeError) {
  EXPECT_THROW(COLOSSAL_FAIL("x"), std::runtime_error);
  // The macro is one statement, so it nests in an unbraced if/else.
  bool reached_else = false;
  if (false)
    COLOSSAL_CHECK(false, "never");
  else
    reached_else = true;
  EXPECT_TRUE(reached_else);
}

TEST(Error, ShapesAndDevicesFormatReadably) {
  EXPECT_EQ(fmt::format("{}", core::Shape{2, 3}), "[2, 3]");
  EXPECT_EQ(fmt::format("{}", core::Shape{}), "[]");
  EXPECT_EQ(fmt::format("{}", core::kCpu), "cpu");
  EXPECT_EQ(fmt::format("{}", core::cuda_device(3)), "cuda:3");
  EXPECT_EQ(core::Device::parse("cuda"), core::cuda_device(0));
  EXPECT_EQ(core::Device::parse("cuda:2"), core::cuda_device(2));
  EXPECT_EQ(core::Device::parse("cpu"), core::kCpu);
  EXPECT_ERROR_CONTAINS(core::Device::parse("cuda:-1"),
                        "unknown device 'cuda:-1'; valid: cpu, cuda, cuda:N with N >= 0");
  EXPECT_ERROR_CONTAINS(core::Device::parse("gpu"), "unknown device 'gpu'");
}

}  // namespace
}  // namespace colossal
