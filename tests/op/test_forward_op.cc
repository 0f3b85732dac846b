// Op-level tests: graphed::forward reached through c10::Dispatcher, as C++ code reaches it, with a
// forward registered in C++. The plugin is loaded with dlopen, as torch.ops.load_library does, and
// then the test plugin (tests/plugin), whose emulated backend registers itself into the plugin's
// exported registry from outside it; runners name it with create's `backend` argument.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/library.h>
// The CUDA cases need the CUDA toolkit's headers (torch's c10/cuda includes them); a build
// against a CUDA torch on a machine without the toolkit compiles them as skips that say so.
#if GRAPHED_OP_TESTS_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#endif

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <tuple>
#include <vector>

namespace {

std::atomic<int> forward_calls{0};

// out0 = 2 * a + b, out1 = a.sum(): two outputs of different shapes.
std::vector<at::Tensor> cpp_forward(at::TensorList inputs) {
  forward_calls++;
  return {inputs[0] * 2 + inputs[1], inputs[0].sum()};
}

std::vector<at::Tensor> failing_forward(at::TensorList inputs) {
  TORCH_CHECK(false, "deliberate failure in the forward");
  return {inputs[0]};
}

// Reads a value back to the host in C++ (a synchronization no capture survives), then finishes.
std::atomic<int> syncing_forwards_finished{0};
std::vector<at::Tensor> syncing_forward(at::TensorList inputs) {
  const double peak = inputs[0].abs().max().item<double>();
  syncing_forwards_finished++;
  return {inputs[0] / (1.0 + peak)};
}

// Counts the warnings that reach it: the handler a C++ program had before graphed's probe.
struct CountingHandler final : c10::WarningHandler {
  void process(const c10::Warning &) override { ++seen; }
  int seen = 0;
};

} // namespace

TORCH_LIBRARY(graphed_cpp_test, m) {
  m.def("fwd(Tensor[] inputs) -> Tensor[]");
  m.impl("fwd", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(cpp_forward));
  m.def("syncing(Tensor[] inputs) -> Tensor[]");
  m.impl("syncing", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(syncing_forward));
  m.def("failing(Tensor[] inputs) -> Tensor[]");
  m.impl("failing", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(failing_forward));
}

namespace {

class ForwardOpTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    handle = dlopen(GRAPHED_LIBRARY_PATH, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    testing_plugin = dlopen(GRAPHED_TESTING_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(testing_plugin, nullptr) << dlerror();
  }

  static c10::OperatorHandle op(const char *name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  }

  // A runner on `backend` (std::nullopt: the one chosen at load).
  static int64_t create(const std::string &forward, c10::Device device,
                        std::optional<c10::string_view> backend = std::nullopt,
                        int64_t max_entries = 4) {
    using Name = std::optional<c10::string_view>;
    static auto create_op =
        op("graphed::create")
            .typed<int64_t(c10::string_view, c10::string_view, c10::Device, int64_t, int64_t, bool,
                           Name, Name, Name, Name, std::optional<int64_t>, c10::string_view,
                           int64_t)>();
    return create_op.call("cpp", forward, device, max_entries, 1, true, std::nullopt, std::nullopt,
                          std::nullopt, backend, std::nullopt, "refuse", 0);
  }

  static std::vector<at::Tensor> forward(int64_t runner, const std::string &key,
                                         std::vector<at::Tensor> inputs) {
    static auto forward_op =
        op("graphed::forward")
            .typed<std::vector<at::Tensor>(int64_t, c10::string_view, at::TensorList,
                                           at::TensorList, bool, bool)>();
    return forward_op.call(runner, key, inputs, {}, false, false);
  }

  using Stats = std::tuple<std::vector<int64_t>, std::string, std::string, std::string>;
  static Stats stats(int64_t runner) {
    static auto stats_op = op("graphed::stats").typed<Stats(int64_t)>();
    return stats_op.call(runner);
  }

  static void destroy(int64_t runner) {
    static auto destroy_op = op("graphed::destroy").typed<void(int64_t)>();
    destroy_op.call(runner);
  }

  static void *handle;
  static void *testing_plugin;
};

void *ForwardOpTest::handle = nullptr;
void *ForwardOpTest::testing_plugin = nullptr;

enum Counter {
  kGraphs,
  kPinned,
  kCaptures,
  kReplays,
  kEvictions,
  kEagerCalls,
  kPoolBytes,
  kEnabled
};

TEST_F(ForwardOpTest, CpuRunnerRunsEagerWithReason) {
  int64_t runner = create("graphed_cpp_test::fwd", c10::Device(c10::kCPU));
  at::Tensor a = at::randn({3, 5});
  at::Tensor b = at::randn({3, 5});
  std::vector<at::Tensor> out = forward(runner, "k", {a, b});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::allclose(out[0], a * 2 + b));
  EXPECT_TRUE(at::allclose(out[1], a.sum()));
  auto [counters, backend, reason, cause] = stats(runner);
  EXPECT_EQ(counters[kEnabled], 0);
  EXPECT_EQ(counters[kEagerCalls], 1);
  EXPECT_FALSE(reason.empty());
  EXPECT_EQ(cause, "unavailable") << reason;
  destroy(runner);
}

TEST_F(ForwardOpTest, EmulatedBackendCapturesOnceAndReplaysPerKey) {
  const int before = forward_calls.load();
  int64_t runner = create("graphed_cpp_test::fwd", c10::Device(c10::kCPU), "emulated");
  at::Tensor a = at::randn({4, 2});
  at::Tensor b = at::randn({4, 2});
  std::vector<at::Tensor> first = forward(runner, "k", {a, b});
  EXPECT_TRUE(at::allclose(first[0], a * 2 + b));
  // One warm-up (which is also the sync probe) + the capture: two forwards, none on replay.
  EXPECT_EQ(forward_calls.load() - before, 2);
  forward(runner, "k", {at::randn({4, 2}), at::randn({4, 2})});
  EXPECT_EQ(forward_calls.load() - before, 2);
  forward(runner, "other key", {a, b});
  forward(runner, "k", {at::randn({5, 2}), at::randn({5, 2})});
  auto [counters, backend, reason, cause] = stats(runner);
  EXPECT_EQ(backend, "emulated");
  EXPECT_EQ(counters[kCaptures], 3);
  EXPECT_EQ(counters[kReplays], 4);
  EXPECT_EQ(counters[kGraphs], 3);
  EXPECT_GT(counters[kPoolBytes], 0);
  EXPECT_EQ(counters[kEnabled], 1);
  EXPECT_EQ(cause, "none");
  destroy(runner);
}

TEST_F(ForwardOpTest, FailingForwardSurfacesAsError) {
  int64_t runner = create("graphed_cpp_test::failing", c10::Device(c10::kCPU), "emulated");
  at::Tensor a = at::randn({2});
  // The capture fails, the runner is disabled, and the eager retry fails the same way.
  EXPECT_THROW(forward(runner, "k", {a, a}), c10::Error);
  auto [counters, backend, reason, cause] = stats(runner);
  EXPECT_EQ(counters[kEnabled], 0);
  EXPECT_NE(reason.find("deliberate failure"), std::string::npos) << reason;
  EXPECT_EQ(cause, "capture_failed");
  EXPECT_EQ(reason.find("graphed: "), std::string::npos) << "said once, by whoever prints it";
  destroy(runner);
}

TEST_F(ForwardOpTest, ABackendNamedAtCreateIsThatRunnersAlone) {
  int64_t emulated = create("graphed_cpp_test::fwd", c10::Device(c10::kCPU), "emulated");
  int64_t chosen = create("graphed_cpp_test::fwd", c10::Device(c10::kCPU));
  EXPECT_EQ(std::get<1>(stats(emulated)), "emulated");
  EXPECT_NE(std::get<1>(stats(chosen)), "emulated") << "no switch: the next runner is the default";
  destroy(emulated);
  destroy(chosen);
}

TEST_F(ForwardOpTest, AnUnknownBackendNameIsAValueErrorNamingTheRegisteredOnes) {
  try {
    create("graphed_cpp_test::fwd", c10::Device(c10::kCPU), "no_such_backend");
    FAIL() << "create accepted an unknown backend";
  } catch (const c10::ValueError &e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("no backend named 'no_such_backend'"), std::string::npos) << message;
    EXPECT_NE(message.find("emulated"), std::string::npos) << message;
  }
}

TEST_F(ForwardOpTest, UnknownRunnerIsAValueError) {
  EXPECT_THROW(stats(987654), c10::ValueError);
  EXPECT_THROW(forward(987654, "k", {at::randn({2})}), c10::ValueError);
}

TEST_F(ForwardOpTest, UnknownForwardOperatorIsAValueError) {
  EXPECT_THROW(create("graphed_cpp_test::missing", c10::Device(c10::kCPU)), c10::ValueError);
  EXPECT_THROW(create("no_namespace", c10::Device(c10::kCPU)), c10::ValueError);
}

TEST_F(ForwardOpTest, CudaReplayMatchesEagerOnFreshInputs) {
#if !GRAPHED_OP_TESTS_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  int64_t runner = create("graphed_cpp_test::fwd", c10::Device(c10::kCUDA, 0));
  auto options = at::TensorOptions().device(at::kCUDA, 0);
  for (int call = 0; call < 5; ++call) {
    at::Tensor a = at::randn({64, 32}, options);
    at::Tensor b = at::randn({64, 32}, options);
    std::vector<at::Tensor> out = forward(runner, "k", {a, b});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(at::allclose(out[0], a * 2 + b)) << "call " << call;
    EXPECT_TRUE(at::allclose(out[1], a.sum(), 1e-4, 1e-4)) << "call " << call;
  }
  auto [counters, backend, reason, cause] = stats(runner);
  EXPECT_EQ(backend, "cuda");
  EXPECT_EQ(counters[kEnabled], 1) << reason;
  EXPECT_EQ(counters[kCaptures], 1);
  EXPECT_EQ(counters[kReplays], 5);
  destroy(runner);
#endif
}

TEST_F(ForwardOpTest, CudaProbeCountsACppSyncLetsTheForwardFinishAndRestoresWhatItChanged) {
#if !GRAPHED_OP_TESTS_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  CountingHandler before;
  c10::WarningUtils::WarningHandlerGuard guard(&before);
  auto &sync_debug = c10::cuda::warning_state();
  sync_debug.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  int64_t runner = create("graphed_cpp_test::syncing", c10::Device(c10::kCUDA, 0));
  at::Tensor a = at::randn({16}, at::TensorOptions().device(at::kCUDA, 0));
  std::vector<at::Tensor> out = forward(runner, "k", {a});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::allclose(out[0], a / (1.0 + a.abs().max().item<double>())));
  auto [counters, backend, reason, cause] = stats(runner);
  EXPECT_EQ(counters[kEnabled], 0);
  EXPECT_NE(reason.find("called a synchronizing CUDA operation"), std::string::npos) << reason;
  // The probe ran the forward to its end (then the eager run after the disable ran it again).
  EXPECT_EQ(syncing_forwards_finished.load(), 2);
  EXPECT_EQ(before.seen, 0) << "the probe's sync warning is counted, not passed on";
  EXPECT_EQ(c10::WarningUtils::get_warning_handler(), &before);
  EXPECT_EQ(sync_debug.get_sync_debug_mode(), c10::cuda::SyncDebugMode::L_DISABLED);
  destroy(runner);
#endif
}

} // namespace
