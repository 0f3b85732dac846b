// Tests of the churn guard (ops/gf_churn.h) through a runner, and of the out-of-memory back-off
// (ops/gf_backoff.h) on its own. The guard: after `churn_limit` new keys in a
// row, a new key runs eager (with eager's values) until it comes a second time, graphs already
// captured keep replaying, many hits in a row or a reset end the guard, and a runner that agrees
// over a process group is never guarded (its ranks must capture at the same calls).
#include "gf_backoff.h"
#include "gf_churn.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

namespace {

using namespace runner_test;

class Churn : public Runner {
protected:
  void CreateGuarded(unsigned limit) {
    host_.no_group = 1;
    config_.churn_limit = limit;
    Create();
  }
  void CallRows(int64_t rows) {
    Inputs inputs = MakeInputs(1, {rows}, static_cast<float>(rows));
    CallExpectingCorrect(inputs);
  }
};

TEST_F(Churn, NewKeysThatNeverComeBackRunEagerAfterTheLimit) {
  CreateGuarded(2);
  for (int64_t rows = 1; rows <= 10; ++rows) {
    CallRows(rows);
  }
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 2u);
  EXPECT_EQ(stats.churn_eager_calls, 8u);
  EXPECT_EQ(stats.eager_calls, 8u);
  EXPECT_EQ(stats.churn_guarding, 1);
  EXPECT_EQ(stats.enabled, 1);
}

TEST_F(Churn, AKeyThatComesASecondTimeIsCapturedAndGraphsKeepReplaying) {
  CreateGuarded(2);
  for (int round = 0; round < 3; ++round) {
    for (int64_t rows = 1; rows <= 6; ++rows) {
      CallRows(rows); // a server's six shapes, in turn
    }
  }
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 6u) << "two at first sight, four at their second";
  EXPECT_EQ(stats.churn_eager_calls, 4u);
  EXPECT_EQ(stats.replays, 6u + 2u + 6u) << "each capture's replay, round 2's hits, round 3";
}

TEST_F(Churn, AValueThatChangesEveryCallStartsTheGuardAtItsSecondNewKey) {
  host_.observe = 1;
  CreateGuarded(2);
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  for (int value = 0; value < 10; ++value) {
    Result result = Call(inputs.views, kDefault, "scale=" + std::to_string(value));
    ASSERT_EQ(result.status, GF_OK) << result.message;
    EXPECT_EQ(result.values.at(0), Expected(inputs.views));
    // Two values may be two requests' settings: told only after a few in a row.
    EXPECT_EQ(host_.events[GF_EVENT_CHURN], value + 1 < GF_CHURN_VALUE_REPORT ? 0u : 1u) << value;
  }
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 1u) << "the same tensors with another value: held back at once";
  EXPECT_EQ(stats.churn_eager_calls, 9u);
  EXPECT_EQ(stats.churn_guarding, 1);
  EXPECT_TRUE(Contains(host_.last_event[GF_EVENT_CHURN].message, "4 new keys in a row"))
      << host_.last_event[GF_EVENT_CHURN].message;
}

TEST_F(Churn, ANewKeyWhoseForwardRaisedDoesNotCount) {
  CreateGuarded(2);
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  host_.fail_forward_number = 1; // the first forward (the probe) raises its own error
  host_.forward_error_is_own = 1;
  Result failed = Call(inputs.views, kDefault, "fail=1");
  ASSERT_EQ(failed.status, GF_ERR_FORWARD) << failed.message;
  Result next = Call(inputs.views, kDefault, "fail=0"); // the same tensors, another value
  ASSERT_EQ(next.status, GF_OK) << next.message;
  EXPECT_EQ(Stats().captures, 1u) << "the call that raised is no traffic: this one captures";
  EXPECT_EQ(Stats().churn_guarding, 0);
}

TEST_F(Churn, ADecodeLoopIsNeverGuarded) {
  CreateGuarded(2);
  CallRows(16); // the prompt, then one shape per token
  for (int token = 0; token < 8; ++token) {
    CallRows(1);
  }
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 2u);
  EXPECT_EQ(stats.churn_eager_calls, 0u);
  EXPECT_EQ(stats.churn_guarding, 0);
}

TEST_F(Churn, AHeldBackKeyComesBackToACallerThatRunsItEagerly) {
  host_.observe = 1;
  CreateGuarded(1);
  gf_call_options by_caller = kDefault;
  by_caller.eager_by_caller = 1;
  CallRows(1);
  // The call that starts the guard comes back too, after the host was told of the guard.
  Inputs second = MakeInputs(1, {2}, 2.0f);
  Result starting = Call(second.views, by_caller);
  EXPECT_EQ(starting.status, GF_RUN_EAGER) << starting.message;
  EXPECT_EQ(host_.events[GF_EVENT_CHURN], 1u) << "told before the caller runs it";
  Inputs third = MakeInputs(1, {3}, 3.0f);
  Result held = Call(third.views, by_caller);
  EXPECT_EQ(held.status, GF_RUN_EAGER) << held.message;
  EXPECT_TRUE(held.values.empty()) << "nothing ran: the caller runs the forward";
  EXPECT_EQ(host_.phase_calls[GF_PHASE_EAGER], 0u) << "the core ran neither call";
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.eager_calls, 2u) << "the held-back call counts as eager";
  EXPECT_EQ(stats.churn_eager_calls, 2u);
  EXPECT_EQ(stats.captures, 1u);
  CallExpectingCorrect(third, by_caller); // its second sight: captured
  EXPECT_EQ(Stats().captures, 2u);
}

TEST_F(Churn, HitsInARowEndTheGuard) {
  CreateGuarded(1);
  CallRows(1);
  CallRows(2); // the guard starts: eager
  ASSERT_EQ(Stats().churn_guarding, 1);
  for (int i = 0; i < GF_CHURN_QUIET; ++i) {
    CallRows(1);
  }
  EXPECT_EQ(Stats().churn_guarding, 0);
  CallRows(3);
  EXPECT_EQ(Stats().captures, 2u) << "a new key captures at first sight again";
}

TEST_F(Churn, GraphsDroppedForAChangeKeepTheGuard) {
  CreateGuarded(1);
  CallRows(1);
  CallRows(2); // the guard starts: eager
  ASSERT_EQ(Stats().churn_guarding, 1);
  gf_runner_drop_graphs(runner_);
  EXPECT_EQ(Stats().graphs, 0u);
  EXPECT_EQ(Stats().churn_guarding, 1) << "a change of what the graphs read is no new traffic";
}

TEST_F(Churn, AKeyCapturedAgainAfterADropIsNoValueStorm) {
  CreateGuarded(2);
  CallRows(1);
  gf_runner_drop_graphs(runner_);
  CallRows(1); // the same key, captured again: its tensors match the last new key's
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_EQ(Stats().churn_guarding, 0);
}

TEST_F(Churn, AResetEndsTheGuard) {
  CreateGuarded(1);
  CallRows(1);
  CallRows(2);
  ASSERT_EQ(Stats().churn_guarding, 1);
  gf_runner_reset(runner_);
  EXPECT_EQ(Stats().churn_guarding, 0);
  CallRows(3);
  EXPECT_EQ(Stats().captures, 2u);
}

TEST_F(Churn, ALimitOfZeroCapturesEveryNewKey) {
  host_.no_group = 1;
  config_.churn_limit = 0;
  Create();
  for (int64_t rows = 1; rows <= 5; ++rows) {
    CallRows(rows);
  }
  EXPECT_EQ(Stats().captures, 5u);
  EXPECT_EQ(Stats().churn_eager_calls, 0u);
}

TEST_F(Churn, ARunnerThatAgreesOverAGroupIsNeverGuarded) {
  config_.churn_limit = 1; // host_.no_group stays 0: the host agrees
  Create();
  for (int64_t rows = 1; rows <= 5; ++rows) {
    CallRows(rows);
  }
  EXPECT_EQ(Stats().captures, 5u);
  EXPECT_EQ(Stats().churn_guarding, 0);
}

} // namespace

namespace {

// The back-off of keys that ran out of device memory (ops/gf_backoff.h), on its own.
TEST(Backoff, AKeyIsHeldForItsBackOffThenMayTryAgain) {
  gf_backoff backoff{};
  EXPECT_EQ(gf_backoff_hold(&backoff, 42, 10, 0), static_cast<uint64_t>(GF_BACKOFF_FIRST));
  EXPECT_TRUE(gf_backoff_holds(&backoff, 42, 10 + GF_BACKOFF_FIRST - 1, 0));
  EXPECT_FALSE(gf_backoff_holds(&backoff, 42, 10 + GF_BACKOFF_FIRST, 0));
  EXPECT_FALSE(gf_backoff_holds(&backoff, 43, 11, 0)) << "another key is not held";
}

TEST(Backoff, EachFailureOfAKeyDoublesItsBackOffUpToTheLongest) {
  gf_backoff backoff{};
  uint64_t length = 0;
  for (int failure = 0; failure < 12; ++failure) {
    length = gf_backoff_hold(&backoff, 7, 0, 0);
  }
  EXPECT_EQ(length, static_cast<uint64_t>(GF_BACKOFF_MOST));
  EXPECT_EQ(gf_backoff_hold(&backoff, 8, 0, 0), static_cast<uint64_t>(GF_BACKOFF_FIRST));
}

TEST(Backoff, AnEvictionOrAClearLetsEveryKeyTryAgain) {
  gf_backoff backoff{};
  gf_backoff_hold(&backoff, 0, 0, 3); // a hash of 0 is held as well
  EXPECT_TRUE(gf_backoff_holds(&backoff, 0, 1, 3));
  EXPECT_FALSE(gf_backoff_holds(&backoff, 0, 1, 4)) << "an eviction since frees memory";
  gf_backoff_hold(&backoff, 5, 0, 4);
  gf_backoff_clear(&backoff);
  EXPECT_FALSE(gf_backoff_holds(&backoff, 5, 1, 4));
}

} // namespace
