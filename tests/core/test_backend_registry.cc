// Tests for the core's backend registry: the layer above registers backends by name, priority and
// probe; the registry chooses by descending priority, finds by name, never probes a by-name-only
// backend when choosing, and falls back to "none" with every refusal in its reason.
#include "gf_backend_registry.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace {

gf_backend accepting_table = [] {
  gf_backend table = *gf_backend_none();
  table.name = "accepting";
  return table;
}();
gf_backend low_table = [] {
  gf_backend table = *gf_backend_none();
  table.name = "low";
  return table;
}();
int by_name_probes = 0;

const gf_backend *refusing_probe(char *why, size_t capacity) {
  std::snprintf(why, capacity, "its driver is not installed");
  return nullptr;
}
const gf_backend *accepting_probe(char *, size_t) { return &accepting_table; }
const gf_backend *low_probe(char *, size_t) { return &low_table; }
const gf_backend *by_name_probe(char *, size_t) {
  ++by_name_probes;
  return &low_table;
}

std::string Find(const char *name, const gf_backend **found) {
  char why[256] = "";
  *found = gf_backend_find(name, why, sizeof why);
  return why;
}

// The registry is process-wide; the tests below build on one another in this order, so they are
// one test with sections.
TEST(BackendRegistry, RegistersChoosesAndFinds) {
  gf_error err{};
  // With nothing registered the choice is none, and none says so.
  gf_backend_choose();
  EXPECT_STREQ(gf_backend_current()->name, "none");
  EXPECT_STREQ(gf_backend_choice_reason(),
               "no graph-capable device: graphed was built with no device backend");

  // A refusing probe: none, with the refusal named.
  ASSERT_EQ(gf_backend_register("refusing", 100, refusing_probe, &err), GF_OK) << err.message;
  ASSERT_EQ(gf_backend_register("test_only", GF_BACKEND_BY_NAME_ONLY, by_name_probe, &err), GF_OK);
  gf_backend_choose();
  EXPECT_STREQ(gf_backend_current()->name, "none");
  EXPECT_STREQ(gf_backend_choice_reason(),
               "no graph-capable device: refusing: its driver is not installed");
  EXPECT_EQ(by_name_probes, 0) << "a by-name-only backend is never probed by the choice";
  char why[512] = "";
  EXPECT_EQ(gf_backend_none()->graphs_supported(gf_backend_none()->context, 1, 0, why, sizeof why),
            0);
  EXPECT_STREQ(why, gf_backend_choice_reason()) << "none carries the choice's reason";

  // Priorities: the highest accepting probe wins, whatever the registration order.
  ASSERT_EQ(gf_backend_register("low", 10, low_probe, &err), GF_OK);
  ASSERT_EQ(gf_backend_register("accepting", 50, accepting_probe, &err), GF_OK);
  gf_backend_choose();
  EXPECT_EQ(gf_backend_current(), &accepting_table);
  EXPECT_STREQ(gf_backend_choice_reason(), "backend accepting chosen at load");

  // Registering a name again replaces it.
  ASSERT_EQ(gf_backend_register("accepting", 5, accepting_probe, &err), GF_OK);
  gf_backend_choose();
  EXPECT_EQ(gf_backend_current(), &low_table);

  char names[256];
  gf_backend_list(names, sizeof names);
  EXPECT_STREQ(names, "refusing, low, accepting, test_only, none");

  // Lookup by name probes that backend alone.
  const gf_backend *found = nullptr;
  EXPECT_EQ(Find("test_only", &found), "");
  EXPECT_EQ(found, &low_table);
  EXPECT_EQ(by_name_probes, 1);
  EXPECT_EQ(Find("refusing", &found), "its driver is not installed");
  EXPECT_EQ(found, nullptr);
  EXPECT_EQ(Find("none", &found), "");
  EXPECT_EQ(found, gf_backend_none());
  std::string missing = Find("vulkan", &found);
  EXPECT_EQ(found, nullptr);
  EXPECT_EQ(missing, "no backend named 'vulkan' is registered (registered: refusing, low, "
                     "accepting, test_only, none)");

  // A truncated list stays a terminated string.
  char small[8];
  gf_backend_list(small, sizeof small);
  EXPECT_EQ(std::strlen(small), sizeof small - 1);
}

TEST(BackendRegistry, RefusesBadRegistrations) {
  gf_error err{};
  EXPECT_EQ(gf_backend_register("none", 1, accepting_probe, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gf_backend_register("", 1, accepting_probe, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gf_backend_register(nullptr, 1, accepting_probe, &err), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gf_backend_register("x", 1, nullptr, &err), GF_ERR_INVALID_ARGUMENT);
  std::string long_name(64, 'n');
  EXPECT_EQ(gf_backend_register(long_name.c_str(), 1, accepting_probe, &err),
            GF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(err.message, "name of 1 to 31 characters"), nullptr) << err.message;
}

} // namespace
