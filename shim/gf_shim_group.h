// Agreement across the ranks of a torch.distributed process group, done here in C++ rather than by
// a Python operator. Two reasons. The all-reduce's tensor is made here, so no Python object is tied
// to it: gloo's worker threads release finished collectives on their own time, and releasing a
// tensor that a Python object shares takes the interpreter's lock, which a thread can no longer
// take once the interpreter is exiting (the process aborted, "terminate called without an active
// exception"). And the group is found by its registered name at each agreement, so a runner holds
// no reference to it: destroy_process_group() really destroys it, while the interpreter is alive.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace graphed {

// The MIN of `ok` over the ranks of the process group registered under `group_name`: on `device`
// when the group's backend is a device's (NCCL, XCCL), else on the CPU. Waits with the
// interpreter's lock released (gf_shim_interpreter_lock.h). Throws a c10::Error naming the group
// when it is no longer registered (destroyed) or the collective fails.
bool agree_over_group(const std::string &group_name, c10::Device device, bool ok);

} // namespace graphed
