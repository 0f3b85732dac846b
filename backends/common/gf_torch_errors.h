// Errors on the torch side (the shim, each backend's torch half, the CPython entry point), in both
// directions: the status and message a C++ exception becomes before it could cross into C
// (nothing thrown ever crosses an extern "C" boundary), the kind of exception a failed status is
// raised as, and printf-style messages for
// TORCH_CHECK. It lives under backends/ because the lowest torch-side layer needs it; the shim
// and pyext reach down to it. The torch side never streams numbers into c10::str: some torch builds
// carry their own copy of parts of libstdc++, and an integer formatted through an ostream built
// against another copy crashed on one of them. Strings only ever reach the stream.
#pragma once

#include <string>

extern "C" {
#include "gf_status.h"
}

namespace graphed {

// Call only inside a catch block: records the exception being handled in err, prefixed with
// what_failed when it is not NULL. ValueError and TypeError keep their kind; the rest are backend
// failures.
gf_status status_of_current_exception(gf_error *err, const char *what_failed);

// The kind of exception a failed status is raised as, from C++ (the operators) and from the CPython
// entry point alike: ValueError for bad values, TypeError for wrong kinds, RuntimeError for the
// rest.
enum class ErrorKind { value, type, runtime };
ErrorKind error_kind_of(gf_status status);

std::string format_message(const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

} // namespace graphed
