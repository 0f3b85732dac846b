/* The one place that formats error values (see gf_status.h). */
#include "gf_status.h"

#include <stdarg.h>
#include <stdio.h>

gf_status gf_error_set(gf_error *err, gf_status code, const char *format, ...) {
  if (err != NULL) {
    va_list args;
    va_start(args, format);
    err->code = code;
    err->input_number = 0;
    vsnprintf(err->message, sizeof err->message, format, args);
    va_end(args);
  }
  return code;
}

void gf_error_clear(gf_error *err) {
  if (err != NULL) {
    err->code = GF_OK;
    err->message[0] = '\0';
    err->input_number = 0;
  }
}

const char *gf_status_name(gf_status code) {
  switch (code) {
  case GF_OK:
    return "ok";
  case GF_ERR_INVALID_ARGUMENT:
    return "invalid argument";
  case GF_ERR_TYPE:
    return "wrong type";
  case GF_ERR_NO_MEMORY:
    return "out of host memory";
  case GF_ERR_BACKEND:
    return "backend failure";
  case GF_ERR_CAPTURE:
    return "capture failed";
  case GF_ERR_DISABLED:
    return "disabled";
  case GF_ERR_NOT_FOUND:
    return "not found";
  case GF_ERR_FORWARD:
    return "the forward raised";
  case GF_ERR_DEVICE_MEMORY:
    return "out of device memory";
  case GF_RUN_EAGER:
    return "run eager by the caller";
  }
  return "unknown status";
}
