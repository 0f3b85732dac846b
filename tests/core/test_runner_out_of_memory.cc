// Tests of a capture that runs out of device memory (Note [Out of device memory while capturing],
// ops/gf_capture.c), at each point where a capture takes memory: the static copies, the sync
// probe, a warm-up, the capture's begin, its forward and its end. Each time the attempt's buffers
// are released and the backend gives back what its graph pool caches before the eager run that
// answers the call, so a forward that fits eagerly returns eager's values; the key is then held
// back (its next calls run eager without another attempt), the runner stays enabled and another
// key still captures.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace {

using namespace runner_test;

enum class Point { kStaticCopies, kProbe, kWarmUp, kCaptureBegin, kCapturedForward, kCaptureEnd };

std::string NameOf(const ::testing::TestParamInfo<Point> &info) {
  static const char *const names[] = {"StaticCopies", "Probe",           "WarmUp",
                                      "CaptureBegin", "CapturedForward", "CaptureEnd"};
  return names[static_cast<int>(info.param)];
}

class OutOfMemory : public Runner, public ::testing::WithParamInterface<Point> {
protected:
  void SetUp() override {
    Runner::SetUp();
    host_.no_group = 1;
    host_.forward_out_of_memory = 1;
    backend_.fail_code = GF_ERR_DEVICE_MEMORY;
  }

  // Makes the next capture run out of memory at `point`.
  void RunOutAt(Point point) {
    switch (point) {
    case Point::kStaticCopies:
      host_.clone_out_of_memory = 1;
      break;
    case Point::kProbe: // the first forward of the runner's first capture
      host_.fail_forward_number = host_.forward_calls + 1;
      break;
    case Point::kWarmUp: // the second, after the probe
      host_.fail_forward_number = host_.forward_calls + 2;
      break;
    case Point::kCaptureBegin:
      gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_BEGIN, 0, "out of memory");
      break;
    case Point::kCapturedForward:
      host_.fail_forward_while_capturing = 1;
      break;
    case Point::kCaptureEnd:
      gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_END, 0, "out of memory");
      break;
    }
  }

  void MemoryAgain() {
    host_.clone_out_of_memory = 0;
    host_.fail_forward_number = 0;
    host_.fail_forward_while_capturing = 0;
    backend_.fail_hook = GF_FAKE_HOOK_NONE;
  }
};

TEST_P(OutOfMemory, TheCallGetsEagersValuesAfterTheAttemptGaveItsMemoryBack) {
  Create();
  Inputs inputs = MakeInputs(1, {4}, 3.0f);
  RunOutAt(GetParam());
  ClearLog();
  CallExpectingCorrect(inputs);
  const Events log = Log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "forward") << "the eager run answers the call";
  const auto gave_back = std::find(log.begin(), log.end(), "give_back_memory");
  ASSERT_NE(gave_back, log.end()) << "the pool's cached memory was not given back";
  EXPECT_EQ(std::count(log.begin(), log.end(), "give_back_memory"), 1);
  EXPECT_EQ(gave_back + 2, log.end()) << "given back right before the eager run";
  EXPECT_EQ(backend_.live_graphs, 0);
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1) << Reason();
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0) << "the attempt's static buffers were released";
}

TEST_P(OutOfMemory, TheKeyIsHeldBackAndAnotherKeyStillCaptures) {
  Create();
  Inputs inputs = MakeInputs(1, {4}, 3.0f);
  RunOutAt(GetParam());
  CallExpectingCorrect(inputs);
  MemoryAgain();
  const uint64_t clones = host_.clone_calls;
  for (int call = 0; call < 2; ++call) {
    ClearLog();
    CallExpectingCorrect(inputs); // three calls in a row with eager's values
    ExpectEagerOnly(Log());
  }
  EXPECT_EQ(host_.clone_calls, clones) << "a held-back key makes no attempt";
  Inputs smaller = MakeInputs(1, {2}, 5.0f);
  CallExpectingCorrect(smaller);
  CallExpectingCorrect(smaller);
  const gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.eager_calls, 3u);
  EXPECT_EQ(stats.enabled, 1) << Reason();
}

INSTANTIATE_TEST_SUITE_P(EachPoint, OutOfMemory,
                         ::testing::Values(Point::kStaticCopies, Point::kProbe, Point::kWarmUp,
                                           Point::kCaptureBegin, Point::kCapturedForward,
                                           Point::kCaptureEnd),
                         NameOf);

TEST_F(Runner, AFailedCaptureThatDidNotRunOutOfMemoryGivesNothingBack) {
  host_.no_group = 1;
  Create();
  Inputs inputs = MakeInputs(1, {4}, 3.0f);
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_END, 0, "invalidated");
  CallExpectingCorrect(inputs);
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_GIVE_BACK_MEMORY], 0u);
  EXPECT_EQ(Stats().enabled, 0) << "a capture failure disables the runner";
}

} // namespace
