// Note [GIL release]
// Where the shim runs work that releases Python objects, holding the Python interpreter's lock
// once for all of it, and work that waits for other threads, with the lock released. When the last
// C++ reference to a tensor that a Python object also holds goes, torch takes that lock to release
// the object (TensorImpl::decref_pyobject); a kernel called from Python runs with the lock
// released, so dropping K such tensors there takes it K times. The shim has no Python: the CPython
// entry point (pyext/) installs the way to take the lock when it loads. Without it (a process with
// no Python, or the plugin loaded on its own) the work runs as it is, and torch takes the lock per
// object as before. The rule that keeps this free of deadlocks: nothing waits for a runner's mutex
// while holding the interpreter's lock (lock_runner waits with it released, gf_shim_call.cpp, and
// torch.ops releases it around every kernel), so work that takes the lock may run while a runner's
// mutex is held.
#pragma once

namespace graphed {

// Work that must not throw.
using LockedWork = void (*)(void *context) noexcept;

// Runs work(context) holding the interpreter's lock (taking it if this thread does not hold it).
using InterpreterLockRunner = void (*)(LockedWork work, void *context);

// Installs the runners: `holding` runs work holding the lock, `releasing` runs it with the lock
// released when this thread holds it (as is, when it does not); NULL uninstalls them.
void set_interpreter_lock_runners(InterpreterLockRunner holding, InterpreterLockRunner releasing);

// Runs work(context) through the installed runner, or directly when none is installed. It may
// wait for the interpreter's lock, so call it only where that is safe: a caller may hold a
// runner's mutex, because nothing waits for a runner's mutex while holding the interpreter's
// lock (docs/architecture.md, "Threading").
void run_holding_interpreter_lock(LockedWork work, void *context) noexcept;

// Runs work(context) with the interpreter's lock released, through the installed runner, or
// directly when none is installed: for a wait on other threads (a collective) that may need the
// lock to finish, which a thread holding it would deadlock.
void run_without_interpreter_lock(LockedWork work, void *context) noexcept;

} // namespace graphed
