// printf-style formatting of error messages for TORCH_CHECK. The shim never streams numbers into
// c10::str: some torch builds carry their own copy of parts of libstdc++, and an integer
// formatted through an ostream built against another copy crashed on one of them. Strings only
// ever reach the stream.
#pragma once

#include <string>

namespace graphed {

std::string format_message(const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

} // namespace graphed
