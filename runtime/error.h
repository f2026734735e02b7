// Host-side errors: an exception that carries file:line and a message naming the tensor, the
// dimension and what was expected. Device code never throws; launchers check and raise these.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ra {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& message);
  const std::string& message() const { return message_; }  // without the file:line prefix

 private:
  std::string message_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace ra

// RA_CHECK(cond, parts...): throws ra::Error with the parts streamed together when cond is false.
// The condition is a boolean expression; a string literal there would always pass, hence the static_assert.
#define RA_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    static_assert(!std::is_convertible_v<decltype(cond), const char*>, "RA_CHECK needs a condition"); \
    if (!(cond)) throw ::ra::Error(__FILE__, __LINE__, ::ra::detail::concat(__VA_ARGS__));   \
  } while (0)

#define RA_FAIL(...) throw ::ra::Error(__FILE__, __LINE__, ::ra::detail::concat(__VA_ARGS__))
