// Tests of gf_runner_create and of the runner it gives: the checks of the tables it is given (a
// backend that could capture must fill every device hook that has no default, and both folding
// hooks or neither; the optional ones left out get the core's defaults; a backend that refuses
// needs none), of the config and of the host, every
// refusal freeing the host's context exactly once; the ways a runner starts eager (enabled=False,
// backend none, an unsupported device, a failing runner_create hook); and the checks of a call's
// inputs, which are the caller's errors and leave the runner enabled.
#include "gf_backend_registry.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include <string>
#include <vector>

namespace {

using RunnerCreate = runner_test::Runner;
using runner_test::Contains;
using runner_test::Events;
using runner_test::Inputs;
using runner_test::MakeInputs;
using runner_test::Result;
using runner_test::Runner;

// The fake host's empty_like, failing with GF_ERR_NO_MEMORY while out_of_memory is set, as an
// allocator that has run dry would.
bool out_of_memory = false;
gf_status (*fake_empty_like)(void *, const gf_tensor *, gf_tensor *, gf_error *) = nullptr;

gf_status empty_like_running_dry(void *context, const gf_tensor *like, gf_tensor *out,
                                 gf_error *err) {
  if (out_of_memory) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: no memory left for an output");
  }
  return fake_empty_like(context, like, out, err);
}

TEST_F(RunnerCreate, RefusesABackendThatLacksADeviceHook) {
  gf_backend table = backend_.table;
  table.launch = nullptr;
  EXPECT_EQ(Create(&table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_EQ(std::string(err_.message), "graphed: backend 'fake' lacks the hook launch");
  EXPECT_EQ(host_.destroyed, 1) << "the host's context is freed on refusal";
}

TEST_F(RunnerCreate, RefusesHalfOfTheCallerStreamHooks) {
  gf_backend table = backend_.table;
  table.caller_stream_begin = [](void *, void *, gf_error *) { return GF_OK; };
  table.caller_stream_end = nullptr;
  EXPECT_EQ(Create(&table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err_.message).find("caller_stream_begin and caller_stream_end"),
            std::string::npos)
      << err_.message;
}

TEST_F(RunnerCreate, RefusesHalfOfTheFoldingHooks) {
  gf_backend table = backend_.table;
  table.capture_copy_node = [](void *, void *, int, const gf_copy *, size_t, int *recorded,
                               gf_error *) {
    *recorded = 0;
    return GF_OK;
  };
  table.launch_folded = nullptr;
  EXPECT_EQ(Create(&table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err_.message).find("both or neither"), std::string::npos) << err_.message;
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(RunnerCreate, RefusesANamelessBackend) {
  gf_backend table = backend_.table;
  table.name = nullptr;
  EXPECT_EQ(Create(&table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err_.message),
            "graphed: a backend table needs a name and graphs_supported");
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(RunnerCreate, ARefusingBackendNeedsNoDeviceHook) {
  gf_backend table = {};
  table.name = "refusing";
  table.graphs_supported = [](void *, int, int, char *why, size_t capacity) {
    std::snprintf(why, capacity, "no such device");
    return 0;
  };
  ASSERT_EQ(Create(&table), GF_OK) << err_.message;
  EXPECT_EQ(std::string(gf_runner_disabled_reason(runner_)),
            "graphs unavailable (backend refusing): no such device");
  EXPECT_EQ(host_.destroyed, 0);
}

TEST_F(RunnerCreate, OptionalHooksLeftOutGetTheCoresDefaults) {
  gf_backend table = backend_.table;
  table.sync_probe_begin = nullptr;
  table.sync_probe_end = nullptr;
  table.warmup_begin = nullptr;
  table.warmup_end = nullptr;
  ASSERT_EQ(Create(&table), GF_OK) << err_.message;
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs); // captures and replays
  const Events log = Log();
  auto logged = [&log](const char *event) {
    return std::find(log.begin(), log.end(), event) != log.end();
  };
  EXPECT_FALSE(logged("warmup_begin") || logged("probe_begin")) << "they were left out";
  EXPECT_TRUE(logged("capture_end") && logged("launch"));
  gf_runner_stats stats{};
  gf_runner_get_stats(runner_, &stats);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.enabled, 1);
}

TEST_F(RunnerCreate, ADisabledRunnerNeedsNoDeviceHook) {
  gf_backend table = backend_.table;
  table.launch = nullptr;
  config_.enabled = 0;
  ASSERT_EQ(Create(&table), GF_OK) << err_.message;
  EXPECT_EQ(std::string(gf_runner_disabled_reason(runner_)),
            "disabled by the caller (enabled=False)");
}

TEST_F(RunnerCreate, APoolHandleReachesTheBackendsRunnerCreate) {
  gf_backend table = backend_.table;
  table.pool_create = [](void *, int, int, void **pool, gf_error *) {
    *pool = nullptr;
    return GF_OK;
  };
  table.pool_release = [](void *, void *) {};
  int pool = 0; // the handle a pool_create of this backend made
  config_.pool = &pool;
  ASSERT_EQ(Create(&table), GF_OK) << err_.message;
  EXPECT_EQ(backend_.runner_pool, &pool);
}

TEST_F(RunnerCreate, RefusesAPoolForABackendWithoutPools) {
  int pool = 0;
  config_.pool = &pool;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_EQ(host_.destroyed, 1) << "the host's context is freed on refusal";
}

TEST_F(RunnerCreate, RefusesAnIncompleteHostAndFreesItsContextOnce) {
  gf_host host = gf_fake_host_table(&host_);
  host.retain = nullptr;
  EXPECT_EQ(gf_runner_create(&config_, &host, &backend_.table, &runner_, &err_),
            GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err_.message), "graphed: the runner's host is incomplete");
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(RunnerCreate, RefusesNegativeWarmupsAfterCheckingTheTables) {
  config_.warmup_iters = -1;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(err_.message), "graphed: warmup_iters must be 0 or more, got -1");
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(RunnerCreate, AnAllocationFailureInAReplayIsNamedAsSuch) {
  gf_host table = gf_fake_host_table(&host_);
  fake_empty_like = table.empty_like;
  table.empty_like = empty_like_running_dry;
  ASSERT_EQ(gf_runner_create(&config_, &table, &backend_.table, &runner_, &err_), GF_OK);
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs); // captures and replays
  out_of_memory = true;
  runner_test::Result failed = Call(inputs.views);
  out_of_memory = false;
  EXPECT_EQ(failed.status, GF_OK) << "the call still returns the eager result";
  EXPECT_EQ(Reason(), "out of host memory for a replay: no memory left for an output");
}

// ---- refused configurations --------------------------------------------------------------

TEST_F(Runner, NegativeWarmupItersIsRejected) {
  config_.warmup_iters = -1;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_TRUE(Contains(err_.message, "warmup_iters")) << err_.message;
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(Runner, ZeroMaxEntriesFailsCreateAndDestroysTheHost) {
  config_.max_entries = 0;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_TRUE(Contains(err_.message, "max_entries")) << err_.message;
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(Runner, IncompleteHostFailsCreate) {
  gf_host table = gf_fake_host_table(&host_);
  table.retain = nullptr;
  EXPECT_EQ(gf_runner_create(&config_, &table, &backend_.table, &runner_, &err_),
            GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_EQ(host_.destroyed, 1);
}

// ---- the ways a runner starts eager ------------------------------------------------------

TEST_F(Runner, FailedRunnerCreateHookDisables) {
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_RUNNER_CREATE, 0, "no stream available");
  Create();
  EXPECT_EQ(Reason(), "no stream available");
  EXPECT_EQ(gf_runner_disabled_cause(runner_), GF_CAUSE_BACKEND);
  EXPECT_STREQ(gf_disable_cause_name(gf_runner_disabled_cause(runner_)), "backend");
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 1u);
}

TEST_F(Runner, EnabledFalseRunsEagerWithReason) {
  config_.enabled = 0;
  Create();
  EXPECT_EQ(Reason(), "disabled by the caller (enabled=False)");
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RUNNER_CREATE], 0u);
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"forward", "forward"}));
  EXPECT_EQ(Stats().eager_calls, 2u);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().captures, 0u);
}

TEST_F(Runner, EagerForwardFailureIsReturned) {
  config_.enabled = 0;
  host_.fail_forward = 1;
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  Result result = Call(inputs.views);
  EXPECT_EQ(result.status, GF_ERR_BACKEND);
  EXPECT_TRUE(Contains(result.message, "fake forward failed")) << result.message;
  EXPECT_TRUE(result.values.empty());
}

TEST_F(Runner, NoneBackendIsUnavailableWithItsOwnReason) {
  gf_backend_none_set_reason("the test machine has no device");
  ASSERT_EQ(Create(gf_backend_none()), GF_OK);
  std::string reason = Reason();
  EXPECT_EQ(reason, "graphs unavailable (backend none): the test machine has no device");
  EXPECT_STREQ(gf_runner_backend_name(runner_), "none");
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Stats().eager_calls, 1u);
  EXPECT_EQ(Stats().enabled, 0);
}

TEST_F(Runner, DefaultBackendWithNothingRegisteredIsNone) {
  gf_backend_choose(); // the core tests register no backend
  ASSERT_EQ(Create(nullptr), GF_OK);
  EXPECT_STREQ(gf_runner_backend_name(runner_), "none");
  EXPECT_EQ(Reason(), "graphs unavailable (backend none): no graph-capable device: graphed was "
                      "built with no device backend")
      << Reason();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
}

TEST_F(Runner, UnsupportedDeviceIsUnavailable) {
  backend_.supported = 0;
  Create();
  EXPECT_EQ(Reason(),
            "graphs unavailable (backend fake): the fake backend was told graphs are unsupported");
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RUNNER_CREATE], 0u);
}

// ---- a call's inputs ---------------------------------------------------------------------

TEST_F(Runner, NonContiguousInputIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  std::vector<gf_tensor> views = {inputs.views[0], inputs.views[1]};
  views[1].sizes[0] = 3;
  views[1].sizes[1] = 2;
  views[1].strides[0] = 1;
  views[1].strides[1] = 3; // a transpose
  Result result = Call(views);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 1")) << result.message;
  EXPECT_TRUE(Contains(result.message, "non-contiguous")) << result.message;
  EXPECT_TRUE(result.values.empty());
  EXPECT_TRUE(Log().empty());
  EXPECT_EQ(Stats().enabled, 1) << "a bad input is the caller's error, not the runner's";
  EXPECT_EQ(Stats().eager_calls, 0u);
}

TEST_F(Runner, InputOnAnotherDeviceIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  std::vector<gf_tensor> elsewhere = {inputs.views[0], inputs.views[1]};
  elsewhere[1].device_index = 1; // the runner captures on index 0
  Result result = Call(elsewhere);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 1")) << result.message;
  EXPECT_TRUE(Contains(result.message, "runner's device")) << result.message;
  EXPECT_EQ(result.input_number, 2u) << "the layer above names input 1 in its own words";
  elsewhere[1] = inputs.views[1];
  elsewhere[0].device_type = GF_FAKE_DEVICE_TYPE + 1;
  result = Call(elsewhere);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 0")) << result.message;
  EXPECT_TRUE(Log().empty());
  EXPECT_EQ(Stats().enabled, 1) << "a bad input is the caller's error, not the runner's";
  CallExpectingCorrect(inputs); // and the runner still captures and replays
  EXPECT_EQ(Stats().captures, 1u);
}

TEST_F(Runner, TooManyDimensionsIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(1, {1}, 1.0f);
  gf_tensor deep = inputs.views[0];
  deep.ndim = GF_MAX_DIMS + 1;
  Result result = Call({deep});
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "dimensions")) << result.message;
  EXPECT_EQ(Stats().enabled, 1);
}

} // namespace
