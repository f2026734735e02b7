// Fault injection for tests (RINGATTN_FAULT).
#include "runtime/fault_injection.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "runtime/error.h"

namespace ra {

FaultPlan FaultPlan::parse(const std::string& text) {
  FaultPlan plan;
  std::istringstream in(text);
  std::string field;
  bool first = true;
  while (std::getline(in, field, ':')) {
    if (first) {
      first = false;
      if (field == "kill") plan.kind = Kind::kKill;
      else if (field == "term") plan.kind = Kind::kTerm;
      else if (field == "abort") plan.kind = Kind::kAbort;
      else if (field == "exit") plan.kind = Kind::kExit;
      else if (field == "stall") plan.kind = Kind::kStall;
      else if (field == "corrupt") plan.kind = Kind::kCorrupt;
      else if (field == "short") plan.kind = Kind::kShort;
      else RA_FAIL("RINGATTN_FAULT='", text, "': unknown kind '", field, "' (kill|term|abort|exit|stall|corrupt|short)");
      continue;
    }
    const size_t eq = field.find('=');
    RA_CHECK(eq != std::string::npos, "RINGATTN_FAULT='", text, "': expected name=value, got '", field, "'");
    const std::string name = field.substr(0, eq);
    if (name == "pass") {
      const std::string pass = field.substr(eq + 1);
      RA_CHECK(pass == "forward" || pass == "backward", "RINGATTN_FAULT='", text, "': pass is '", pass,
               "', expected forward or backward");
      plan.pass = pass == "forward" ? Pass::kForward : Pass::kBackward;
      continue;
    }
    long value = 0;
    try {
      value = std::stol(field.substr(eq + 1));
    } catch (const std::exception&) {
      RA_FAIL("RINGATTN_FAULT='", text, "': '", field, "' is not an integer");
    }
    if (name == "rank") plan.rank = int(value);
    else if (name == "step") plan.step = int(value);
    else if (name == "ms") plan.ms = value;
    else RA_FAIL("RINGATTN_FAULT='", text, "': unknown field '", name, "' (rank, step, ms, pass)");
  }
  RA_CHECK(plan.kind != Kind::kNone && plan.rank >= 0 && plan.step >= 0, "RINGATTN_FAULT='", text,
           "': expected <kind>:rank=<r>:step=<s>[:ms=<m>][:pass=forward|backward]");
  return plan;
}

FaultPlan FaultPlan::from_environment() {
  const char* text = std::getenv("RINGATTN_FAULT");
  return text && *text ? parse(text) : FaultPlan{};
}

void inject_process_fault(const FaultPlan& plan, int rank, int step) {
  if (!plan.armed(rank, step) || plan.kind == FaultPlan::Kind::kCorrupt || plan.kind == FaultPlan::Kind::kShort) return;
  std::fprintf(stderr, "[rank %d] RINGATTN_FAULT: injecting a fault at ring step %d\n", rank, step);
  std::fflush(stderr);
  switch (plan.kind) {
    case FaultPlan::Kind::kKill: std::raise(SIGKILL); break;
    case FaultPlan::Kind::kTerm: std::raise(SIGTERM); break;
    case FaultPlan::Kind::kAbort: std::abort();
    case FaultPlan::Kind::kExit: std::_Exit(9);
    case FaultPlan::Kind::kStall: std::this_thread::sleep_for(std::chrono::milliseconds(plan.ms)); break;
    default: break;
  }
}

size_t injected_send_bytes(const FaultPlan& plan, int rank, int step, size_t bytes) {
  if (!plan.armed(rank, step) || plan.kind != FaultPlan::Kind::kShort) return bytes;
  std::fprintf(stderr, "[rank %d] RINGATTN_FAULT: sending %zu of %zu bytes at ring step %d\n", rank, bytes / 2, bytes, step);
  return bytes / 2;
}

std::optional<size_t> corrupted_byte(const FaultPlan& plan, int rank, int step, size_t bytes) {
  if (!plan.armed(rank, step) || plan.kind != FaultPlan::Kind::kCorrupt || bytes == 0) return std::nullopt;
  return std::min(bytes - 1, bytes / 2 + 3);
}

void inject_corruption(const FaultPlan& plan, int rank, int step, void* block, size_t bytes) {
  if (const std::optional<size_t> at = corrupted_byte(plan, rank, step, bytes))
    static_cast<unsigned char*>(block)[*at] ^= kCorruptionMask;
}

}  // namespace ra
