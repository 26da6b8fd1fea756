// Thread-local grad mode.
#include "colossal/autograd/grad_mode.h"

namespace colossal::autograd {
namespace {
thread_local bool grad_enabled = true;
}
bool GradMode::is_enabled() { return grad_enabled; }
void GradMode::set_enabled(bool enabled) { grad_enabled = enabled; }
}  // namespace colossal::autograd
