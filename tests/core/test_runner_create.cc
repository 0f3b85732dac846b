// Tests of gf_runner_create's checks of the tables it is given: a backend that could capture
// must fill every device hook the protocol calls (and both folding hooks or neither), a backend
// that refuses needs none, and every refusal frees the host's context exactly once.
#include "gf_backend_registry.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <string>

namespace {

using RunnerCreate = runner_test::Runner;
using runner_test::Inputs;
using runner_test::MakeInputs;

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

TEST_F(RunnerCreate, ADisabledRunnerNeedsNoDeviceHook) {
  gf_backend table = backend_.table;
  table.launch = nullptr;
  config_.enabled = 0;
  ASSERT_EQ(Create(&table), GF_OK) << err_.message;
  EXPECT_EQ(std::string(gf_runner_disabled_reason(runner_)),
            "disabled by the caller (enabled=False)");
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
  EXPECT_EQ(Reason(), "out of host memory for a replay: graphed: no memory left for an output");
}

} // namespace
