// OperationContext: see operation_context.h.
#include "colossal/comm/operation_context.h"

#include <utility>

namespace colossal::comm {
namespace {

thread_local std::string context;

}  // namespace

OperationContext::OperationContext(std::string what) : previous_size_(context.size()) {
  if (!context.empty()) context += ": ";
  context += what;
}

OperationContext::~OperationContext() {
  context.resize(previous_size_);
}

std::string OperationContext::current() {
  return context;
}

std::string with_operation_context(std::string operation) {
  if (context.empty()) return operation;
  return operation + " (" + context + ")";
}

}  // namespace colossal::comm
