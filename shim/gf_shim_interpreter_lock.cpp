// The installed interpreter-lock runners (see gf_shim_interpreter_lock.h).
#include "gf_shim_interpreter_lock.h"

#include <atomic>

namespace graphed {

namespace {

std::atomic<InterpreterLockRunner> installed_runner{nullptr};
std::atomic<InterpreterLockRunner> installed_releasing_runner{nullptr};

void run_through(const std::atomic<InterpreterLockRunner> &installed, LockedWork work,
                 void *context) noexcept {
  InterpreterLockRunner runner = installed.load(std::memory_order_acquire);
  if (runner != nullptr) {
    runner(work, context);
  } else {
    work(context);
  }
}

} // namespace

void set_interpreter_lock_runners(InterpreterLockRunner holding, InterpreterLockRunner releasing) {
  installed_runner.store(holding, std::memory_order_release);
  installed_releasing_runner.store(releasing, std::memory_order_release);
}

void run_holding_interpreter_lock(LockedWork work, void *context) noexcept {
  run_through(installed_runner, work, context);
}

void run_without_interpreter_lock(LockedWork work, void *context) noexcept {
  run_through(installed_releasing_runner, work, context);
}

} // namespace graphed
