// OperationContext: what the calling thread is doing, in words, added to the name of every
// communication operation it issues while the context lives, so that a timeout or a transport
// failure names it ("all_reduce ... (pipeline stage 1 of 2: forward of microbatch 3, chunk 0)").
// Contexts nest; the names join outermost first. Thread-local: another thread's operations are
// not affected.
#pragma once

#include <string>

namespace colossal::comm {

class OperationContext {
 public:
  explicit OperationContext(std::string what);
  ~OperationContext();
  OperationContext(const OperationContext&) = delete;
  OperationContext& operator=(const OperationContext&) = delete;

  /// The calling thread's contexts, outermost first, joined by ": "; empty when there is none.
  static std::string current();

 private:
  size_t previous_size_;
};

/// `operation` with the calling thread's context in parentheses after it (unchanged without one).
std::string with_operation_context(std::string operation);

}  // namespace colossal::comm
