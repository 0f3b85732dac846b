// Registers the graphed operators with the dispatcher (their schemas: the TORCH_LIBRARY block at
// the end of this file, the one copy; docs/api.md explains each). A core status becomes a torch
// error here (raise_status) by the one mapping the CPython entry shares
// (graphed::error_kind_of, gf_torch_errors.h): ValueError for bad values, TypeError for wrong
// kinds, RuntimeError for the rest.
#include "gf_shim_call.h"
#include "gf_shim_host.h"
#include "gf_shim_interpreter_lock.h"
#include "gf_shim_registry.h"
#include "gf_shim_tensor.h"
#include "gf_torch_errors.h"

#include <ATen/ATen.h>
#include <torch/library.h>

extern "C" {
#include "gf_backend_registry.h"
#include "gf_runner.h"
}

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace graphed {

namespace {

[[noreturn]] void raise_status(gf_status status, const gf_error &err) {
  const char *message = err.message[0] ? err.message : gf_status_name(status);
  const ErrorKind kind = error_kind_of(status);
  TORCH_CHECK_VALUE(kind != ErrorKind::value, message);
  TORCH_CHECK_TYPE(kind != ErrorKind::type, message);
  TORCH_CHECK(false, message);
}

// Borrowed descriptors of the tensors, after checking each is defined and has at most GF_MAX_DIMS
// dimensions: each the tensor itself, or with dense (see describe_dense) a dense copy of one the
// core cannot read as it is. No reference is taken. Tensors is at::TensorList or TensorsOnStack:
// anything with size() and a const at::Tensor &operator[].
template <typename Tensors>
std::vector<gf_tensor> describe_borrowed(const Tensors &tensors, std::vector<at::Tensor> *dense) {
  std::vector<gf_tensor> described(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor &tensor = tensors[i];
    if (const char *why = unsupported_tensor_reason(tensor)) {
      TORCH_CHECK_TYPE(false, format_message("graphed: input tensor %zu %s", i, why));
    }
    if (tensor.dim() > GF_MAX_DIMS) {
      TORCH_CHECK_VALUE(false, format_message("graphed: input tensor %zu has %lld dimensions; at "
                                              "most %d are supported",
                                              i, static_cast<long long>(tensor.dim()),
                                              static_cast<int>(GF_MAX_DIMS)));
    }
    if (dense != nullptr) {
      described[i] = describe_dense(tensor, *dense, tensors.size());
    } else {
      described[i] = describe_tensor(tensor, false);
      described[i].handle = const_cast<at::Tensor *>(&tensor);
    }
  }
  return described;
}

// The tensors of a Tensor[] (or Tensor[]?) argument where the boxed kernel finds it on the stack,
// each read in place: no reference is taken or dropped. None reads as no tensor.
class TensorsOnStack {
public:
  explicit TensorsOnStack(const c10::IValue &list)
      : items_(list.isNone() ? c10::ArrayRef<c10::IValue>() : list.toListRef()) {}
  size_t size() const { return items_.size(); }
  const at::Tensor &operator[](size_t i) const { return items_[i].toTensor(); }

private:
  c10::ArrayRef<c10::IValue> items_;
};

// The pool handle a runner on `backend` (NULL: the one chosen at load) is made on when it shares
// `pool`: the pool's, when the backend that made it is the runner's; else NULL, memory of the
// runner's own (a pool of another backend shares no memory with it).
void *pool_handle_for(const PoolSlot &pool, const gf_backend *backend) {
  const gf_backend *runner_backend = backend != nullptr ? backend : gf_backend_current();
  return pool.backend == runner_backend ? pool.handle : nullptr;
}

// The values of create's arguments that the core's config cannot hold, refused as ValueError.
void check_create_arguments(c10::string_view cpu_inputs, int64_t churn_limit, int64_t max_entries,
                            int64_t warmup_iters) {
  TORCH_CHECK_VALUE(cpu_inputs == "refuse" || cpu_inputs == "to_device",
                    "graphed: cpu_inputs must be 'refuse' or 'to_device', got '",
                    std::string(cpu_inputs), "'");
  TORCH_CHECK_VALUE(churn_limit >= 0 && churn_limit <= INT32_MAX,
                    "graphed: churn_limit must be between 0 (no guard) and 2147483647, got ",
                    churn_limit);
  if (max_entries < 1 || warmup_iters < 0 || warmup_iters > INT32_MAX) {
    TORCH_CHECK_VALUE(false, format_message("graphed: max_entries must be at least 1 and "
                                            "warmup_iters between 0 and 2147483647, got %lld and "
                                            "%lld",
                                            static_cast<long long>(max_entries),
                                            static_cast<long long>(warmup_iters)));
  }
}

int64_t create_op(c10::string_view name, c10::string_view forward_op_name, c10::Device device,
                  int64_t max_entries, int64_t warmup_iters, bool enabled,
                  std::optional<c10::string_view> agree_op,
                  std::optional<c10::string_view> observer_op,
                  std::optional<c10::string_view> group_name,
                  std::optional<c10::string_view> backend_name, std::optional<int64_t> memory_pool,
                  c10::string_view cpu_inputs, int64_t churn_limit) {
  check_create_arguments(cpu_inputs, churn_limit, max_entries, warmup_iters);
  const gf_backend *backend = nullptr; // the one chosen at load
  if (backend_name.has_value()) {
    char why[512] = "";
    backend = gf_backend_find(std::string(*backend_name).c_str(), why, sizeof why);
    if (backend == nullptr) {
      TORCH_CHECK_VALUE(false, format_message("graphed: cannot use backend '%s': %s",
                                              std::string(*backend_name).c_str(), why));
    }
  }
  std::shared_ptr<PoolSlot> pool; // held until the runner holds the pool itself
  if (memory_pool.has_value()) {
    pool = find_pool(*memory_pool, device);
  }
  // An empty forward_op: the caller attaches a direct forward right after (GraphedForward, through
  // the extension: attach_direct_hooks), so that no operator is registered per instance.
  auto *context = forward_op_name.empty()
                      ? new HostContext()
                      : new HostContext{find_operator(std::string(forward_op_name), "forward")};
  context->name = std::string(name);
  try {
    if (agree_op.has_value() && !agree_op->empty()) {
      context->agree_op = find_operator(std::string(*agree_op), "agreement");
    }
    if (observer_op.has_value() && !observer_op->empty()) {
      context->observer_op = find_operator(std::string(*observer_op), "observer");
    }
    TORCH_CHECK_VALUE(!(group_name.has_value() && context->agree_op.has_value()),
                      "graphed: give a runner agree_op or group_name, not both");
    if (group_name.has_value()) {
      context->group_name = std::string(*group_name);
    }
    context->device = device;
  } catch (...) {
    delete context;
    throw;
  }
  gf_runner_config config{};
  config.device_type = static_cast<int>(device.type());
  config.device_index = device.has_index() ? device.index() : -1;
  config.max_entries = static_cast<size_t>(max_entries);
  config.warmup_iters = static_cast<int>(warmup_iters);
  config.enabled = enabled ? 1 : 0;
  config.pool = pool != nullptr ? pool_handle_for(*pool, backend) : nullptr;
  config.churn_limit = static_cast<unsigned>(churn_limit);
  gf_host host = make_torch_host(context);
  gf_runner *runner = nullptr;
  gf_error err{};
  gf_status status = gf_runner_create(&config, &host, backend, &runner, &err);
  if (status != GF_OK) {
    raise_status(status, err);
  }
  const bool stages_cpu_inputs = cpu_inputs == "to_device" && !device.is_cpu();
  // the runner owns the context from here on
  return register_runner(runner, std::string(name), device, context, stages_cpu_inputs);
}

// Collects a call's outputs into the c10::List the stack holds them in.
class ListOfOutputs final : public RunnerCallParty {
public:
  void reserve(size_t count) override { outputs.reserve(count); }
  void add(at::Tensor output) override { outputs.push_back(std::move(output)); }
  c10::List<at::Tensor> outputs;
};

c10::List<at::Tensor> forward_op(int64_t runner_id, c10::string_view key,
                                 const TensorsOnStack &inputs, const TensorsOnStack &keep_alive,
                                 bool pin, bool static_outputs) {
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::vector<at::Tensor> dense_keep_alive;
  std::vector<gf_tensor> described = describe_borrowed(inputs, nullptr);
  std::vector<gf_tensor> held = describe_borrowed(keep_alive, &dense_keep_alive);
  // served stays NULL: call_runner takes the CPython entry's request, if any, under the lock.
  gf_call_options options{pin ? 1 : 0, static_outputs ? 1 : 0, nullptr, nullptr, 0};
  ListOfOutputs outputs;
  gf_error err{};
  gf_status status =
      call_runner(*slot, key.data(), key.size(), described.data(), described.size(), held.data(),
                  held.size(), options, LockPolicy::plain, outputs, &err);
  if (status != GF_OK) {
    if (err.input_number > 0 && err.input_number <= inputs.size()) {
      word_input_error(inputs[err.input_number - 1],
                       "inputs[" + std::to_string(err.input_number - 1) + "]", slot->device, &err);
    }
    raise_status(status, err);
  }
  return std::move(outputs.outputs);
}

// The argument lists a forward call released together (see forward_kernel).
struct ArgumentLists {
  c10::IValue inputs;
  c10::IValue keep_alive;
};

void release_argument_lists(void *context) noexcept {
  auto *lists = static_cast<ArgumentLists *>(context);
  lists->inputs = c10::IValue();
  lists->keep_alive = c10::IValue();
}

// Whether a tensor has a Python object (the detection keeps the build working with a torch whose
// PyObjectSlot lacks load_pyobj; such a torch is answered "yes", which only costs a GIL
// acquisition).
template <typename Slot, typename = void> struct SlotLoadsPyObject : std::false_type {};
template <typename Slot>
struct SlotLoadsPyObject<Slot, std::void_t<decltype(std::declval<const Slot &>().load_pyobj())>>
    : std::true_type {};

template <typename Slot> bool slot_has_python_object(const Slot *slot) {
  if constexpr (SlotLoadsPyObject<Slot>::value) {
    return slot->load_pyobj() != nullptr;
  } else {
    return true;
  }
}

// Whether releasing this list makes torch release a Python object, which takes the GIL: the list
// is the last holder of its elements, and a tensor in it is held by its Python object and this
// list alone. Tensors made in C++, and lists a C++ caller still holds the tensors of (the
// dispatcher's boxing copies them), release without the GIL, so they are released as they are.
bool releases_a_python_object(const c10::IValue &list) {
  if (!list.isTensorList() || list.use_count() != 1) {
    return false;
  }
  for (const c10::IValue &item : list.toListRef()) {
    const at::Tensor &tensor = item.toTensor();
    if (tensor.defined() && tensor.use_count() == 2 &&
        slot_has_python_object(tensor.unsafeGetTensorImpl()->pyobj_slot())) {
      return true;
    }
  }
  return false;
}

// graphed::forward's kernel, boxed. A call from Python through torch.ops reaches its kernel
// boxed, with the GIL released, and the wrapper of an unboxed kernel drops the argument lists
// there: each input tensor, which its Python object also holds, then takes the GIL again to
// release that object (TensorImpl::decref_pyobject). Measured with callgrind on torch 2.14.1 at
// K=64, that was about a third of the operator's instructions and 65 GIL acquisitions a call.
// This kernel reads the tensors in place on the stack and releases both lists under one
// acquisition (run_holding_interpreter_lock, Note [GIL release]), taken only when a release needs
// it. C++ callers reach it through the dispatcher's boxing, which costs them one IValue per tensor.
void forward_kernel(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  constexpr size_t argument_count = 6;
  c10::IValue *arguments = &*(stack->end() - argument_count);
  c10::List<at::Tensor> outputs =
      forward_op(arguments[0].toInt(), arguments[1].toStringView(), TensorsOnStack(arguments[2]),
                 TensorsOnStack(arguments[3]), arguments[4].toBool(), arguments[5].toBool());
  ArgumentLists lists{std::move(arguments[2]), std::move(arguments[3])};
  torch::jit::drop(*stack, argument_count);
  stack->emplace_back(std::move(outputs));
  if (releases_a_python_object(lists.inputs) || releases_a_python_object(lists.keep_alive)) {
    run_holding_interpreter_lock(release_argument_lists, &lists);
  }
}

// The names of stats' counters, in the order stats_op packs them: Python reads them through
// stat_names, so the order is written here only.
const char *const kStatNames[] = {"graphs",
                                  "pinned",
                                  "captures",
                                  "replays",
                                  "evictions",
                                  "eager_calls",
                                  "pool_bytes",
                                  "enabled",
                                  "graph_bytes",
                                  "shared_input_bytes",
                                  "pool_reserved_bytes",
                                  "churn_eager_calls",
                                  "churn_guarding",
                                  "hits",
                                  "stale_drops",
                                  "externals",
                                  "staged_constants"};

std::vector<std::string> stat_names_op() {
  return std::vector<std::string>(std::begin(kStatNames), std::end(kStatNames));
}

// The counters, the backend's name, and why the runner is disabled: the sentence for people and
// the cause's name for programs (gf_disable_cause.h; "none" while enabled).
std::tuple<std::vector<int64_t>, std::string, std::string, std::string>
stats_op(int64_t runner_id) {
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  gf_runner_stats stats{};
  gf_runner_get_stats(slot->runner, &stats);
  std::vector<int64_t> counters{static_cast<int64_t>(stats.graphs),
                                static_cast<int64_t>(stats.pinned),
                                static_cast<int64_t>(stats.captures),
                                static_cast<int64_t>(stats.replays),
                                static_cast<int64_t>(stats.evictions),
                                static_cast<int64_t>(stats.eager_calls),
                                stats.pool_bytes,
                                stats.enabled,
                                stats.graph_bytes,
                                stats.shared_input_bytes,
                                stats.pool_reserved_bytes,
                                static_cast<int64_t>(stats.churn_eager_calls),
                                stats.churn_guarding,
                                static_cast<int64_t>(stats.hits),
                                static_cast<int64_t>(stats.stale_drops),
                                static_cast<int64_t>(stats.externals),
                                static_cast<int64_t>(stats.staged_constants)};
  static_assert(sizeof kStatNames / sizeof kStatNames[0] == 17, "a name for every counter");
  return {counters, gf_runner_backend_name(slot->runner), gf_runner_disabled_reason(slot->runner),
          gf_disable_cause_name(gf_runner_disabled_cause(slot->runner))};
}

void disable_op(int64_t runner_id, c10::string_view reason, c10::string_view cause) {
  const int code = gf_disable_cause_of_name(std::string(cause).c_str());
  TORCH_CHECK_VALUE(code > GF_CAUSE_NONE,
                    "graphed: disable's cause must name one of "
                    "gf_disable_cause's causes (user, verify, watch, ...), got '",
                    cause, "'");
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  gf_runner_disable(slot->runner, static_cast<gf_disable_cause>(code), std::string(reason).c_str());
}

void reset_op(int64_t runner_id) {
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  gf_runner_reset(slot->runner);
}

void destroy_op(int64_t runner_id) {
  if (!unregister_runner(runner_id)) {
    TORCH_CHECK_VALUE(false, format_message("graphed: no runner with id %lld to destroy (it was "
                                            "destroyed already, or never created)",
                                            static_cast<long long>(runner_id)));
  }
}

// One row per resident entry, most recently used first: its key (hex), input shapes, replays,
// static bytes, device bytes its capture took (-1: unknown), pinned, folded, written-back inputs,
// static input bytes it shares with another entry, device bytes its capture added to what the
// allocator holds (-1: unknown), seconds its capture took, tensors its capture read from outside
// the kwargs and the module, host constants its capture staged.
using EntryRows = std::tuple<std::vector<std::string>, std::vector<std::string>,
                             std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                             std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                             std::vector<int64_t>, std::vector<int64_t>, std::vector<double>,
                             std::vector<int64_t>, std::vector<int64_t>>;

// The names of entries' columns, in their order: Python reads them through entry_fields.
const char *const kEntryFields[] = {"key",
                                    "shapes",
                                    "replays",
                                    "static_bytes",
                                    "device_bytes",
                                    "pinned",
                                    "folded",
                                    "written_back",
                                    "shared_input_bytes",
                                    "reserved_bytes",
                                    "capture_seconds",
                                    "externals",
                                    "staged"};
static_assert(sizeof kEntryFields / sizeof kEntryFields[0] == std::tuple_size<EntryRows>::value,
              "a name for every column");

std::vector<std::string> entry_fields_op() {
  return std::vector<std::string>(std::begin(kEntryFields), std::end(kEntryFields));
}

void add_entry_row(void *context, const gf_entry_info *info) {
  auto &rows = *static_cast<EntryRows *>(context);
  static const char digits[] = "0123456789abcdef";
  std::string key;
  key.reserve(2 * info->key_length);
  for (size_t i = 0; i < info->key_length; ++i) {
    key += digits[info->key[i] >> 4];
    key += digits[info->key[i] & 15];
  }
  std::get<0>(rows).push_back(std::move(key));
  std::get<1>(rows).push_back(describe_shapes(info->inputs, info->input_count));
  std::get<2>(rows).push_back(static_cast<int64_t>(info->replays));
  std::get<3>(rows).push_back(info->static_bytes);
  std::get<4>(rows).push_back(info->device_bytes);
  std::get<5>(rows).push_back(info->pinned);
  std::get<6>(rows).push_back(info->folded);
  std::get<7>(rows).push_back(static_cast<int64_t>(info->mutated_count));
  std::get<8>(rows).push_back(info->shared_input_bytes);
  std::get<9>(rows).push_back(info->reserved_bytes);
  std::get<10>(rows).push_back(info->capture_seconds);
  std::get<11>(rows).push_back(static_cast<int64_t>(info->externals));
  std::get<12>(rows).push_back(static_cast<int64_t>(info->staged));
}

EntryRows entries_op(int64_t runner_id) {
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  EntryRows rows;
  gf_runner_visit_entries(slot->runner, add_entry_row, &rows);
  return rows;
}

int64_t pool_create_op(c10::Device device) { return create_pool(device); }

void pool_release_op(int64_t pool_id) {
  if (!release_pool(pool_id)) {
    TORCH_CHECK_VALUE(false, format_message("graphed: no memory pool with id %lld to release (it "
                                            "was released already, or never created)",
                                            static_cast<long long>(pool_id)));
  }
}

std::vector<std::string> backend_op() {
  return {gf_backend_current()->name, gf_backend_choice_reason()};
}

int64_t entry_replays_op(int64_t runner_id, c10::string_view key, at::TensorList inputs) {
  std::shared_ptr<RunnerSlot> slot = find_runner(runner_id);
  std::vector<at::Tensor> dense;
  std::vector<gf_tensor> described = describe_borrowed(inputs, &dense);
  std::lock_guard<std::recursive_mutex> guard(slot->mutex);
  return gf_runner_entry_replays(slot->runner, key.data(), key.size(), described.data(),
                                 described.size());
}

std::string observer_schema_op() { return kObserverSchema; }

int64_t forward_phase_op() { return static_cast<int64_t>(phase_of_forward_on_this_thread()); }

} // namespace

} // namespace graphed

TORCH_LIBRARY(graphed, m) {
  m.def("create(str name, str forward_op, Device device, int max_entries=16, "
        "int warmup_iters=2, bool enabled=True, str? agree_op=None, str? observer_op=None, "
        "str? group_name=None, str? backend=None, int? memory_pool=None, "
        "str cpu_inputs='refuse', int churn_limit=0) -> int",
        &graphed::create_op);
  m.def("pool_create(Device device) -> int", &graphed::pool_create_op);
  m.def("pool_release(int pool) -> ()", &graphed::pool_release_op);
  // pt2_compliant: its fake implementation (graphed/_fake.py) passes torch.library.opcheck
  // (tests/python/test_compile.py).
  m.def("forward(int runner, str key, Tensor[] inputs, Tensor[]? keep_alive=None, "
        "bool pin=False, bool static_outputs=False) -> Tensor[]",
        {at::Tag::pt2_compliant_tag});
  m.impl("forward", c10::DispatchKey::CompositeExplicitAutograd,
         torch::CppFunction::makeFromBoxedFunction<&graphed::forward_kernel>());
  m.def("stats(int runner) -> (int[], str, str, str)", &graphed::stats_op);
  m.def("stat_names() -> str[]", &graphed::stat_names_op);
  m.def("disable(int runner, str reason, str cause='user') -> ()", &graphed::disable_op);
  m.def("reset(int runner) -> ()", &graphed::reset_op);
  m.def("destroy(int runner) -> ()", &graphed::destroy_op);
  m.def("backend() -> str[]", &graphed::backend_op);
  m.def("entry_replays(int runner, str key, Tensor[] inputs) -> int", &graphed::entry_replays_op);
  m.def("forward_phase() -> int", &graphed::forward_phase_op);
  m.def("observer_schema() -> str", &graphed::observer_schema_op);
  m.def("entries(int runner) -> (str[], str[], int[], int[], int[], int[], int[], int[], int[], "
        "int[], float[], int[], int[])",
        &graphed::entries_op);
  m.def("entry_fields() -> str[]", &graphed::entry_fields_op);
}
