// Two buffers and an atomic index: the writer fills the idle buffer and then publishes it, so the
// handler always reads a complete line. The handler uses only async-signal-safe calls.
#include "runtime/activity.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace ra {
namespace {

constexpr size_t kLine = 256;
char g_lines[2][kLine] = {"starting", "starting"};
std::atomic<int> g_current{0};
char g_prefix[64] = "ringattn";
char g_partial[4096] = "";
std::atomic<bool> g_has_partial{false};

void append(char* out, size_t& used, size_t cap, const char* text) {
  while (*text && used + 1 < cap) out[used++] = *text++;
}

void append_int(char* out, size_t& used, size_t cap, int value) {
  char digits[16];
  int n = 0;
  unsigned v = value < 0 ? 0u - unsigned(value) : unsigned(value);
  do digits[n++] = char('0' + v % 10); while ((v /= 10) && n < 15);
  if (value < 0 && used + 1 < cap) out[used++] = '-';
  while (n > 0 && used + 1 < cap) out[used++] = digits[--n];
}

void report_and_die(int signal) {
  char line[kLine + 128];
  size_t used = 0;
  append(line, used, sizeof(line), g_prefix);
  append(line, used, sizeof(line), ": ended by signal ");
  append_int(line, used, sizeof(line), signal);
  append(line, used, sizeof(line), " while ");
  append(line, used, sizeof(line), g_lines[g_current.load()]);
  append(line, used, sizeof(line), "\n");
  (void)!write(STDERR_FILENO, line, used);
  remove_partial_output();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void set_activity(const char* format, ...) {
  const int next = 1 - g_current.load(std::memory_order_relaxed);
  va_list args;
  va_start(args, format);
  std::vsnprintf(g_lines[next], kLine, format, args);
  va_end(args);
  g_current.store(next, std::memory_order_release);
}

void set_partial_output(const char* path) {
  g_has_partial = false;
  std::snprintf(g_partial, sizeof(g_partial), "%s", path);
  g_has_partial = true;
}

void clear_partial_output() { g_has_partial = false; }

void remove_partial_output() {
  if (g_has_partial.exchange(false)) (void)unlink(g_partial);
}

void install_activity_report(int rank) {
  std::snprintf(g_prefix, sizeof(g_prefix), "[rank %d] ringattn", rank);
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(signal, report_and_die);
}

}  // namespace ra
