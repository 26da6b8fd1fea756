// Hook: the base of everything the Trainer calls at Colossal-AI's hook points (before_train,
// before/after_train_epoch, before/after_train_iter, before/after_test, ..., after_train).
// Every method is a no-op; hooks run in ascending priority, ties in the order they were given.
#pragma once

#include <string>

#include "colossal/core/tensor.h"

namespace colossal::engine {

class Trainer;

class Hook {
 public:
  /// Lower priorities run first at every hook point (Colossal-AI's BaseHook.priority).
  explicit Hook(int priority = 0) : priority_(priority) {}
  virtual ~Hook() = default;
  int priority() const { return priority_; }
  /// Names the hook in logs ("LossHook").
  virtual std::string name() const { return "Hook"; }

  virtual void before_train(Trainer&) {}
  virtual void after_train(Trainer&) {}
  virtual void before_train_epoch(Trainer&) {}
  virtual void after_train_epoch(Trainer&) {}
  virtual void before_train_iter(Trainer&) {}
  /// `loss` is the micro-step's unscaled loss; `output` and `target` the batch's (detached).
  virtual void after_train_iter(Trainer&, const Tensor& output, const Tensor& target, const Tensor& loss) {
    (void)output, (void)target, (void)loss;
  }
  virtual void before_test(Trainer&) {}
  virtual void after_test(Trainer&) {}
  virtual void before_test_epoch(Trainer&) {}
  virtual void after_test_epoch(Trainer&) {}
  virtual void before_test_iter(Trainer&) {}
  virtual void after_test_iter(Trainer&, const Tensor& output, const Tensor& target, const Tensor& loss) {
    (void)output, (void)target, (void)loss;
  }

 private:
  int priority_;
};

}  // namespace colossal::engine
