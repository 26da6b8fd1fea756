// Formats error messages with their source location.
#include "colossal/core/error.h"

#include <string_view>

namespace colossal::detail {

void throw_error(const char* file, int line, std::string message) {
  std::string_view path(file);
  // Keep the path from src/ on so messages do not leak the build machine's layout.
  if (auto pos = path.rfind("src/colossal/"); pos != std::string_view::npos) path.remove_prefix(pos + 4);
  throw Error(fmt::format("{} ({}:{})", message, path, line));
}

}  // namespace colossal::detail
