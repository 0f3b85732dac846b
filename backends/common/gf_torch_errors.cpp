// Errors on the torch side (see gf_torch_errors.h).
#include "gf_torch_errors.h"

#include <c10/util/Exception.h>

#include <cstdarg>
#include <cstdio>
#include <exception>

namespace graphed {

namespace {

gf_status record(gf_error *err, gf_status code, const char *what_failed, const char *what) {
  if (what_failed != nullptr) {
    return gf_error_set(err, code, "%s: %s", what_failed, what);
  }
  return gf_error_set(err, code, "%s", what);
}

} // namespace

gf_status status_of_current_exception(gf_error *err, const char *what_failed) {
  try {
    throw;
  } catch (const c10::ValueError &e) {
    return record(err, GF_ERR_INVALID_ARGUMENT, what_failed, e.what_without_backtrace());
  } catch (const c10::TypeError &e) {
    return record(err, GF_ERR_TYPE, what_failed, e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError &e) {
    return record(err, GF_ERR_DEVICE_MEMORY, what_failed, e.what_without_backtrace());
  } catch (const c10::Error &e) {
    return record(err, GF_ERR_BACKEND, what_failed, e.what_without_backtrace());
  } catch (const std::exception &e) {
    return record(err, GF_ERR_BACKEND, what_failed, e.what());
  } catch (...) {
    return record(err, GF_ERR_BACKEND, what_failed, "unknown C++ exception");
  }
}

ErrorKind error_kind_of(gf_status status) {
  switch (status) {
  case GF_ERR_INVALID_ARGUMENT:
    return ErrorKind::value;
  case GF_ERR_TYPE:
    return ErrorKind::type;
  default:
    return ErrorKind::runtime;
  }
}

std::string format_message(const char *format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return std::string(buffer);
}

} // namespace graphed
