// What this process is doing right now, in one line, kept where a signal handler can read it. When a
// rank dies, the launcher ends the others with SIGTERM; with the report installed each of them says
// which step and peer it was on before it goes, so the log shows who waited on whom.
#pragma once

namespace ra {

// printf-style; call from one thread (the one that drives the work). Cheap: a format into a buffer.
void set_activity(const char* format, ...) __attribute__((format(printf, 1, 2)));

// On SIGTERM, SIGINT or SIGHUP (the launcher ending the job) and on a crash (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGABRT, e.g. inside a library reading a corrupt file): write "[rank R] ringattn: ended by
// signal N while <activity>" to stderr, then die by the same signal (the exit status still says which).
// Also removes the partial output registered below, so that no half-written file is left.
void install_activity_report(int rank);

// The file being written under a temporary name: removed by remove_partial_output() (called on every
// way out after a failure: errors, the watchdog, the signals above); clear it once renamed.
void set_partial_output(const char* path);
void clear_partial_output();
void remove_partial_output();  // async-signal-safe

}  // namespace ra
