// The all-reduce behind a runner's agreement over a process group (see gf_shim_group.h).
#include "gf_shim_group.h"

#include "gf_shim_interpreter_lock.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <exception>
#include <vector>

namespace graphed {

namespace {

struct Agreement {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  at::Tensor flag;
  int agreed = 0;
  std::exception_ptr error;
};

// The collective and the read-back, run with the interpreter's lock released: the wait may be
// long, and gloo's threads may need the lock meanwhile to release a Python caller's tensors.
void all_reduce_min(void *context) noexcept {
  auto *agreement = static_cast<Agreement *>(context);
  try {
    std::vector<at::Tensor> tensors{agreement->flag};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MIN;
    agreement->group->allreduce(tensors, options)->wait();
    agreement->agreed = agreement->flag.cpu().item<int>();
  } catch (...) {
    agreement->error = std::current_exception();
  }
}

} // namespace

bool agree_over_group(const std::string &group_name, c10::Device device, bool ok) {
  Agreement agreement;
  try {
    agreement.group = c10d::resolve_process_group(group_name);
  } catch (const c10::Error &) {
    TORCH_CHECK(false, "graphed: the process group '", group_name,
                "' is no longer registered (destroyed?); a runner cannot agree over it");
  }
  // The device's collectives when the group's backend is the device's own (what
  // dist.get_backend(group) names), else the CPU's: a "cpu:gloo,cuda:nccl" group agrees on gloo.
  const std::string backend = agreement.group->getBackendName();
  const bool on_device = !device.is_cpu() && (backend == "nccl" || backend == "xccl");
  agreement.flag = at::full({1}, ok ? 1 : 0,
                            at::TensorOptions().dtype(at::kInt).device(
                                on_device ? device : c10::Device(c10::DeviceType::CPU)));
  run_without_interpreter_lock(all_reduce_min, &agreement);
  if (agreement.error) {
    std::rethrow_exception(agreement.error);
  }
  return agreement.agreed > 0;
}

} // namespace graphed
