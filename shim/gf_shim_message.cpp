// Error-message formatting for the shim (see gf_shim_message.h).
#include "gf_shim_message.h"

#include <cstdarg>
#include <cstdio>

namespace graphed {

std::string format_message(const char *format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return std::string(buffer);
}

} // namespace graphed
