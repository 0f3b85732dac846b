// Tests of gf_runner_create's checks of the tables it is given: a backend that could capture
// must fill every device hook the protocol calls (and both folding hooks or neither), a backend
// that refuses needs none, and every refusal frees the host's context exactly once.
#include "gf_backend_registry.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <string>

namespace {

class RunnerCreate : public ::testing::Test {
protected:
  void SetUp() override {
    gf_fake_backend_init(&backend_, &log_);
    gf_fake_host_init(&host_, &log_, &backend_);
    config_.device_type = GF_FAKE_DEVICE_TYPE;
    config_.device_index = 0;
    config_.max_entries = 4;
    config_.warmup_iters = 1;
    config_.enabled = 1;
  }
  void TearDown() override {
    gf_runner_destroy(runner_);
    gf_fake_host_free(&host_);
    gf_fake_log_free(&log_);
  }

  // Creates on table; returns the status and leaves the message in err_.
  gf_status Create(const gf_backend *table) {
    gf_host host = gf_fake_host_table(&host_);
    return gf_runner_create(&config_, &host, table, &runner_, &err_);
  }

  gf_fake_log log_ = {};
  gf_fake_backend backend_ = {};
  gf_fake_host host_ = {};
  gf_runner_config config_ = {};
  gf_runner *runner_ = nullptr;
  gf_error err_ = {};
};

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

} // namespace
