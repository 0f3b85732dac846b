// The installed interpreter-lock runner (see gf_shim_interpreter_lock.h).
#include "gf_shim_interpreter_lock.h"

#include <atomic>

namespace graphed {

namespace {

std::atomic<InterpreterLockRunner> installed_runner{nullptr};

} // namespace

void set_interpreter_lock_runner(InterpreterLockRunner runner) {
  installed_runner.store(runner, std::memory_order_release);
}

void run_holding_interpreter_lock(LockedWork work, void *context) noexcept {
  InterpreterLockRunner runner = installed_runner.load(std::memory_order_acquire);
  if (runner != nullptr) {
    runner(work, context);
  } else {
    work(context);
  }
}

} // namespace graphed
